//! `start`, `stop`, `kill`, `install`, `uninstall`: serve's life, by its
//! recorded identity (pid, start time, boot: a reused pid is never
//! signalled) or through its systemd unit.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use belay_rounds::report::live_serve;
use belay_rounds::units::{self, UnitOptions};
use belay_rounds::{Config, RoundsError};

use super::fail;
use crate::cli::{InstallArgs, StartArgs};
use crate::exit::Failure;
use crate::output::Printer;

fn systemd_running() -> bool {
    std::path::Path::new("/run/systemd/system").is_dir()
}

/// A `systemctl` call that could not run, or failed.
#[derive(Debug)]
enum SystemctlError {
    Spawn(std::io::Error),
    Failed { args: String, stderr: String },
}

impl std::fmt::Display for SystemctlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SystemctlError::Spawn(e) => write!(f, "systemctl: {e}"),
            SystemctlError::Failed { args, stderr } => write!(f, "systemctl {args}: {stderr}"),
        }
    }
}

impl std::error::Error for SystemctlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SystemctlError::Spawn(e) => Some(e),
            SystemctlError::Failed { .. } => None,
        }
    }
}

/// The machine's service manager failed: the rounds' `Environment` error.
fn systemd_failed(e: SystemctlError) -> Failure {
    fail(RoundsError::Environment(e.to_string()))
}

async fn systemctl(system: bool, args: &[&str]) -> Result<(), SystemctlError> {
    let mut cmd = tokio::process::Command::new("systemctl");
    if !system {
        cmd.arg("--user");
    }
    let out = cmd
        .args(args)
        .output()
        .await
        .map_err(SystemctlError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(SystemctlError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn installed(cfg: &Config) -> Option<units::Installed> {
    belay_rounds::state::read(&cfg.runtime.log_dir, units::INSTALLED_FILE)
        .ok()
        .flatten()
}

pub async fn start(p: &Printer, cfg: &Config, a: &StartArgs) -> Result<u8, Failure> {
    if let Some(s) = live_serve(&cfg.runtime.log_dir) {
        p.out(format!("serve is already running (pid {})", s.pid));
        return Ok(0);
    }
    if let (Some(rec), false, true) = (installed(cfg), a.detached, systemd_running()) {
        let unit = units::serve_unit_name(&cfg.project);
        systemctl(rec.system, &["start", &unit])
            .await
            .map_err(systemd_failed)?;
        p.out(format!("started {unit}"));
        return Ok(0);
    }
    let exe = std::env::current_exe()
        .map_err(|e| fail(RoundsError::Environment(format!("cannot find belay: {e}"))))?;
    let log = cfg.runtime.log_dir.join("serve.log");
    fs_err::create_dir_all(&cfg.runtime.log_dir)
        .map_err(|e| fail(RoundsError::Environment(e.to_string())))?;
    let out = fs_err::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| fail(RoundsError::Environment(e.to_string())))?;
    let err = out
        .try_clone()
        .map_err(|e| fail(RoundsError::Environment(e.to_string())))?;
    let child = std::process::Command::new(exe)
        .args(["rounds", "--config"])
        .arg(&cfg.path)
        .arg("serve")
        .current_dir(&cfg.runtime.work_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(out.into_parts().0))
        .stderr(std::process::Stdio::from(err.into_parts().0))
        .process_group(0)
        .spawn()
        .map_err(|e| fail(RoundsError::Environment(format!("cannot start serve: {e}"))))?;
    // Serve records itself; wait for it to say it runs.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if let Some(s) = live_serve(&cfg.runtime.log_dir) {
            p.out(format!(
                "serve started (pid {}); its output goes to {}",
                s.pid,
                log.display()
            ));
            return Ok(0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(fail(RoundsError::Environment(format!(
        "serve (pid {}) did not come up within 10 s: read {}",
        child.id(),
        log.display()
    ))))
}

fn signal(pid: u32, sig: rustix::process::Signal) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| rustix::process::kill_process(p, sig).is_ok())
}

async fn wait_gone(id: &belay_record::ProcessIdentity, limit: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if !id.is_alive() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    !id.is_alive()
}

pub async fn stop(p: &Printer, cfg: &Config, wait: bool) -> Result<u8, Failure> {
    let Some(s) = live_serve(&cfg.runtime.log_dir) else {
        p.out("serve is not running");
        return Ok(0);
    };
    signal(s.pid, rustix::process::Signal::TERM);
    if !wait {
        p.out(format!(
            "asked serve (pid {}) to stop after its round",
            s.pid
        ));
        return Ok(0);
    }
    let limit = Duration::from_secs(units::stop_timeout_s(cfg));
    p.note(&format!(
        "asked serve (pid {}) to stop after its round; waiting up to {} s",
        s.pid,
        limit.as_secs()
    ));
    if wait_gone(&s, limit).await {
        p.out(format!("serve (pid {}) stopped", s.pid));
        Ok(0)
    } else {
        Err(fail(RoundsError::Environment(format!(
            "serve (pid {}) is still running after {} s: `belay rounds kill` stops it now",
            s.pid,
            limit.as_secs()
        ))))
    }
}

pub async fn kill(p: &Printer, cfg: &Config) -> Result<u8, Failure> {
    let Some(s) = live_serve(&cfg.runtime.log_dir) else {
        p.out("serve is not running");
        return Ok(0);
    };
    // The second SIGTERM is serve's "now": the round is killed and recorded.
    signal(s.pid, rustix::process::Signal::TERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(s.pid, rustix::process::Signal::TERM);
    if wait_gone(&s, Duration::from_secs(30)).await {
        p.out(format!("serve (pid {}) stopped now", s.pid));
        return Ok(0);
    }
    signal(s.pid, rustix::process::Signal::KILL);
    p.warn(&format!("serve (pid {}) did not stop within 30 s: killed (its round is recorded as interrupted at the next start)", s.pid));
    Ok(0)
}

pub async fn install(p: &Printer, cfg: &Config, a: &InstallArgs) -> Result<u8, Failure> {
    let belay = std::env::current_exe()
        .map_err(|e| fail(RoundsError::Environment(format!("cannot find belay: {e}"))))?;
    let rec = units::install(
        cfg,
        &UnitOptions {
            system: a.system,
            monitor: a.monitor,
            belay,
            memory_max: a.memory_max.clone(),
            tasks_max: a.tasks_max,
            unit_dir: a.unit_dir.clone(),
        },
    )
    .map_err(fail)?;
    let mut enabled = false;
    if !a.no_enable && a.unit_dir.is_none() && systemd_running() {
        systemctl(a.system, &["daemon-reload"])
            .await
            .map_err(systemd_failed)?;
        let mut args = vec!["enable", "--now"];
        args.extend(rec.units.iter().map(String::as_str));
        systemctl(a.system, &args).await.map_err(systemd_failed)?;
        enabled = true;
    }
    if a.json {
        p.json(&serde_json::json!({"installed": rec, "enabled": enabled}));
    } else {
        for f in &rec.files {
            p.out(format!("wrote {}", f.display()));
        }
        if enabled {
            p.out(format!("enabled and started {}", rec.units.join(", ")));
        } else {
            p.note("not enabled (no running systemd, or --no-enable/--unit-dir): `systemctl --user enable --now` them where systemd runs");
        }
    }
    Ok(0)
}

pub async fn uninstall(p: &Printer, cfg: &Config, json: bool) -> Result<u8, Failure> {
    if let Some(rec) = installed(cfg) {
        if systemd_running() {
            let mut args = vec!["disable", "--now"];
            args.extend(rec.units.iter().map(String::as_str));
            if let Err(e) = systemctl(rec.system, &args).await {
                p.warn(&e.to_string());
            }
        }
    }
    let rec = units::uninstall(cfg).map_err(fail)?;
    if systemd_running() {
        let _ = systemctl(rec.system, &["daemon-reload"]).await;
    }
    if json {
        p.json(&rec);
    } else {
        for f in &rec.files {
            p.out(format!("removed {}", f.display()));
        }
    }
    Ok(0)
}
