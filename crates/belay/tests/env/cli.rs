//! The CLI surface, snapshot-tested.

use crate::common::belay;

fn stdout_of(args: &[&str]) -> String {
    let out = belay()
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}

#[test]
fn help_and_version() {
    insta::assert_snapshot!("help", stdout_of(&["--help"]));
    insta::assert_snapshot!("env_build_help", stdout_of(&["env", "build", "--help"]));
    let v = stdout_of(&["--version"]);
    assert_eq!(v.trim(), format!("belay {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn env_plan_prints_and_writes_the_plan_without_docker() {
    let out = tempfile::tempdir().unwrap();
    let repo = crate::common::fixture("py-pyproject");
    let assert = belay()
        // No Docker is touched: a bogus daemon address must not matter.
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["env", "plan", "--repo"])
        .arg(&repo)
        .arg("--out")
        .arg(out.path())
        .assert()
        .success();
    let text = String::from_utf8(assert.get_output().stdout.clone()).unwrap();
    let text = text.replace(&out.path().display().to_string(), "<out>");
    insta::assert_snapshot!("env_plan_py", text);
    for f in [
        "context.json",
        "blocks/30-python-deps.json",
        "scripts/30-python-deps.sh",
        "scripts/50-test-tooling.sh",
    ] {
        assert!(out.path().join(f).is_file(), "{f} missing");
    }
    let ctx = crate::common::read_json(&out.path().join("context.json"));
    assert_eq!(ctx["languages"], serde_json::json!(["python"]));
    assert_eq!(ctx["runtime_notes"]["observed"], false);
}
