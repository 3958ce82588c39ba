//! Tying an agent's life to belay's.
//!
//! A process belay starts with [`crate::cli::ProcessOptions::tie_to_parent`]
//! is launched as `belay __belay-exec-tied <belay pid> -- PROGRAM ARG…`. That
//! launcher is belay's own binary: it asks the kernel for SIGKILL when its
//! parent (belay) dies, checks that belay is still that parent (it may have
//! died between fork and here), and then *becomes* the program (`execve`
//! keeps the parent-death signal). No process of belay's own stays beside the
//! agent. The binary calls [`exec_tied`] when it sees [`EXEC_ARG`] first.
//!
//! The signal reaches the agent's own process; what the agent started in its
//! group is killed from the recorded group at belay's next start
//! ([`crate::cli::kill_recorded`]). In a container, the container itself is
//! tied to belay (its main process waits on a lock belay holds), so
//! everything in it dies at once.

use std::os::unix::process::CommandExt;

/// The launcher's first argument.
pub const EXEC_ARG: &str = "__belay-exec-tied";

/// Become `argv` (after `<parent pid> --`), tied to the parent. Returns only
/// on failure, with the reason.
pub fn exec_tied(args: &[String]) -> String {
    let (Some(parent), Some("--"), Some(program)) = (
        args.first().and_then(|p| p.parse::<i32>().ok()),
        args.get(1).map(String::as_str),
        args.get(2),
    ) else {
        return format!("usage: belay {EXEC_ARG} PARENT_PID -- PROGRAM [ARG…]");
    };
    if rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .is_err()
    {
        return "cannot set the parent-death signal".into();
    }
    // The parent died before the signal was armed: end now.
    let ppid = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
    if ppid != Some(parent) {
        return format!("belay (pid {parent}) is gone; not starting {program}");
    }
    let err = std::process::Command::new(program).args(&args[3..]).exec();
    format!("cannot start `{program}`: {err} (is it installed and on PATH?)")
}

/// A file this process holds a kernel lock on for as long as it lives: a
/// container made with it as its [`belay_sandbox::ContainerSpec::lifeline`]
/// waits on the lock and ends when belay does, even after a `kill -9`.
pub struct Lifeline {
    pub path: std::path::PathBuf,
    _lock: belay_record::RunLock,
}

impl Drop for Lifeline {
    fn drop(&mut self) {
        let _ = fs_err::remove_file(&self.path);
    }
}

impl Lifeline {
    /// Hold `<state home>/lifelines/<pid>.lock`.
    pub fn hold() -> Result<Lifeline, crate::AgentError> {
        let dir = belay_record::state_home().join("lifelines");
        fs_err::create_dir_all(&dir)
            .map_err(|e| crate::AgentError::Io(format!("cannot create {}: {e}", dir.display())))?;
        let path = dir.join(format!("{}.lock", std::process::id()));
        let lock = belay_record::RunLock::acquire(&path)
            .map_err(|e| crate::AgentError::Io(e.to_string()))?;
        // The container's idle user opens it to wait on the lock.
        use std::os::unix::fs::PermissionsExt;
        let _ = fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o644));
        Ok(Lifeline { path, _lock: lock })
    }
}
