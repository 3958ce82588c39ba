//! Shared by the pipeline and break-in suites: the belay command, the demo,
//! the engine check, and reading a run's directory.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The demo pipeline's model URL, replaced by the replay server's in tests.
pub const DEMO_URL: &str = "http://127.0.0.1:18765/v1";

pub fn belay() -> assert_cmd::Command {
    let mut c = assert_cmd::cargo::cargo_bin_cmd!("belay");
    c.env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY");
    c
}

pub fn demo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/pipeline-demo")
}

pub fn require_engine() {
    let ok = Command::new("docker")
        .args(["image", "inspect", "belay-base:bookworm"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "these tests need a running Docker engine and belay-base:bookworm (.ci/run sets both up)"
    );
}

/// The newest run directory under a state dir.
pub fn latest_run(state: &Path) -> PathBuf {
    let mut d: Vec<PathBuf> = std::fs::read_dir(state.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    d.sort();
    d.pop().unwrap()
}

/// Every log of a run, concatenated.
pub fn all_logs(run: &Path) -> String {
    std::fs::read_dir(run.join("logs"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect()
}

/// `cp -r src dest`.
pub fn copy_dir(src: &Path, dest: &Path) {
    let ok = Command::new("cp")
        .arg("-r")
        .arg(src)
        .arg(dest)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -r {} {}", src.display(), dest.display());
}

/// The ids of the containers (running or not) of belay run `run_id`.
pub fn containers_of(run_id: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=belay.run={run_id}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Install `text` as an executable at `dest`. Written by another process: a
/// write descriptor of this one, inherited by a child another test forks
/// meanwhile, would make exec fail with "text file busy".
pub fn install_script(dest: &Path, text: &str) {
    let src = dest.with_extension("src");
    std::fs::write(&src, text).unwrap();
    let ok = Command::new("install")
        .args(["-m", "0755"])
        .arg(&src)
        .arg(dest)
        .status()
        .unwrap()
        .success();
    assert!(ok, "install {}", dest.display());
}
