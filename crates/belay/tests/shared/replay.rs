//! Shared by the integration tests: `belay model replay` as a process, and a
//! search of written files for a canary.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn belay_path() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_belay"))
}

/// `belay model replay` as a process, for the duration of a test.
pub struct Replay {
    child: std::process::Child,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub log: PathBuf,
}

impl Replay {
    pub fn start(dir: &Path, script: &str) -> Replay {
        use std::io::BufRead;
        let script_path = dir.join("replay.yaml");
        std::fs::write(&script_path, script).unwrap();
        let log = dir.join("replay-requests.jsonl");
        let mut child = Command::new(belay_path())
            .args(["model", "replay", "--port", "0", "--script"])
            .arg(&script_path)
            .arg("--log")
            .arg(&log)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let mut first = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut first).unwrap();
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {first:?}"))
            .to_string();
        Replay {
            child,
            _stdout: stdout,
            url,
            log,
        }
    }

    pub fn openai_base(&self) -> String {
        format!("{}/v1", self.url)
    }

    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .map(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
            {
                hits.push(p);
            }
        }
    }
    hits
}
