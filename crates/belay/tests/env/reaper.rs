//! The reaper removes containers whose owner process is gone and leaves a live
//! owner's containers (and containers it cannot judge) alone.

use crate::common::*;

fn stat_start(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(19).unwrap().to_string()
}

fn machine() -> String {
    for p in [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/etc/hostname",
    ] {
        if let Ok(s) = std::fs::read_to_string(p) {
            if !s.trim().is_empty() {
                return s.trim().to_string();
            }
        }
    }
    "unknown-machine".into()
}

fn start(name: &str, run: &str, pid: &str, start: &str) -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let (ok, out, err) = docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--name",
        name,
        "--label",
        "belay=true",
        "--label",
        &format!("belay.run={run}"),
        "--label",
        &format!("belay.owner.pid={pid}"),
        "--label",
        &format!("belay.owner.start={start}"),
        "--label",
        &format!("belay.owner.boot={}", boot.trim()),
        "--label",
        &format!("belay.owner.machine={}", machine()),
        BASE_IMAGE,
        "sleep",
        "infinity",
    ]);
    assert!(ok, "{err}");
    out.trim().to_string()
}

fn exists(id: &str) -> bool {
    docker(&["inspect", id]).0
}

#[test]
fn reaper_removes_orphans_and_spares_live_owners() {
    require_engine();
    let run = run_id("reaper");
    let _guard = RunGuard(run.clone());
    let mut owner = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let pid = owner.id().to_string();
    let live = start(&format!("{run}-live"), &run, &pid, &stat_start(owner.id()));
    // Same pid, other start time: a reused pid, so the owner is gone.
    let reused = start(&format!("{run}-reused"), &run, &pid, "1");
    // A container started from a belay image has blank owner labels: not ours to judge.
    let blank = start(&format!("{run}-blank"), &run, "", "");

    let state = tempfile::tempdir().unwrap();
    // Any env build reaps at start; this one then stops at the missing base image.
    let a = build_with_missing_base(state.path());
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(
        exists(&live),
        "the live owner's container was removed:\n{err}"
    );
    assert!(!exists(&reused), "the orphan was not removed:\n{err}");
    assert!(
        exists(&blank),
        "a container without owner evidence was removed"
    );

    owner.kill().unwrap();
    owner.wait().unwrap();
    // Now its owner is gone: the next start reaps it.
    build_with_missing_base(state.path());
    assert!(!exists(&live), "the container of a dead owner survived");
    assert!(exists(&blank));
}
