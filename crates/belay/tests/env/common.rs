use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub const BASE_IMAGE: &str = "belay-base:bookworm";

pub fn belay() -> assert_cmd::Command {
    let mut c = assert_cmd::cargo::cargo_bin_cmd!("belay");
    c.env_remove("RUST_LOG").env("NO_COLOR", "1");
    // Planning is `auto`: keep a developer's model settings out of the tests.
    for v in MODEL_VARS {
        c.env_remove(v);
    }
    c
}

pub const MODEL_VARS: [&str; 5] = [
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "BELAY_MODEL",
];

pub fn belay_path() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_belay"))
}

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// `cp -a` of fixture `name` to `dest` (a path that does not exist yet).
pub fn copy_fixture(name: &str, dest: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(fixture(name))
        .arg(dest)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a {name} {}", dest.display());
}

/// Run the docker CLI; returns (success, stdout, stderr).
pub fn docker(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI is needed by the tests");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Fail loudly (never skip) when the engine or the base image is missing.
pub fn require_engine() {
    let (ok, _, err) = docker(&["info", "--format", "{{.ServerVersion}}"]);
    assert!(
        ok,
        "these tests need a running Docker engine (start dockerd; .ci/run does): {err}"
    );
    let (ok, _, _) = docker(&["image", "inspect", BASE_IMAGE]);
    assert!(
        ok,
        "these tests need the base image {BASE_IMAGE}: run `belay image bootstrap` (.ci/run does)"
    );
}

/// A unique run id for this test process.
pub fn run_id(name: &str) -> String {
    format!("t-{name}-{}", std::process::id())
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

pub fn manifest(state: &Path, run: &str) -> Value {
    read_json(&state.join("runs").join(run).join("manifest.json"))
}

/// Containers (any state) carrying `belay.run=<run>`.
pub fn run_containers(run: &str) -> Vec<String> {
    let (_, out, _) = docker(&["ps", "-aq", "--filter", &format!("label=belay.run={run}")]);
    out.lines().map(String::from).collect()
}

/// Remove the images and containers a test run made.
pub fn cleanup_run(run: &str) {
    for c in run_containers(run) {
        docker(&["rm", "-f", &c]);
    }
    let (_, out, _) = docker(&[
        "images",
        "--format",
        "{{.Repository}}:{{.Tag}}",
        "--filter",
        &format!("label=belay.run={run}"),
    ]);
    let refs: Vec<&str> = out.lines().filter(|l| !l.contains("<none>")).collect();
    if !refs.is_empty() {
        let mut args = vec!["rmi", "-f"];
        args.extend(refs);
        docker(&args);
    }
}

/// Removes a run's images and containers when dropped, even if the test fails.
pub struct RunGuard(pub String);

impl Drop for RunGuard {
    fn drop(&mut self) {
        cleanup_run(&self.0);
    }
}

/// Execution records of one phase.
pub fn phases<'a>(m: &'a Value, phase: &str) -> Vec<&'a Value> {
    m["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["phase"] == phase)
        .collect()
}

pub fn block<'a>(m: &'a Value, id: &str) -> &'a Value {
    m["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == id)
        .unwrap()
}

/// `sh -c cmd` in `image`, without network: success, stdout, stderr.
pub fn sh_offline(image: &str, cmd: &str) -> (bool, String, String) {
    docker(&["run", "--rm", "--network", "none", image, "sh", "-c", cmd])
}

/// Run the project's tests in the final image, without network.
pub fn project_tests_pass(m: &Value, cmd: &str, expect: &str) {
    let image = m["final_image"].as_str().unwrap();
    let (ok, out, err) = docker(&["run", "--rm", "--network", "none", image, "bash", "-c", cmd]);
    assert!(ok, "`{cmd}` failed in {image}:\n{out}\n{err}");
    assert!(
        out.contains(expect) || err.contains(expect),
        "`{cmd}` output lacks {expect:?}:\n{out}\n{err}"
    );
}

/// An env build that reaps orphans at start and then stops at a missing base
/// image (exit 2): the quickest way to run the reaper for real.
pub fn build_with_missing_base(state: &Path) -> assert_cmd::assert::Assert {
    belay()
        .args([
            "env",
            "build",
            "--base-image",
            "belay-test-missing:nope",
            "--repo",
        ])
        .arg(fixture("go-module"))
        .arg("--state-dir")
        .arg(state)
        .assert()
        .code(2)
}

pub use crate::replay::{files_containing, Replay};
