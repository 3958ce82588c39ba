//! Break-in attempts against `belay rounds`, the round supervisor: the real
//! Docker engine, real git, real processes and signals, the real `belay`
//! binary. The agent is a scripted program in the peer's `command` form,
//! running in its round's container like any round agent, and playing the
//! attacker there: it edits the config it runs under, or makes the stop file
//! a link or a FIFO. Each test asserts what a user would notice if the attack
//! worked: a marker file a command made on the host, a host file's canary in
//! a file of belay's, a serve that reads without bound or ignores SIGTERM.
//!
//! Each test is skipped (it returns at once, saying so) when there is no
//! Docker engine with the round agents' image, `belay-agent:bookworm`
//! (`./scripts/setup-host.sh --agents` builds it).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::install_script;
use crate::events;
use crate::git_cli::{git, init_repo};
use crate::output::show;
use crate::rounds_config::{config_head, prompt_text, wait_for};

/// The hostile agent: the prompt on stdin, what to do in `$1`, a host path
/// (or a path in the tree) in `$2`. Its working dir is the work tree,
/// mounted in its container.
const AGENT: &str = r#"#!/bin/sh
p=$(cat)
case "$1" in
  config-host)
    # The placement and a command of the agent's choosing, then wait for
    # belay's end (the test kills belay with SIGKILL meanwhile).
    if [ "$AGENT_RUNNER_ROUND_NUM" = 1 ]; then
      if sed -i -e 's/^placement = "container"/placement = "host"/' \
        -e 's#^command = .*#command = ["/bin/sh", "-c", "touch '"$2"'"]#' agent-runner.toml 2>/dev/null \
        || { printf '[agent]\nplacement = "host"\n' > agent-runner.toml; } 2>/dev/null; then
        echo edited > config-edit-result
      else
        echo refused > config-edit-result
      fi
      exec sleep 600
    fi ;;
  stop-link) ln -s "$2" STOP ;;
  stop-zero) ln -s /dev/zero STOP ;;
  stop-fifo) mkfifo STOP ;;
  submodule)
    if [ "$AGENT_RUNNER_ROUND_NUM" = 1 ]; then
      mkdir sub && cd sub && git init -q -b main && git -c user.name=a -c user.email=a@a commit -q --allow-empty -m s
      git config core.fsmonitor "touch $2; false"
      S=$(git rev-parse HEAD); cd ..
      printf '[submodule "sub"]\n\tpath = sub\n\turl = ./sub\n' > .gitmodules
      git update-index --add --cacheinfo 160000,$S,sub && git add .gitmodules
      git -c user.name=a -c user.email=a@a commit -q -m "add docs" && echo COMMITTED
    fi ;;
  prompt-link)
    if [ "$AGENT_RUNNER_ROUND_NUM" = 1 ]; then
      rm -f prompts/main.md && ln -s "$2" prompts/main.md
    else
      printf 'PROMPT-SEEN %s\n' "$p"
    fi ;;
  leak-found)
    # What it "found" (the file `$2` of the tree), printed as its answer.
    sed 's/^/BI-FOUND /' "$2" ;;
esac
echo '{"type":"result","subtype":"success"}'
"#;

/// Resident memory serve may never reach (reading `/dev/zero` passes it in
/// well under a second).
const RSS_LIMIT_KIB: u64 = 256 * 1024;

/// The engine and the round agents' image: without them the test is skipped.
fn engine() -> bool {
    let ok = Command::new("docker")
        .args(["image", "inspect", "belay-agent:bookworm"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!(
            "skipped: no Docker engine with belay-agent:bookworm (./scripts/setup-host.sh --tests builds it)"
        );
    }
    ok
}

/// A value no other test (or earlier run) uses.
fn canary() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("ROUNDS-CANARY-{:x}-{nanos:x}", std::process::id())
}

/// A child killed (SIGKILL) and reaped if the test ends while it runs.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

struct Proj {
    tmp: tempfile::TempDir,
    repo: PathBuf,
    agent: PathBuf,
}

/// A work tree with its prompt, the hostile agent beside it, and `host/`: a
/// dir of the host the agent has no business reading or writing.
fn proj() -> Proj {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(repo.join("prompts")).unwrap();
    std::fs::create_dir_all(tmp.path().join("host")).unwrap();
    std::fs::write(repo.join("README"), "demo\n").unwrap();
    std::fs::write(repo.join("prompts/main.md"), prompt_text()).unwrap();
    init_repo(&repo);
    let agent = tmp.path().join("hostile-round.sh");
    install_script(&agent, AGENT);
    Proj { tmp, repo, agent }
}

impl Proj {
    fn host(&self) -> PathBuf {
        self.tmp.path().join("host")
    }

    fn logs(&self) -> PathBuf {
        self.tmp.path().join("logs")
    }

    /// The config text: the agent doing `mode` with the host path `arg`,
    /// `runtime` added to `[runtime]`.
    fn config_text(&self, mode: &str, arg: &Path, runtime: &str) -> String {
        let agent = self.agent.display().to_string();
        let arg = arg.display().to_string();
        let head = config_head(
            &[agent.as_str(), mode, arg.as_str()],
            "container",
            &self.repo,
            &self.logs(),
        );
        format!(
            r#"{head}round_budget_s = 60
restart_delay_s = 0.2
{runtime}

[prompt]
file = "./prompts/main.md"

[monitor.host_health.disk]
warning_pct = 100
critical_pct = 100
"#
        )
    }

    /// A config outside the work tree.
    fn config(&self, mode: &str, arg: &Path, runtime: &str) -> PathBuf {
        let p = self.tmp.path().join(format!("{mode}.toml"));
        std::fs::write(&p, self.config_text(mode, arg, runtime)).unwrap();
        p
    }

    fn belay(&self, config: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_belay"));
        c.env("BELAY_STATE_HOME", self.tmp.path().join("state"))
            .env("HOME", self.tmp.path())
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .env_remove("OPENAI_API_KEY")
            .arg("rounds")
            .arg("--config")
            .arg(config)
            .args(args);
        c
    }

    /// The events so far (a line being written is left out).
    fn events(&self) -> Vec<Value> {
        events::complete(&self.logs())
    }

    fn kinds(&self, kind: &str) -> Vec<Value> {
        events::of_kind(self.events(), kind)
    }

    /// Every file under the test's dir, except the host dir, that holds
    /// `needle`: belay's state, the log dir, the registry, the work tree.
    fn files_holding(&self, needle: &str) -> Vec<PathBuf> {
        let host = self.host();
        let mut out = Vec::new();
        let mut stack = vec![self.tmp.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p.starts_with(&host) {
                    continue;
                }
                let Ok(m) = std::fs::symlink_metadata(&p) else {
                    continue;
                };
                if m.is_dir() {
                    stack.push(p);
                } else if m.is_file() {
                    let b = std::fs::read(&p).unwrap_or_default();
                    if holds(&b, needle) {
                        out.push(p);
                    }
                }
            }
        }
        out
    }
}

fn holds(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Run `c` to its end, at most `limit` (then it is killed and the test fails).
fn output_within(mut c: Command, limit: Duration) -> Output {
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Reap(child);
    let mut out = child.0.stdout.take().unwrap();
    let mut err = child.0.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let te = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < limit,
            "belay did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    }
}

/// The resident memory of `pid`, in KiB (0 once it is gone).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

fn sigterm(pid: u32) {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

/// Serve, watched until it exits: on its own, or, if it is still running 3 s
/// after its first round ended, after SIGTERM, which it must obey within 5 s.
/// Its memory stays under [`RSS_LIMIT_KIB`] throughout.
fn watch_serve(p: &Proj, config: &Path) -> ExitStatus {
    let mut c = p.belay(config, &["serve", "--max-rounds", "3"]);
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut serve = Reap(child);
    let pid = serve.0.id();
    let t0 = Instant::now();
    let mut ended: Option<Instant> = None;
    let mut termed: Option<Instant> = None;
    loop {
        if let Some(st) = serve.0.try_wait().unwrap() {
            return st;
        }
        let rss = rss_kib(pid);
        assert!(
            rss < RSS_LIMIT_KIB,
            "serve reads without bound: {rss} KiB resident"
        );
        if ended.is_none() && !p.kinds("round_end").is_empty() {
            ended = Some(Instant::now());
        }
        match (ended, termed) {
            (Some(e), None) if e.elapsed() > Duration::from_secs(3) => {
                sigterm(pid);
                termed = Some(Instant::now());
            }
            (_, Some(t)) => assert!(
                t.elapsed() < Duration::from_secs(5),
                "serve did not stop within 5 s of SIGTERM"
            ),
            _ => {}
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the first round did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Serve (at most `max_rounds`) with the agent in `mode` and, as its
/// argument, a host file holding a fresh canary, run to its end (exit 0):
/// the canary, the host file and what serve printed.
fn serve_with_host_secret(
    p: &Proj,
    mode: &str,
    runtime: &str,
    max_rounds: &str,
) -> (String, PathBuf, Output) {
    let canary = canary();
    let secret = p.host().join("secret.txt");
    std::fs::write(&secret, format!("{canary}\n")).unwrap();
    let c = p.config(mode, &secret, runtime);
    let o = output_within(
        p.belay(&c, &["serve", "--max-rounds", max_rounds]),
        Duration::from_secs(240),
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    (canary, secret, o)
}

/// The host file's `canary` is in no file of the test's dir outside `host/`
/// and not in what `o` printed.
fn assert_canary_unseen(p: &Proj, canary: &str, o: &Output) {
    let seen = p.files_holding(canary);
    assert!(seen.is_empty(), "the host file's canary is in {seen:?}");
    assert!(!holds(&o.stdout, canary) && !holds(&o.stderr, canary));
}

/// The round logs whose names start with `prefix` (`R1-`: round 1's).
fn round_logs(p: &Proj, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(p.logs().join("rounds"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect()
}

/// The finding: the agent rewrites the `agent-runner.toml` of its work tree
/// (the layout `rounds init` makes) to `placement = "host"` and a command of
/// its own, then waits; belay is killed with SIGKILL mid-round. In its
/// container the config is now read-only (the edit fails); the edit is then
/// made as a host-placed agent could, and belay killed. The next
/// `round` used to load the edited config before its recovery put the
/// original back, and ran the command on the host, as root; and the guard of
/// that round took the edited text as the original, so it stuck.
#[test]
fn a_config_the_agent_edited_before_belay_was_killed_never_runs_on_the_host() {
    if !engine() {
        return;
    }
    let p = proj();
    let marker = p.host().join("PWNED-config");
    let c = p.repo.join("agent-runner.toml");
    let text = p.config_text("config-host", &marker, "");
    std::fs::write(&c, &text).unwrap();
    git(&p.repo, &["add", "agent-runner.toml"]);
    git(&p.repo, &["commit", "-qm", "the config"]);

    let mut c1 = p.belay(&c, &["round"]);
    let child = c1
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut round = Reap(child);
    let result = p.repo.join("config-edit-result");
    wait_for(
        "the agent to try to edit the config",
        Duration::from_secs(90),
        || result.exists(),
    );
    // In its container the config is mounted read-only: the edit fails.
    assert_eq!(
        std::fs::read_to_string(&result).unwrap().trim(),
        "refused",
        "the agent could write the config in its container"
    );
    assert_eq!(std::fs::read_to_string(&c).unwrap(), text);
    // What a host-placed agent (or any writer while belay runs) can do: the
    // edit lands, and belay is killed before its round ends.
    let edited = text
        .replace("placement = \"container\"", "placement = \"host\"")
        .lines()
        .map(|l| {
            if l.starts_with("command = ") {
                format!(
                    "command = [\"/bin/sh\", \"-c\", \"touch {}\"]",
                    marker.display()
                )
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    std::fs::write(&c, &edited).unwrap();
    round.0.kill().unwrap();
    round.0.wait().unwrap();

    let o = output_within(p.belay(&c, &["round"]), Duration::from_secs(120));
    assert!(
        !marker.exists(),
        "the agent's command ran on the host: {}",
        show(&o)
    );
    assert_eq!(o.status.code(), Some(78), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        "agent-runner.toml",
        "changed since belay last trusted it",
        "placement",
        "belay rounds --config",
        "trust",
    ] {
        assert!(
            err.contains(want),
            "the refusal does not say {want:?}: {err}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&c).unwrap(),
        text,
        "the trusted config is back in place"
    );

    // The next round runs the trusted config, in a container, and its guard
    // keeps the trusted text.
    let o = output_within(p.belay(&c, &["round", "--json"]), Duration::from_secs(180));
    assert!(o.status.success(), "{}", show(&o));
    assert!(!marker.exists(), "the agent's command ran on the host");
    let starts = p.kinds("round_start");
    assert_eq!(
        starts.last().unwrap()["data"]["placement"],
        "container",
        "{starts:?}"
    );
    assert_eq!(p.kinds("round_interrupted").len(), 1);
    assert_eq!(std::fs::read_to_string(&c).unwrap(), text);
}

/// The stop file is in the work tree, so the agent can make it a link to a
/// host file. serve used to follow it and write the file's first 200
/// characters into `events.jsonl`.
#[test]
fn a_stop_file_linked_to_a_host_file_is_never_read() {
    if !engine() {
        return;
    }
    let p = proj();
    let (canary, secret, o) = serve_with_host_secret(&p, "stop-link", "stop_file = \"STOP\"", "3");
    assert!(
        std::fs::symlink_metadata(p.repo.join("STOP"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the agent made the stop file a link"
    );
    assert_canary_unseen(&p, &canary, &o);
    let refused = p.kinds("stop_file_refused");
    assert_eq!(refused.len(), 1, "{:?}", p.events());
    assert!(
        refused[0]["data"]["error"]
            .as_str()
            .unwrap()
            .contains("link"),
        "{refused:?}"
    );
    assert_eq!(
        p.kinds("round_end").len(),
        1,
        "the stop file still stopped the loop"
    );
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        format!("{canary}\n")
    );
}

/// The stop file made a link to `/dev/zero`: serve used to read it without
/// bound (its memory grew until it was killed).
#[test]
fn a_stop_file_linked_to_dev_zero_keeps_serve_bounded_and_stoppable() {
    if !engine() {
        return;
    }
    let p = proj();
    let c = p.config("stop-zero", Path::new("/dev/zero"), "stop_file = \"STOP\"");
    let st = watch_serve(&p, &c);
    assert_eq!(st.code(), Some(0), "{:?}", p.events());
    assert_eq!(p.kinds("stop_file_refused").len(), 1, "{:?}", p.events());
    let stopped = p.kinds("serve_stopped");
    assert!(
        stopped[0]["data"]["reason"]
            .as_str()
            .unwrap()
            .contains("stop file"),
        "{stopped:?}"
    );
}

/// The stop file made a FIFO: serve used to block in `open()` for good, and
/// SIGTERM did nothing.
#[test]
fn a_stop_file_made_a_fifo_never_blocks_serve() {
    if !engine() {
        return;
    }
    let p = proj();
    let c = p.config(
        "stop-fifo",
        Path::new("/nonexistent"),
        "stop_file = \"STOP\"",
    );
    let st = watch_serve(&p, &c);
    assert_eq!(st.code(), Some(0), "{:?}", p.events());
    assert_eq!(p.kinds("stop_file_refused").len(), 1, "{:?}", p.events());
    // Its locks are free: the log dir's, and the next round's.
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(p.logs().join("run.lock"))
        .unwrap();
    assert!(lock.try_lock().is_ok(), "the log dir's lock is still held");
    drop(lock);
    let o = output_within(p.belay(&c, &["status", "--json"]), Duration::from_secs(30));
    assert!(o.status.success(), "{}", show(&o));
    let s: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_ne!(s["state"], "running", "{s}");
}

/// Held before, held still: the agent links its prompt to a host file. The
/// guard puts the prompt back after the round, and a prompt in the tree is
/// never read through a link: the next round's prompt is the user's, and
/// the host file is in no file of belay's.
#[test]
fn a_prompt_linked_to_a_host_file_never_carries_it() {
    if !engine() {
        return;
    }
    let p = proj();
    let (canary, _secret, o) = serve_with_host_secret(&p, "prompt-link", "", "2");
    assert_canary_unseen(&p, &canary, &o);
    // The prompt is mounted read-only in the agent's container, so the swap
    // fails there; had it landed (a host-placed agent), the trusted copy
    // would be put back and recorded.
    let restored = p.kinds("control_file_restored");
    assert!(
        restored.is_empty()
            || restored
                .iter()
                .any(|e| e["data"]["paths"] == serde_json::json!(["prompts/main.md"])),
        "{restored:?}"
    );
    let prompt = p.repo.join("prompts/main.md");
    assert!(std::fs::symlink_metadata(&prompt).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(&prompt).unwrap(), prompt_text());
    // Round 2 got the user's prompt (so the canary could have shown there).
    let r2 = round_logs(&p, "R2-");
    assert_eq!(r2.len(), 1, "{r2:?}");
    let log = std::fs::read_to_string(&r2[0]).unwrap();
    assert!(
        log.contains("PROMPT-SEEN") && log.contains("Work on the project"),
        "{log}"
    );
}

/// Trust-boundary finding 3, in rounds: belay runs with the host's proxy (a
/// password in `HTTPS_PROXY`, which nothing uses) and a secret-looking
/// variable in its environment, and the round's agent prints both values (from
/// a file the test left in the tree, ignored by git, as if it had dug them up)
/// on its stdout, which is also its final answer. Neither value may reach the
/// round's log, the events, the state, anything else under the log dir or
/// belay's state home, a commit, or the terminal: the log shows
/// `[REDACTED:…]` where a user would otherwise read the proxy password.
#[test]
fn the_host_proxy_password_stays_out_of_every_rounds_record() {
    if !engine() {
        return;
    }
    let p = proj();
    let pw = format!("bi-proxy-pw-{}", crate::unique("r"));
    let token = format!("bi-api-token-{}", crate::unique("r"));
    let proxy = format!("http://bi-user:{pw}@127.0.0.1:9/");
    // What the agent "finds": in the tree, never committed or stashed.
    let found = p.repo.join("bi-found.txt");
    std::fs::write(&found, format!("proxy-password {pw}\napi-token {token}\n")).unwrap();
    std::fs::create_dir_all(p.repo.join(".git/info")).unwrap();
    std::fs::write(p.repo.join(".git/info/exclude"), "bi-found.txt\n").unwrap();
    let c = p.config("leak-found", Path::new("bi-found.txt"), "");
    let mut cmd = p.belay(&c, &["round", "--json"]);
    cmd.envs([
        ("HTTPS_PROXY", proxy.as_str()),
        ("https_proxy", proxy.as_str()),
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("no_proxy", "127.0.0.1,localhost"),
        ("BELAY_BI_API_TOKEN", token.as_str()),
    ]);
    let o = output_within(cmd, Duration::from_secs(180));
    assert!(o.status.success(), "{}", show(&o));
    // The agent ran and printed what it found; the log has it redacted.
    let r1 = round_logs(&p, "R1-");
    assert_eq!(r1.len(), 1, "{r1:?}");
    let log = std::fs::read_to_string(&r1[0]).unwrap();
    assert!(
        log.contains("BI-FOUND proxy-password") && log.contains("BI-FOUND api-token"),
        "the agent did not print what it found: {log}"
    );
    assert!(
        log.contains("[REDACTED:"),
        "the round saw no host secret to redact: {log}"
    );
    let history = git(&p.repo, &["log", "-p", "--all", "--text"]);
    for secret in [&pw, &token] {
        for n in crate::escaped_forms(secret) {
            // The log dir, the state home, HOME: every file of the test's
            // dir but the one the agent read.
            let seen: Vec<PathBuf> = p
                .files_holding(&n)
                .into_iter()
                .filter(|f| *f != found)
                .collect();
            assert!(seen.is_empty(), "{n:?} is in {seen:?}");
            assert!(!history.contains(&n), "{n:?} is in git log -p --all");
            assert!(
                !holds(&o.stdout, &n) && !holds(&o.stderr, &n),
                "{n:?} on the terminal: {}",
                show(&o)
            );
        }
    }
}

/// Fresh-eyes round: the agent (round agents may commit) commits a
/// submodule, a gitlink and `.gitmodules`, whose repository, left at its
/// path, sets `core.fsmonitor`. The tree is clean, so nothing is stashed;
/// the user's plain `git status` in the outer repository used to run the
/// fsmonitor on the host, as root. The repository is now moved aside after
/// the round (`repository_quarantined`).
#[test]
fn a_committed_submodules_repository_never_runs_on_the_users_git_status() {
    if !engine() {
        return;
    }
    let p = proj();
    let marker = p.host().join("PWNED-fsmonitor");
    let c = p.config("submodule", &marker, "");
    let o = output_within(p.belay(&c, &["round"]), Duration::from_secs(180));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        git(&p.repo, &["log", "--format=%s"]).contains("add docs"),
        "the agent did not commit the submodule"
    );
    let q = p.kinds("repository_quarantined");
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(!p.repo.join("sub/.git").exists());
    assert!(p.repo.join("sub/.git.belay-quarantined").exists());
    // The user's own git, in the outer tree.
    git(&p.repo, &["status", "--short"]);
    assert!(!marker.exists(), "the agent's fsmonitor ran on the host");
}
