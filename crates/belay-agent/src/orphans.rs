//! What a host agent leaves behind. An agent on the host (`--on-host`) runs
//! in its own process group, which belay kills at the end of the call; a
//! process that left the group (`setsid`, a double fork) would survive it.
//! With [`adopt_orphans`], such processes are re-parented to belay when their
//! parents die, and [`kill_adopted`] kills them.

/// Make this process the child subreaper of its descendants: an orphaned
/// descendant becomes its child instead of init's. Whether it took.
pub fn adopt_orphans() -> bool {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).is_ok()
}

/// The pids whose parent is this process, each with whether it is a zombie.
fn children() -> Vec<(i32, bool)> {
    let me = std::process::id().to_string();
    // host-owned: the host's /proc.
    let Ok(dir) = fs_err::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter_map(|pid| {
            // host-owned: the host's /proc (the kernel's record, whatever comm says).
            let s = fs_err::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`: comm may hold spaces and parens.
            let mut rest = s[s.rfind(')')? + 1..].split_whitespace();
            let state = rest.next()?;
            (rest.next()? == me).then_some((pid, state == "Z"))
        })
        .collect()
}

/// Kill every child of this process, and each one's group, until none is
/// left (killing one re-parents its own children here); reap them. Call it
/// only when this process runs no child of its own. The pids killed.
pub fn kill_adopted() -> Vec<u32> {
    let mut killed = Vec::new();
    for _ in 0..50 {
        let kids = children();
        if kids.is_empty() {
            break;
        }
        for (pid, zombie) in kids {
            let Some(p) = rustix::process::Pid::from_raw(pid) else {
                continue;
            };
            if !zombie {
                let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                if !killed.contains(&(pid as u32)) {
                    killed.push(pid as u32);
                }
            }
            let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    killed
}
