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

    /// The requests so far, from the `from`th, as one text.
    #[allow(dead_code)]
    pub fn seen_since(&self, from: usize) -> String {
        self.requests()
            .iter()
            .skip(from)
            .map(|r| r.to_string())
            .collect()
    }

    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A script under which codex, asked with a prompt holding `asked`, runs
/// `cmd` once, and answers `answer` once the command's output (holding
/// `until`) comes back.
#[allow(dead_code)]
pub fn exec_once(cmd: &str, asked: &str, until: &str, answer: &str) -> String {
    format!(
        "turns:\n  - name: done\n    match: {{api: responses, contains: {until:?}}}\n    reply: {{text: {answer:?}}}\n    repeat: true\n  - name: ask\n    match: {{api: responses, contains: {asked:?}}}\n    reply:\n      tool_calls:\n        - name: exec_command\n          arguments: {{cmd: {cmd:?}}}\n    repeat: true\n"
    )
}

/// `belay agent run --agent SPEC` (a real CLI) with `prompt` on `repo`
/// against `server`, its registry under `state`, `extra` arguments after:
/// whether it passed, and what it printed.
#[allow(dead_code)]
pub fn scripted_agent(
    server: &Replay,
    state: &Path,
    repo: &Path,
    spec: &str,
    prompt: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (bool, String) {
    let o = Command::new(belay_path())
        .env("BELAY_STATE_HOME", state.join("registry"))
        .env("OPENAI_API_KEY", "sk-test-scripted-agent-00000000")
        .env("ANTHROPIC_API_KEY", "sk-ant-test-scripted-agent-000")
        .env("GEMINI_API_KEY", "gk-test-scripted-agent-000000000")
        .envs(env.iter().copied())
        .args([
            "agent", "run", "--agent", spec, "--prompt", prompt, "--repo",
        ])
        .arg(repo)
        .args(["--openai-base-url", &server.url])
        .args(extra)
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), out)
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
