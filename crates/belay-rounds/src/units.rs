//! systemd units: `belay-rounds@<project>.service` (serve) and, with
//! `--monitor`, `belay-rounds-monitor@<project>.service`. They keep the
//! peer's contract (SIGTERM, a stop timeout of the budget plus the grace,
//! restart on failure except for config errors and tripped breakers, a
//! start limit) and add the hardening the peer lacks. `install` records what
//! it wrote; `uninstall` removes exactly that.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::RoundsError;

/// The record of what `install` wrote, in the log dir.
pub const INSTALLED_FILE: &str = "units-installed.json";

#[derive(Debug, Clone)]
pub struct UnitOptions {
    /// System units (`/etc/systemd/system`, `User=`), else user units.
    pub system: bool,
    pub monitor: bool,
    /// The belay binary the units run.
    pub belay: PathBuf,
    pub memory_max: String,
    pub tasks_max: u32,
    /// Where the units go (default: the user's or the system's unit dir).
    pub unit_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Installed {
    pub system: bool,
    pub files: Vec<PathBuf>,
    pub units: Vec<String>,
}

pub fn serve_unit_name(project: &str) -> String {
    format!("belay-rounds@{project}.service")
}

pub fn monitor_unit_name(project: &str) -> String {
    format!("belay-rounds-monitor@{project}.service")
}

/// The unit directory: `$XDG_CONFIG_HOME/systemd/user` (or
/// `~/.config/systemd/user`), or `/etc/systemd/system`.
pub fn default_unit_dir(system: bool) -> PathBuf {
    if system {
        return PathBuf::from("/etc/systemd/system");
    }
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/etc/xdg"))
        .join("systemd/user")
}

/// A value for a unit file: paths with spaces are quoted, `%` doubled (a
/// specifier otherwise).
fn q(p: &Path) -> String {
    let s = p.display().to_string().replace('%', "%%");
    if s.contains(char::is_whitespace) || s.contains('"') {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        s
    }
}

fn user_lines(system: bool) -> String {
    if !system {
        return String::new();
    }
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    format!("User={uid}\nGroup={gid}\n")
}

/// The seconds systemd waits after SIGTERM: the round's budget (serve
/// finishes the round), the grace after a result, and time for the stash.
pub fn stop_timeout_s(cfg: &Config) -> u64 {
    let budget = cfg
        .phases
        .iter()
        .filter_map(|p| p.round_budget_s)
        .fold(cfg.runtime.round_budget_s, f64::max);
    let grace = cfg
        .runtime
        .grace_after_result_s
        .max(cfg.agent.sigterm_grace_s);
    (budget + grace + 60.0).ceil() as u64
}

/// `PrivateTmp=yes`, unless a path the unit needs is under /tmp (a private
/// /tmp would hide it).
fn private_tmp(cfg: &Config) -> &'static str {
    let under_tmp = [&cfg.runtime.work_dir, &cfg.runtime.log_dir, &cfg.path]
        .iter()
        .any(|p| p.starts_with("/tmp") || p.starts_with("/var/tmp"));
    if under_tmp {
        "# PrivateTmp is off: the work dir, log dir or config is under /tmp.\n"
    } else {
        "PrivateTmp=yes\n"
    }
}

fn writable_paths(cfg: &Config) -> String {
    let mut paths = vec![
        cfg.runtime.work_dir.clone(),
        cfg.runtime.log_dir.clone(),
        belay_record::state_home(),
    ];
    for a in std::iter::once(&cfg.agent).chain(cfg.phases.iter().filter_map(|p| p.agent.as_ref())) {
        paths.extend(a.login_dirs.iter().cloned());
    }
    paths.dedup();
    paths.iter().map(|p| q(p)).collect::<Vec<_>>().join(" ")
}

/// The hardening the peer's units lack (each line ends in a newline).
fn hardening(cfg: &Config, memory_max: &str, tasks_max: u32, rw: &str) -> String {
    format!(
        "NoNewPrivileges=yes\nMemoryMax={memory_max}\nTasksMax={tasks_max}\nProtectSystem=strict\nProtectHome=read-only\n{}ReadWritePaths={rw}\n",
        private_tmp(cfg)
    )
}

pub fn render_serve(cfg: &Config, o: &UnitOptions) -> String {
    format!(
        "# Written by `belay rounds install`; `belay rounds uninstall` removes it.\n\
[Unit]\n\
Description=belay rounds supervisor ({project})\n\
After=network-online.target docker.service\n\
Wants=network-online.target\n\
StartLimitIntervalSec=300\n\
StartLimitBurst=5\n\
\n\
[Service]\n\
Type=simple\n\
{user}WorkingDirectory={work}\n\
ExecStart={belay} rounds serve --config {config}\n\
Restart=on-failure\n\
# 78: the config is broken; 75: a breaker tripped. Restarting fixes neither.\n\
RestartPreventExitStatus=78 75\n\
RestartSec={delay}\n\
KillMode=mixed\n\
KillSignal=SIGTERM\n\
TimeoutStopSec={stop}\n\
{hardening}\
\n\
[Install]\n\
WantedBy={wanted}\n",
        project = cfg.project,
        user = user_lines(o.system),
        work = q(&cfg.runtime.work_dir),
        belay = q(&o.belay),
        config = q(&cfg.path),
        delay = cfg.runtime.restart_delay_s.ceil().max(1.0) as u64,
        stop = stop_timeout_s(cfg),
        hardening = hardening(cfg, &o.memory_max, o.tasks_max, &writable_paths(cfg)),
        wanted = if o.system {
            "multi-user.target"
        } else {
            "default.target"
        },
    )
}

pub fn render_monitor(cfg: &Config, o: &UnitOptions) -> String {
    format!(
        "# Written by `belay rounds install --monitor`; `belay rounds uninstall` removes it.\n\
[Unit]\n\
Description=belay rounds monitor ({project})\n\
After={serve}\n\
\n\
[Service]\n\
Type=simple\n\
{user}WorkingDirectory={work}\n\
ExecStart={belay} rounds monitor --config {config} --mode events\n\
Restart=always\n\
RestartSec=10\n\
{hardening}\
\n\
[Install]\n\
WantedBy={wanted}\n",
        project = cfg.project,
        serve = serve_unit_name(&cfg.project),
        user = user_lines(o.system),
        work = q(&cfg.runtime.work_dir),
        belay = q(&o.belay),
        config = q(&cfg.path),
        hardening = hardening(cfg, "64M", 16, &q(&cfg.runtime.log_dir)),
        wanted = if o.system {
            "multi-user.target"
        } else {
            "default.target"
        },
    )
}

/// Write the units (never over a unit belay did not write) and the record.
pub fn install(cfg: &Config, o: &UnitOptions) -> Result<Installed, RoundsError> {
    let dir = o
        .unit_dir
        .clone()
        .unwrap_or_else(|| default_unit_dir(o.system));
    fs_err::create_dir_all(&dir).map_err(|e| RoundsError::io("cannot create", &dir, e))?;
    let mut units = vec![(serve_unit_name(&cfg.project), render_serve(cfg, o))];
    if o.monitor {
        units.push((monitor_unit_name(&cfg.project), render_monitor(cfg, o)));
    }
    let mut files = Vec::new();
    for (name, text) in &units {
        let path = dir.join(name);
        // host-owned: systemd's unit dir.
        if let Ok(old) = fs_err::read_to_string(&path) {
            if !old.starts_with("# Written by `belay rounds install") {
                return Err(RoundsError::Config(format!(
                    "{} exists and belay did not write it: move it away first",
                    path.display()
                )));
            }
        }
        belay_record::atomic_write(&path, text.as_bytes())?;
        files.push(path);
    }
    let rec = Installed {
        system: o.system,
        files,
        units: units.into_iter().map(|(n, _)| n).collect(),
    };
    fs_err::create_dir_all(&cfg.runtime.log_dir)
        .map_err(|e| RoundsError::io("cannot create", &cfg.runtime.log_dir, e))?;
    crate::state::write(
        &cfg.runtime.log_dir,
        INSTALLED_FILE,
        &rec,
        &belay_record::Redactor::new(Vec::<(String, String)>::new()),
    )?;
    Ok(rec)
}

/// Remove what `install` wrote (by its record); the files removed.
pub fn uninstall(cfg: &Config) -> Result<Installed, RoundsError> {
    let rec: Installed =
        crate::state::read(&cfg.runtime.log_dir, INSTALLED_FILE)?.ok_or_else(|| {
            RoundsError::Config(format!(
                "no units are recorded as installed for this config ({} is missing)",
                cfg.runtime.log_dir.join(INSTALLED_FILE).display()
            ))
        })?;
    for f in &rec.files {
        // host-owned: the unit files belay installed (systemd's dirs).
        match fs_err::read_to_string(f) {
            Ok(t) if t.starts_with("# Written by `belay rounds install") => {
                fs_err::remove_file(f).map_err(|e| RoundsError::io("cannot remove", f, e))?;
            }
            Ok(_) => {
                return Err(RoundsError::Config(format!(
                    "{} was changed by someone else: remove it by hand",
                    f.display()
                )))
            }
            Err(_) => {}
        }
    }
    let _ = fs_err::remove_file(cfg.runtime.log_dir.join(INSTALLED_FILE));
    Ok(rec)
}
