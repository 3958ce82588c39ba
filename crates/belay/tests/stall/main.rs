//! The engine stalls in the middle of a batch: dockerd is stopped (SIGSTOP)
//! for longer than the Engine API client's timeout, then continued. The
//! batch holds the projects the engine failed under, starts no new one,
//! waits for the engine, resumes them from their checkpoints, and ends with
//! the same results as an undisturbed batch of the same projects.
//!
//! Its own test binary: cargo runs test binaries one after another, so no
//! other test's engine calls stall with it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Continues dockerd whatever happens to the test.
struct Stopped(i32);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

fn dockerd_pid() -> i32 {
    let o = Command::new("pidof").arg("dockerd").output().unwrap();
    let pids = String::from_utf8_lossy(&o.stdout);
    let pid = pids.split_whitespace().next().unwrap_or_else(|| {
        panic!("no dockerd process: this test stops and continues the engine (./scripts/setup-host.sh starts it)")
    });
    pid.parse().unwrap()
}

fn projects(dir: &Path) -> std::path::PathBuf {
    for n in ["alpha", "beta", "gamma"] {
        let p = dir.join(n);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("README.md"), format!("{n}\n")).unwrap();
    }
    let f = dir.join("projects.txt");
    std::fs::write(&f, "./alpha\n./beta\n./gamma\n").unwrap();
    f
}

fn batch(dir: &Path, prefix: &str, projects: &Path, timeout_s: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_belay"))
        .current_dir(dir)
        .env("BELAY_ENGINE_TIMEOUT_S", timeout_s)
        .env("BELAY_ENGINE_SLOW_TIMEOUT_S", timeout_s)
        .env("NO_COLOR", "1")
        .args([
            "env",
            "build-projects",
            "--jobs",
            "1",
            "--no-cache",
            "--run-id-prefix",
            prefix,
            "--projects-file",
        ])
        .arg(projects)
        .arg("--projects-dir")
        .arg(dir.join(format!("projects-{prefix}")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn outcome(dir: &Path, prefix: &str) -> Vec<(String, String)> {
    let s: Value = serde_json::from_str(
        &std::fs::read_to_string(
            dir.join(format!("projects-{prefix}"))
                .join("build-projects-summary.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut v: Vec<(String, String)> = s["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_stalled_engine_mid_batch_changes_no_result() {
    let ok = Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        ok.is_ok_and(|s| s.success()),
        "these tests need a running Docker engine (./scripts/setup-host.sh)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let list = projects(tmp.path());
    let tag = format!("{}", std::process::id());
    // Undisturbed.
    let calm = format!("calm{tag}");
    let o = batch(tmp.path(), &calm, &list, "4")
        .wait_with_output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let expected = outcome(tmp.path(), &calm);
    assert_eq!(
        expected.iter().filter(|(_, s)| s == "ok").count(),
        3,
        "{expected:?}"
    );
    // Stalled: once the first project is built, while the next ones wait in
    // the queue, the engine stops for three times the client's timeouts (4 s
    // for every call, the long ones too).
    let stalled = format!("stall{tag}");
    let child = batch(tmp.path(), &stalled, &list, "4");
    let first = tmp
        .path()
        .join(format!("projects-{stalled}"))
        .join(".belay-state/runs")
        .join(format!("{stalled}-alpha"))
        .join("manifest.json");
    let t = Instant::now();
    while !first.is_file() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the batch did not build its first project"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = dockerd_pid();
    let stall = Duration::from_secs(12);
    {
        let _cont = Stopped(pid);
        assert!(Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap()
            .success());
        std::thread::sleep(stall);
    }
    let o = child.wait_with_output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(
        o.status.success(),
        "the stalled batch failed:\n{out}\n{err}"
    );
    assert_eq!(outcome(tmp.path(), &stalled), expected, "{out}\n{err}");
    let all = format!("{out}\n{err}");
    let paused = all.contains("the engine failed under") && all.contains("answers again");
    println!(
        "ENGINE-STALL {} s with a 4 s client timeout: {}; results {:?} (undisturbed: the same)",
        stall.as_secs(),
        if paused {
            "the batch held its project, waited and resumed it"
        } else {
            "no engine call failed (the stall fell inside a stream)"
        },
        outcome(tmp.path(), &stalled)
    );
    assert!(
        paused,
        "the stall was not seen by the batch (it should hold, wait and resume):\n{all}"
    );
    for l in all.lines().filter(|l| l.contains("the engine")) {
        println!("  {l}");
    }
}
