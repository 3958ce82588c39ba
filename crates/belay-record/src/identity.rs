use serde::{Deserialize, Serialize};

/// Who owns a resource: pid plus the process start time (in clock ticks since
/// boot) plus the kernel boot id. A pid alone is reused; the triple is not. The
/// reaper removes a container only when this evidence says its owner is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_ticks: u64,
    pub boot_id: String,
}

impl ProcessIdentity {
    /// The identity of the current process.
    pub fn current() -> Option<Self> {
        Self::of(std::process::id())
    }

    /// The identity of a running process, or `None` when it does not exist.
    pub fn of(pid: u32) -> Option<Self> {
        Some(Self {
            pid,
            start_ticks: start_ticks(pid)?,
            boot_id: boot_id()?,
        })
    }

    /// Whether the process this identity names is still running. A different
    /// boot, a missing pid or a reused pid (other start time) all mean "gone".
    pub fn is_alive(&self) -> bool {
        match Self::of(self.pid) {
            Some(now) => now == *self,
            None => false,
        }
    }
}

fn boot_id() -> Option<String> {
    fs_err::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Field 22 of /proc/<pid>/stat. The command name (field 2) may hold spaces and
/// parentheses, so parsing starts after its last ')'.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs_err::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_ticks(&stat)
}

fn parse_start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the comm field: state is field 3, so starttime (22) is index 19 here.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_process_is_alive() {
        let me = ProcessIdentity::current().unwrap();
        assert!(me.is_alive());
        let reused = ProcessIdentity {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(
            !reused.is_alive(),
            "a different start time must count as gone"
        );
        let other_boot = ProcessIdentity {
            boot_id: "not-this-boot".into(),
            ..me
        };
        assert!(!other_boot.is_alive());
    }

    #[test]
    fn exited_child_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessIdentity::of(child.id());
        child.wait().unwrap();
        if let Some(id) = id {
            assert!(!id.is_alive());
        }
    }

    #[test]
    fn parses_comm_with_spaces_and_parens() {
        let stat =
            "1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_ticks(stat), Some(987654));
    }
}
