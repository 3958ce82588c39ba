//! Each bad input gets one clear message and a non-zero exit code, never a panic.

use crate::common::{belay, build_with_missing_base, fixture, require_engine};

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

fn no_panic(s: &str) {
    assert!(
        !s.contains("panicked") && !s.contains("internal error"),
        "a panic reached the user:\n{s}"
    );
}

#[test]
fn no_docker_daemon() {
    let a = belay()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["env", "build", "--repo"])
        .arg(fixture("py-pyproject"))
        .assert()
        .code(3);
    let err = stderr_of(&a);
    no_panic(&err);
    assert!(
        err.contains("Docker daemon is not reachable") && err.contains("dockerd"),
        "{err}"
    );

    let a = belay()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .arg("doctor")
        .assert()
        .code(1);
    let out = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(out.contains("FAIL docker"), "{out}");
}

#[test]
fn missing_repo() {
    let a = belay()
        .args(["env", "build", "--repo", "/no/such/repo"])
        .assert()
        .code(2);
    let err = stderr_of(&a);
    no_panic(&err);
    assert!(
        err.contains("/no/such/repo") && err.contains("--repo"),
        "{err}"
    );
}

#[test]
fn missing_base_image() {
    require_engine();
    let state = tempfile::tempdir().unwrap();
    let a = build_with_missing_base(state.path());
    let err = stderr_of(&a);
    no_panic(&err);
    assert!(
        err.contains("belay-test-missing:nope is not present"),
        "{err}"
    );
}

#[test]
fn unwritable_state_dir() {
    require_engine();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let a = belay()
        .args(["env", "build", "--repo"])
        .arg(fixture("go-module"))
        .arg("--state-dir")
        .arg(file.join("state"))
        .assert()
        .code(2);
    let err = stderr_of(&a);
    no_panic(&err);
    assert!(
        err.contains("state directory") && err.contains("--state-dir"),
        "{err}"
    );
}

#[test]
fn bad_flags() {
    for args in [
        vec!["env", "build", "--repo", ".", "--command-timeout", "0"],
        vec![
            "env",
            "build",
            "--repo",
            ".",
            "--start-at-block",
            "10-system-packages",
        ],
        vec!["env", "build", "--repo", ".", "--run-id", "bad/id"],
        vec!["env", "build", "--repo", ".", "--no-such-flag"],
        vec!["env", "build"],
    ] {
        let a = belay()
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .args(&args)
            .assert()
            .code(2);
        let err = stderr_of(&a);
        no_panic(&err);
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

#[test]
fn malformed_oracle_file_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let oracle = dir.path().join("bad.oracle.json");
    std::fs::write(
        &oracle,
        "{\n  \"fixed_test_commands\": [\n    {\"command\": 42}\n  ]\n}\n",
    )
    .unwrap();
    let a = belay()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["env", "build", "--repo"])
        .arg(fixture("go-module"))
        .arg("--oracle-file")
        .arg(&oracle)
        .assert()
        .code(2);
    let err = stderr_of(&a);
    no_panic(&err);
    assert!(err.contains("bad.oracle.json:3:"), "{err}");
}

#[test]
fn malformed_package_json_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("package.json"),
        "{\n  \"name\": \"x\",\n  \"scripts\": {,}\n}\n",
    )
    .unwrap();
    let a = belay()
        .args(["env", "plan", "--repo"])
        .arg(dir.path())
        .assert()
        .code(2);
    let err = stderr_of(&a);
    no_panic(&err);
    assert!(err.contains("package.json:3:"), "{err}");
}

#[test]
fn a_belay_link_in_the_repository_never_receives_the_state() {
    // An untrusted repository ships `.belay -> <a host dir>`: plan and build
    // refuse (exit 2, before Docker) and write nothing there.
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let host = tmp.path().join("host-dir");
    std::fs::create_dir_all(&host).unwrap();
    copy_fixture(&fixture("py-pyproject"), &repo);
    std::os::unix::fs::symlink(&host, repo.join(".belay")).unwrap();
    for args in [&["env", "plan"][..], &["env", "build"][..]] {
        let a = belay()
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .args(args)
            .arg("--repo")
            .arg(&repo)
            .assert()
            .code(2);
        let err = stderr_of(&a);
        no_panic(&err);
        assert!(
            err.contains("symbolic link") && (err.contains("--out") || err.contains("--state-dir")),
            "{args:?}: {err}"
        );
        assert_eq!(std::fs::read_dir(&host).unwrap().count(), 0, "{args:?}");
    }
    // A link deeper in a real `.belay` is refused too.
    std::fs::remove_file(repo.join(".belay")).unwrap();
    std::fs::create_dir_all(repo.join(".belay")).unwrap();
    std::os::unix::fs::symlink(&host, repo.join(".belay/plan")).unwrap();
    belay()
        .args(["env", "plan", "--repo"])
        .arg(&repo)
        .assert()
        .code(2);
    assert_eq!(std::fs::read_dir(&host).unwrap().count(), 0);
}

fn copy_fixture(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_fixture(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}
