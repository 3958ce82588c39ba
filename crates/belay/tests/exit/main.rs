//! Exit codes come from the error's class: the machine failing (the engine
//! gone mid-run, a full disk) exits 3, a malformed file exits 2 with its file
//! and line. Real engine, real git, a real tmpfs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../shared/pipeline.rs"]
#[allow(dead_code)]
mod common;
#[path = "../shared/git.rs"]
#[allow(dead_code)]
mod git_cli;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{copy_dir, demo, require_engine};
use git_cli::init_repo;

/// A Unix socket in front of the real Docker engine. `stop` closes it and
/// every connection through it: from belay's side, the daemon is gone.
struct EngineSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<UnixStream>>>,
}

fn upstream() -> PathBuf {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
}

fn pipe(mut from: UnixStream, mut to: UnixStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

impl EngineSocket {
    fn start(dir: &Path) -> EngineSocket {
        let path = dir.join("docker.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
        let (s, c) = (stop.clone(), conns.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(engine) = UnixStream::connect(upstream()) else {
                            continue;
                        };
                        let mut held = c.lock().unwrap();
                        held.push(client.try_clone().unwrap());
                        held.push(engine.try_clone().unwrap());
                        pipe(client.try_clone().unwrap(), engine.try_clone().unwrap());
                        pipe(engine, client);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        EngineSocket { path, stop, conns }
    }

    fn url(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.path);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn belay() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_belay"));
    c.env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY");
    c
}

/// The engine goes away while a step runs: belay stops with exit 3 and says
/// the engine failed, not that the input was bad.
#[test]
fn the_engine_gone_mid_run_exits_3() {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("ws");
    copy_dir(&demo().join("repo"), &repo);
    std::fs::write(
        repo.join("pipeline.yaml"),
        "name: gone\ndeps_policy: open\nsteps:\n  - name: wait\n    command: \"touch started; sleep 60\"\n",
    )
    .unwrap();
    init_repo(&repo);
    let sock = EngineSocket::start(tmp.path());
    let state = tmp.path().join("state");
    let mut child = belay()
        .env("DOCKER_HOST", sock.url())
        .env("BELAY_STATE_HOME", tmp.path().join("registry"))
        .arg("run")
        .arg(repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !repo.join("started").exists() {
        assert!(Instant::now() < deadline, "the step never started");
        assert!(child.try_wait().unwrap().is_none(), "belay ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    sock.stop();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "belay did not notice the engine was gone"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    // What belay could not remove through the closed socket.
    let run = common::latest_run(&state);
    let id = run.file_name().unwrap().to_string_lossy().into_owned();
    for c in common::containers_of(&id) {
        let _ = Command::new("docker").args(["rm", "-f", &c]).output();
    }
    assert_eq!(status.code(), Some(3), "exit {status}: {err}");
    assert!(
        err.to_lowercase().contains("docker") || err.to_lowercase().contains("engine"),
        "the error does not say the engine failed: {err}"
    );
}

/// Malformed files exit 2, and the message names the file and the line.
#[test]
fn malformed_files_exit_2_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, &str, Vec<String>, &str)> = vec![
        (
            "pipeline.yaml",
            "name: bad\nsteps:\n  - name: a\n    command: [unclosed\n",
            vec!["run".into()],
            "pipeline.yaml:",
        ),
        (
            "replay.yaml",
            "turns:\n  - reply: {text: hi}\n  - nonsense: 3\n",
            vec!["model".into(), "replay".into()],
            "replay.yaml",
        ),
        (
            "projects.txt",
            "# fine\nowner/repo abc123\nthis line is wrong\n",
            vec![
                "env".into(),
                "build-projects".into(),
                "--projects-file".into(),
            ],
            "projects.txt:3",
        ),
    ];
    for (name, text, args, needle) in cases {
        let f = tmp.path().join(name);
        std::fs::write(&f, text).unwrap();
        let mut c = belay();
        c.env("BELAY_STATE_HOME", tmp.path().join("registry"))
            .args(&args)
            .arg(&f);
        if name == "projects.txt" {
            c.arg("--projects-dir").arg(tmp.path().join("p"));
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
    }
}

/// A full disk is the machine failing (exit 3), not bad input: `env plan`
/// writing into a full tmpfs.
#[test]
fn a_full_disk_exits_3() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test mounts a tmpfs and needs root (.ci/run runs as root)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    copy_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello-python"),
        &repo,
    );
    let full = tmp.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&full)
        .status()
        .unwrap();
    assert!(mounted.success(), "cannot mount a tmpfs");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(full.clone());
    std::fs::create_dir_all(full.join("out/blocks")).unwrap();
    std::fs::create_dir_all(full.join("out/scripts")).unwrap();
    // Fill it.
    let mut f = std::fs::File::create(full.join("fill")).unwrap();
    let _ = f.write_all(&vec![0u8; 128 * 1024]);
    drop(f);
    let out = belay()
        .env("BELAY_STATE_HOME", tmp.path().join("registry"))
        .args(["env", "plan", "--planner", "rules", "--repo"])
        .arg(&repo)
        .arg("--out")
        .arg(full.join("out"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
}
