//! The run registry under concurrent writers and kills: real processes
//! appending to one index at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use belay_record::{Mode, Registry, RunEnd, RunStatus};

const CHILD: &str = "BELAY_REGISTRY_TEST_CHILD";

/// When run as a child: register 200 runs (each started and ended) and exit.
fn child_main(dir: &Path, n: usize, tag: &str) {
    let r = Registry::at(dir);
    for i in 0..n {
        let id = format!("{tag}-{i:04}");
        r.started(&id, Mode::Pipeline, dir, Some("concurrent"), None)
            .unwrap();
        r.ended(
            &id,
            RunEnd {
                ok: i % 2 == 0,
                duration_s: 0.1,
                ..Default::default()
            },
        )
        .unwrap();
    }
}

#[test]
fn eight_processes_register_1600_runs_at_once() {
    if let Ok(spec) = std::env::var(CHILD) {
        let (dir, tag) = spec.split_once('|').unwrap();
        child_main(Path::new(dir), 200, tag);
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..8)
        .map(|k| {
            Command::new(&me)
                .args([
                    "--exact",
                    "eight_processes_register_1600_runs_at_once",
                    "--nocapture",
                ])
                .env(CHILD, format!("{}|w{k}", d.path().display()))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let all = Registry::at(d.path()).list().unwrap();
    assert_eq!(all.len(), 1600);
    assert_eq!(
        all.iter().filter(|e| e.status == RunStatus::Ok).count(),
        800
    );
    assert_eq!(
        all.iter().filter(|e| e.status == RunStatus::Failed).count(),
        800
    );
    // Every line of the index parses: no two writers interleaved.
    let text = std::fs::read_to_string(Registry::at(d.path()).index()).unwrap();
    let lines: Vec<&str> = text.split('\n').filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 3200);
    for l in lines {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
}

/// A writer killed with SIGKILL in the middle of its appends leaves at most a
/// torn record; every run recorded before, and everything written after by
/// others, is still read, and the killed writer's unfinished run is
/// `interrupted`.
#[test]
fn a_writer_killed_mid_write_loses_nothing_else() {
    if let Ok(spec) = std::env::var(CHILD) {
        let (dir, tag) = spec.split_once('|').unwrap();
        let r = Registry::at(Path::new(dir));
        r.started(
            &format!("{tag}-open"),
            Mode::Env,
            Path::new(dir),
            None,
            None,
        )
        .unwrap();
        child_main(Path::new(dir), 100_000, tag);
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let me = std::env::current_exe().unwrap();
    let mut c = Command::new(&me)
        .args([
            "--exact",
            "a_writer_killed_mid_write_loses_nothing_else",
            "--nocapture",
        ])
        .env(CHILD, format!("{}|k", d.path().display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let index = Registry::at(d.path()).index();
    while std::fs::metadata(&index).map(|m| m.len()).unwrap_or(0) < 200_000 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    c.kill().unwrap();
    c.wait().unwrap();
    let r = Registry::at(d.path());
    let before = r.list().unwrap().len();
    assert!(before > 100, "{before}");
    r.started("after", Mode::Pipeline, d.path(), None, None)
        .unwrap();
    r.ended(
        "after",
        RunEnd {
            ok: true,
            ..Default::default()
        },
    )
    .unwrap();
    let all = r.list().unwrap();
    assert!(all.len() == before + 1, "{} vs {before}", all.len());
    assert_eq!(r.find("after").unwrap().unwrap().status, RunStatus::Ok);
    assert_eq!(
        r.find("k-open").unwrap().unwrap().status,
        RunStatus::Interrupted
    );
}
