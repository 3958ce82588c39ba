//! How git is started: the hardened command line, an explicit environment,
//! its own process group, and a deadline after which the whole group is
//! killed. Async callers use [`output`]; the commit's streaming readers run on
//! the blocking pool and use [`Watchdog`] for the same deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::VcsError;

/// The fixed part of the hardening, before the per-repository driver overrides.
const HARDENING: &[&str] = &[
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "protocol.ext.allow=never",
    "submodule.recurse=false",
    "status.submoduleSummary=false",
    "diff.ignoreSubmodules=all",
    "core.alternateRefsCommand=",
    "core.pager=cat",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    // Programs a repository's config could name for fetch, push, log or a
    // credential prompt: none.
    "credential.helper=",
    "core.gitProxy=",
    "core.sshCommand=ssh -o BatchMode=yes",
    "log.showSignature=false",
    "gpg.program=false",
    "gpg.ssh.program=false",
    "gpg.x509.program=false",
    "uploadpack.packObjectsHook=",
];

/// The host variables every git call keeps; everything else is dropped.
const KEPT_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ"];

/// A git command: explicit environment, no prompts, no system config, hooks
/// on an empty directory, the fixed hardening, and its own process group.
/// `extra_env`: variables the caller chose to pass (a remote operation's
/// proxy settings), on top of the kept ones.
pub(crate) fn base_command(hooks: &Path, extra_env: &[(String, String)]) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut c = Command::new("git");
    c.env_clear();
    for k in KEPT_ENV {
        if let Ok(v) = std::env::var(k) {
            c.env(k, v);
        }
    }
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_PAGER", "cat")
        .env("GIT_EDITOR", "true")
        .env("GIT_ASKPASS", "true")
        // ssh must fail, not ask (host keys, passwords).
        .env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .stdin(Stdio::null())
        .process_group(0)
        .arg("-c")
        .arg(format!("core.hooksPath={}", hooks.display()));
    for h in HARDENING {
        c.arg("-c").arg(h);
    }
    c
}

/// The `-c` overrides that neutralise every driver and per-remote program the
/// config names (`git config --list` never runs a program): filter drivers
/// emptied, merge drivers that fail (a conflict, never a program), diff
/// drivers without a command or textconv. (A remote's `uploadpack` and
/// `receivepack` are multi-valued, first one wins: fetch and push override
/// them on their command line instead.)
///
/// They are (key, value) pairs, passed through `GIT_CONFIG_KEY_n` and
/// `GIT_CONFIG_VALUE_n`, never `-c key=value`: git splits `-c` at the first
/// `=`, and a driver named `a=b` would make `-c filter.a=b.clean=` set
/// `filter.a` and leave the driver running.
pub(crate) fn driver_overrides(names: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for key in names.split('\0').map(str::trim).filter(|k| !k.is_empty()) {
        let lower = key.to_ascii_lowercase();
        let Some((section, rest)) = lower.split_once('.') else {
            continue;
        };
        let Some((_, var)) = rest.rsplit_once('.') else {
            continue;
        };
        let set: &[(&str, &str)] = match (section, var) {
            ("filter", "clean" | "smudge" | "process" | "required") => &[
                ("clean", ""),
                ("smudge", ""),
                ("process", ""),
                ("required", "false"),
            ],
            ("merge", "driver") => &[("driver", "false")],
            ("diff", "command" | "textconv") => &[("command", ""), ("textconv", "")],
            _ => continue,
        };
        // The subsection keeps its case in the key git printed.
        let sub = &key[section.len() + 1..key.len() - var.len() - 1];
        for (k, v) in set {
            let o = (format!("{section}.{sub}.{k}"), v.to_string());
            if !out.contains(&o) {
                out.push(o);
            }
        }
    }
    out
}

/// `args` with `--no-ext-diff --no-textconv` after a patch-making subcommand.
pub(crate) fn patch_safe<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    if let Some(mut i) = v.iter().position(|a| !a.starts_with('-')) {
        // `stash show` takes diff options after `show`.
        if v[i] == "stash" && v.get(i + 1) == Some(&"show") {
            i += 1;
        }
        if matches!(
            v[i],
            "diff" | "log" | "show" | "format-patch" | "whatchanged"
        ) {
            v.insert(i + 1, "--no-textconv");
            v.insert(i + 1, "--no-ext-diff");
        }
    }
    v
}

/// What a finished git printed.
pub(crate) struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Run `c` with `args` to its end or the deadline; on the deadline the whole
/// process group is killed (git's helpers with it).
pub(crate) async fn finish(
    c: Command,
    dir: &Path,
    args: &[&str],
    timeout: Duration,
) -> Result<Finished, VcsError> {
    let mut c = tokio::process::Command::from(c);
    c.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = c.spawn().map_err(|source| VcsError::Spawn {
        dir: dir.to_path_buf(),
        source,
    })?;
    let pid = child.id();
    let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(r) => r.map_err(|e| VcsError::io("wait for git in", dir, e))?,
        Err(_) => {
            kill_group(pid);
            return Err(VcsError::Timeout {
                dir: dir.to_path_buf(),
                args: args.join(" "),
                secs: timeout.as_secs(),
            });
        }
    };
    Ok(Finished {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Run `c`; its stdout, or the failure with its stderr.
pub(crate) async fn output(
    c: Command,
    dir: &Path,
    args: &[&str],
    timeout: Duration,
) -> Result<String, VcsError> {
    let f = finish(c, dir, args, timeout).await?;
    if f.code != Some(0) {
        return Err(failed(dir, args, said(&f)));
    }
    Ok(f.stdout)
}

/// What a failed git said: its stderr, or, when that is empty, the end of
/// its stdout (a conflicting `stash apply` or `merge` prints its `CONFLICT`
/// lines there), or its exit code when it said nothing.
pub(crate) fn said(f: &Finished) -> String {
    if !f.stderr.is_empty() {
        return f.stderr.clone();
    }
    let lines: Vec<&str> = f.stdout.trim_end().lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    if tail.trim().is_empty() {
        match f.code {
            Some(c) => format!("git printed nothing and exited with {c}"),
            None => "git printed nothing and was killed by a signal".into(),
        }
    } else {
        tail
    }
}

pub(crate) fn failed(dir: &Path, args: &[&str], stderr: String) -> VcsError {
    VcsError::Failed {
        dir: dir.to_path_buf(),
        args: args.join(" "),
        stderr,
    }
}

/// The blocking counterpart of [`output`], for code already on the blocking
/// pool (the commit's checks).
pub(crate) fn output_blocking(
    mut c: Command,
    dir: &Path,
    args: &[&str],
    timeout: Duration,
) -> Result<String, VcsError> {
    let child = c
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| VcsError::Spawn {
            dir: dir.to_path_buf(),
            source,
        })?;
    let dog = Watchdog::start(child.id(), timeout);
    let out = child.wait_with_output();
    dog.check(dir, args)?;
    let out = out.map_err(|e| VcsError::io("wait for git in", dir, e))?;
    if !out.status.success() {
        let f = Finished {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        };
        return Err(failed(dir, args, said(&f)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Kills a blocking git's process group at a deadline, unless it is dropped
/// (or checked) first.
pub(crate) struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    fired: Arc<AtomicBool>,
    secs: u64,
}

impl Watchdog {
    pub(crate) fn start(pid: u32, timeout: Duration) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
                f.store(true, Ordering::SeqCst);
                kill_group(Some(pid));
            }
        });
        Watchdog {
            stop: Some(tx),
            fired,
            secs: timeout.as_secs(),
        }
    }

    /// Stop watching; the timeout error if the deadline already fired.
    pub(crate) fn check(mut self, dir: &Path, args: &[&str]) -> Result<(), VcsError> {
        self.stop.take();
        if self.fired.load(Ordering::SeqCst) {
            return Err(VcsError::Timeout {
                dir: PathBuf::from(dir),
                args: args.join(" "),
                secs: self.secs,
            });
        }
        Ok(())
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread, which then exits.
        self.stop.take();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A git that hangs (here: a credential prompt replaced by a sleeping
    /// helper) is killed with its whole group at the deadline.
    #[tokio::test]
    async fn the_deadline_kills_the_whole_group() {
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("survived");
        let script = format!("(sleep 2; touch {}) & sleep 30", marker.display());
        let mut c = base_command(d.path(), &[]);
        c.current_dir(d.path());
        let t = std::time::Instant::now();
        let e = output(
            c,
            d.path(),
            &["-c", &format!("alias.hang=!{script}"), "hang"],
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, VcsError::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(2500));
        assert!(!marker.exists(), "a grandchild outlived the timeout");
    }

    #[test]
    fn blocking_runs_have_the_same_deadline() {
        let d = tempfile::tempdir().unwrap();
        let mut c = base_command(d.path(), &[]);
        c.current_dir(d.path());
        let e = output_blocking(
            c,
            d.path(),
            &["-c", "alias.hang=!sleep 30", "hang"],
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(matches!(e, VcsError::Timeout { .. }), "{e}");
    }
}
