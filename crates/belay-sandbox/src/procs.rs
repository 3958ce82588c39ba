//! Ending everything a step started.
//!
//! A container runs two processes of its own: the engine's init (PID 1 in the
//! container) and its idle main process. Every other process in the
//! container's pid namespace was started by a step, directly or not: a
//! double-forked daemon, a process renamed with `exec -a sleep`, one
//! reparented to PID 1. At the end of a step all of them are killed.
//!
//! The kill is done from the host, by namespace, not by name: every process
//! whose `/proc/<pid>/ns/pid` is the container's is killed, except the two
//! recorded (pid **and** start time) when the container started, which a
//! process in the container cannot impersonate. Nothing inside the container
//! takes part, so nothing inside can interfere. The passes repeat until the
//! namespace holds only the two (a fork during a pass is caught by the next;
//! the pids limit bounds how many there can be).
//!
//! Then the step's writable scratch (`/tmp` and `/dev/shm`, both tmpfs in the
//! container) is emptied from the host through `/proc/<init>/root`, so the
//! next step starts with its own `HOME` (`/tmp`) and nothing a step left there
//! (a `~/.netrc` holding a secret) reaches the next.

use crate::SandboxError;
use std::path::{Path, PathBuf};

use belay_record::ProcessIdentity;

/// The processes of a container that are not a step's: its init and main
/// process, as host pids with their start times.
#[derive(Debug, Clone)]
pub struct ContainerProcs {
    init: ProcessIdentity,
    main: Option<ProcessIdentity>,
    ns: PathBuf,
}

/// How many processes a sweep killed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub killed: usize,
    pub passes: usize,
}

/// The child of `pid` that started first: a container's main process, which
/// its init starts before any exec, so no later process can claim it.
fn oldest_child(pid: u32) -> Option<ProcessIdentity> {
    let children = fs_err::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter_map(ProcessIdentity::of)
        .min_by_key(|c| c.start_ticks)
}

/// How long a sweep waits for the processes it killed to be gone.
const SWEEP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether `pid` has exited (a zombie, or gone): field 3 of its `stat`,
/// after the command name, which may hold spaces and parentheses.
fn exited(pid: u32) -> bool {
    fs_err::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| state_of(&s))
        .is_none_or(|state| matches!(state, 'Z' | 'X' | 'x'))
}

fn state_of(stat: &str) -> Option<char> {
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

fn ns_of(pid: u32) -> Option<PathBuf> {
    fs_err::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

impl ContainerProcs {
    /// Record a just-started container from its init's host pid (the
    /// engine's `State.Pid`). `None` when that pid is not visible here (a
    /// remote engine, or belay in another pid namespace).
    pub fn record(init_pid: u32) -> Option<ContainerProcs> {
        let init = ProcessIdentity::of(init_pid)?;
        let ns = ns_of(init_pid)?;
        // The init forks its child just after the start: wait for it (up to
        // 2 s), or the sweep would take it for a step's process.
        let mut main = None;
        for _ in 0..400 {
            main = oldest_child(init_pid);
            if main.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Some(ContainerProcs { init, main, ns })
    }

    fn keeps(&self, pid: u32) -> bool {
        let same = |k: &ProcessIdentity| {
            k.pid == pid && ProcessIdentity::of(pid).is_some_and(|now| now == *k)
        };
        same(&self.init) || self.main.as_ref().is_some_and(same)
    }

    /// The live pids in the container's namespace that are not its own. A
    /// zombie is dead already: its parent (the container's init) reaps it.
    fn strays(&self) -> Vec<u32> {
        let Ok(rd) = fs_err::read_dir("/proc") else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
            .filter(|&pid| ns_of(pid).as_deref() == Some(self.ns.as_path()))
            .filter(|&pid| !self.keeps(pid))
            .filter(|&pid| !exited(pid))
            .collect()
    }

    /// Kill every process of the namespace but the container's own two.
    /// Passes repeat until none is left: a fork during a pass is caught by
    /// the next, and a killed process that has not finished dying (its
    /// exit tears down a large address space, or waits out a syscall on the
    /// overlay filesystem) is waited for, briefly, up to [`SWEEP_PATIENCE`].
    pub fn sweep(&mut self) -> Result<Swept, SandboxError> {
        let fail = |message: String| SandboxError::Docker {
            op: "end a step's processes",
            message,
        };
        if !self.init.is_alive() {
            return Err(fail("the container's init is gone: it was stopped or removed during the step. Rerun the same command with --resume to continue in a new container".into()));
        }
        if self.main.is_none() {
            self.main = oldest_child(self.init.pid);
        }
        let t0 = std::time::Instant::now();
        let mut killed = std::collections::HashSet::new();
        let mut pause = std::time::Duration::from_millis(1);
        let mut passes = 0;
        loop {
            let strays = self.strays();
            if strays.is_empty() {
                return Ok(Swept {
                    killed: killed.len(),
                    passes,
                });
            }
            if t0.elapsed() > SWEEP_PATIENCE {
                return Err(fail(format!(
                    "{} process(es) of the step still run {} s after being killed (pids {strays:?}; {} killed in {passes} passes). The container is unusable: rerun the same command with --resume to continue in a new one",
                    strays.len(),
                    SWEEP_PATIENCE.as_secs(),
                    killed.len()
                )));
            }
            let mut new = false;
            for pid in strays {
                let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
                    continue;
                };
                if rustix::process::kill_process(p, rustix::process::Signal::KILL).is_ok() {
                    new |= killed.insert(pid);
                }
            }
            passes += 1;
            // Only the killed are left, still dying: give them a moment.
            if !new {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
        }
    }

    /// Empty the container's `/tmp` and `/dev/shm` (run after [`Self::sweep`],
    /// when nothing in the container can race the removal; links are removed,
    /// never followed).
    pub fn wipe_scratch(&self) -> Result<(), SandboxError> {
        let root = PathBuf::from(format!("/proc/{}/root", self.init.pid));
        for dir in ["tmp", "dev/shm"] {
            empty_dir(&root.join(dir)).map_err(|e| SandboxError::Io {
                action: "empty a step's",
                path: root.join(dir),
                source: e,
            })?;
        }
        Ok(())
    }
}

fn empty_dir(dir: &Path) -> std::io::Result<()> {
    let rd = match fs_err::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in rd.flatten() {
        let p = e.path();
        let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let r = if is_dir {
            // std's remove_dir_all does not follow links.
            fs_err::remove_dir_all(&p)
        } else {
            fs_err::remove_file(&p)
        };
        if let Err(e) = r {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Whether a `/proc/PID/net/tcp` table has a listening socket (state `0A`)
/// at `local` (`ADDR:PORT` as the table writes it, e.g. `0100007F:0C38`).
pub fn tcp_listens(table: &str, local: &str) -> bool {
    table.lines().skip(1).any(|l| {
        let mut f = l.split_whitespace();
        let (_, addr, _, state) = (f.next(), f.next(), f.next(), f.next());
        addr == Some(local) && state == Some("0A")
    })
}

/// Whether a `/proc/PID/mountinfo` table has a mount at `path` (its fifth
/// field, with the kernel's octal escapes).
pub fn mounted_at(table: &str, path: &str) -> bool {
    let mut escaped = String::with_capacity(path.len());
    for c in path.chars() {
        match c {
            ' ' => escaped.push_str("\\040"),
            '\t' => escaped.push_str("\\011"),
            '\n' => escaped.push_str("\\012"),
            '\\' => escaped.push_str("\\134"),
            c => escaped.push(c),
        }
    }
    table
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(escaped.as_str()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mount_is_found_by_its_escaped_path() {
        let t = "36 35 98:0 /mnt1 /workspace/repo rw - ext3 /dev/root rw\n37 36 98:0 /x /workspace/repo/my\\040plan.json ro - ext3 /dev/root rw\n";
        assert!(super::mounted_at(t, "/workspace/repo/my plan.json"));
        assert!(super::mounted_at(t, "/workspace/repo"));
        assert!(!super::mounted_at(t, "/workspace/repo/plan.json"));
    }

    #[test]
    fn a_process_state_is_read_past_a_command_name_with_parentheses() {
        assert_eq!(super::state_of("41 (sleep) Z 1 41 41 0"), Some('Z'));
        assert_eq!(super::state_of("42 (a) R (b)) S 1 42"), Some('S'));
        assert_eq!(super::state_of("43 (x"), None);
        assert!(super::exited(u32::MAX));
        assert!(!super::exited(std::process::id()));
    }

    #[test]
    fn a_listening_socket_is_found_in_the_tcp_table() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 1 1 0 100 0 0 10 0\n   1: 0100007F:0C39 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000 0 0 2\n";
        assert!(super::tcp_listens(t, "0100007F:0C38"));
        assert!(!super::tcp_listens(t, "0100007F:0C39"));
        assert!(!super::tcp_listens(t, "0100007F:0C3A"));
    }
}
