//! Break-in attempts against `belay run`, each a real attack from inside a
//! pipeline step: real Docker engine, real git, `belay model replay` as the
//! model. Every test plays the attacker (a step, a background process, a
//! scripted agent) and asserts what a user would notice if it worked: a file
//! changed outside the workspace, a command run on the host, a secret in a
//! log, a record, the history or a model request, a step reaching the host.
//!
//! The workspace is a fresh git repository made from
//! `examples/pipeline-demo/repo` for every test; `@TMP@` and `@REPO@` in the
//! pipeline, the script and the extra files stand for the test's tempdir and
//! the repository (the same paths on the host; not visible in containers).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../shared/git.rs"]
mod git_cli;
#[path = "../shared/replay.rs"]
mod replay;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../shared/pipeline.rs"]
#[allow(dead_code)]
mod common;
#[path = "../shared/events.rs"]
#[allow(dead_code)]
mod events;
#[path = "../shared/queue.rs"]
#[allow(dead_code)]
mod job_queue;
#[path = "../shared/output.rs"]
#[allow(dead_code)]
mod output;
#[path = "../shared/plan.rs"]
#[allow(dead_code)]
mod plan_ws;
#[path = "../shared/rounds.rs"]
#[allow(dead_code)]
mod rounds_config;

// The other modes' break-ins (docs/sandbox.md lists every attack).
mod jobs;
mod plan;
mod rounds;
mod ui;
use common::{all_logs, belay, copy_dir, demo, latest_run, require_engine, DEMO_URL};
use git_cli::{git, init_repo};
use replay::{files_containing, Replay};
use serde_json::Value;

const NO_MODEL: &str = "turns: []\n";

/// A value no other test (or earlier run) uses.
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{:x}{nanos:x}{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Standard base64 with padding.
fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A string as a JSON (and so YAML flow) scalar, quotes included.
fn json(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// `s`, JSON-escaped once and twice (the quotes left off): how it shows
/// inside a JSON record, and inside a JSON string inside one.
fn escaped_forms(s: &str) -> Vec<String> {
    let once = json(s);
    let once = once[1..once.len() - 1].to_string();
    let twice = json(&once);
    let twice = twice[1..twice.len() - 1].to_string();
    let mut v = vec![s.to_string(), once, twice];
    v.dedup();
    v
}

/// A PEM-like multi-line value: its text and its four 64-char body lines.
fn pem_value(seed: &str) -> (String, Vec<String>) {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut x: u64 = seed.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let lines: Vec<String> = (0..4)
        .map(|_| {
            (0..64)
                .map(|_| {
                    x = x
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    A[(x >> 58) as usize] as char
                })
                .collect()
        })
        .collect();
    let text = format!(
        "-----BEGIN TEST KEY-----\n{}\n-----END TEST KEY-----",
        lines.join("\n")
    );
    (text, lines)
}

/// Every path under `dir`, symlinks listed and never followed.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let is_dir = std::fs::symlink_metadata(&p)
                .map(|m| m.is_dir())
                .unwrap_or(false);
            if is_dir {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// Contents of every file under `dir` (a symlink as its target), except what
/// `skip` names.
fn snapshot(dir: &Path, skip: &dyn Fn(&Path) -> bool) -> BTreeMap<PathBuf, Vec<u8>> {
    walk(dir)
        .into_iter()
        .filter(|p| !skip(p))
        .filter_map(|p| {
            let md = std::fs::symlink_metadata(&p).ok()?;
            let bytes = if md.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p).ok()?.display()).into_bytes()
            } else if md.is_file() {
                std::fs::read(&p).unwrap_or_default()
            } else {
                return None;
            };
            Some((p, bytes))
        })
        .collect()
}

/// The paths that differ between two snapshots.
fn changed(a: &BTreeMap<PathBuf, Vec<u8>>, b: &BTreeMap<PathBuf, Vec<u8>>) -> Vec<PathBuf> {
    a.keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn contains_bytes(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// An event's field, at the top of the event or under `data`.
fn field<'a>(e: &'a Value, k: &str) -> &'a Value {
    if e[k].is_null() {
        &e["data"][k]
    } else {
        &e[k]
    }
}

/// The host's IPv4 addresses other than loopback.
fn host_ipv4s() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut ips: Vec<String> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|t| *t == "inet")?;
            Some(w.next()?.split('/').next()?.to_string())
        })
        .collect();
    if ips.is_empty() {
        let o = Command::new("hostname").arg("-I").output().unwrap();
        ips = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .filter(|a| a.contains('.'))
            .map(str::to_string)
            .collect();
    }
    ips.retain(|a| !a.starts_with("127."));
    ips
}

struct Ws {
    tmp: tempfile::TempDir,
    repo: PathBuf,
    state: PathBuf,
    replay: Replay,
}

/// A workspace from the demo repo with `pipeline` as pipeline.yaml and
/// `files` added, committed; the replay server on `script`. `@TMP@` and
/// `@REPO@` are replaced everywhere, the demo model URL in the pipeline.
fn workspace(script: &str, pipeline: &str, files: &[(&str, &str)]) -> Ws {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("ws");
    copy_dir(&demo().join("repo"), &repo);
    let subst = |s: &str| {
        s.replace("@TMP@", &tmp.path().display().to_string())
            .replace("@REPO@", &repo.display().to_string())
    };
    let replay = Replay::start(tmp.path(), &subst(script));
    std::fs::write(
        repo.join("pipeline.yaml"),
        subst(pipeline).replace(DEMO_URL, &replay.openai_base()),
    )
    .unwrap();
    for (p, text) in files {
        let p = repo.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, subst(text)).unwrap();
    }
    init_repo(&repo);
    let state = tmp.path().join("state");
    Ws {
        tmp,
        repo,
        state,
        replay,
    }
}

impl Ws {
    fn dir(&self) -> &Path {
        self.tmp.path()
    }

    fn run(&self, env: &[(&str, &str)], extra: &[&str], secs: u64) -> assert_cmd::assert::Assert {
        let mut c = belay();
        c.arg("run")
            .arg(self.repo.join("pipeline.yaml"))
            .arg("--state-dir")
            .arg(&self.state)
            .args(extra);
        for (k, v) in env {
            c.env(k, v);
        }
        c.timeout(Duration::from_secs(secs)).assert()
    }

    fn run_dir(&self) -> PathBuf {
        latest_run(&self.state)
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.run_dir().join("events.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn events_of(&self, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["kind"] == kind)
            .collect()
    }

    fn state_json(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.run_dir().join("state.json")).unwrap()).unwrap()
    }

    /// The logs of one step (`NNNN-<step>-*.log`).
    fn step_logs(&self, step: &str) -> Vec<PathBuf> {
        let pat = format!("-{step}-");
        std::fs::read_dir(self.run_dir().join("logs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().contains(&pat))
            .collect()
    }

    fn step_log(&self, step: &str) -> String {
        self.step_logs(step)
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    }

    fn head(&self) -> String {
        git(&self.repo, &["rev-parse", "HEAD"])
    }

    /// `git log -p --all`, binary files as text.
    fn history(&self) -> String {
        git(&self.repo, &["log", "-p", "--all", "--text"])
    }

    /// Every object in the repository, reachable or not.
    fn all_objects(&self) -> Vec<u8> {
        let out = Command::new("git")
            .args(["cat-file", "--batch-all-objects", "--batch"])
            .current_dir(&self.repo)
            .output()
            .unwrap();
        assert!(out.status.success());
        out.stdout
    }

    fn replay_log(&self) -> String {
        std::fs::read_to_string(&self.replay.log).unwrap_or_default()
    }

    /// Files under the state dir holding `needle`.
    fn state_hits(&self, needle: &str) -> Vec<PathBuf> {
        if self.state.exists() {
            files_containing(&self.state, needle)
        } else {
            vec![]
        }
    }

    /// Everywhere `needle` shows: the state dir, the repository's files, the
    /// history, the model requests.
    fn sightings(&self, needle: &str) -> Vec<String> {
        let mut hits: Vec<String> = self
            .state_hits(needle)
            .into_iter()
            .chain(files_containing(&self.repo, needle))
            .map(|p| p.display().to_string())
            .collect();
        if self.history().contains(needle) {
            hits.push("git log -p --all".into());
        }
        if self.replay_log().contains(needle) {
            hits.push("the replay request log".into());
        }
        hits
    }

    /// A `commit_refused` event whose reason holds every one of `needles`.
    fn assert_refused(&self, needles: &[&str]) {
        let refused = self.events_of("commit_refused");
        assert!(
            refused.iter().any(|e| {
                let r = field(e, "reason").as_str().unwrap_or("");
                needles.iter().all(|n| r.contains(n))
            }),
            "no commit_refused event naming {needles:?}: {refused:?}"
        );
    }

    /// Host-side `git status` (the moment an fsmonitor planted in the repo
    /// would run).
    fn host_git_status(&self) {
        git(&self.repo, &["status", "--porcelain"]);
    }
}

const LLM: &str = "llm:\n  model: replay-model\n  base_url: http://127.0.0.1:18765/v1\n  api: chat-completions\nagents_dir: agents\n";

/// Finding 1. A step plants `vendor/lib/.git` (a copy of the workspace's own
/// repository) whose config sets `core.fsmonitor`: the commit refuses the
/// embedded repository, and no host-side git ever runs the hook.
#[test]
fn an_embedded_repository_is_refused_and_its_fsmonitor_never_runs_on_the_host() {
    let pipeline = r#"name: bi-embedded
deps_policy: open
steps:
  - name: plant
    command: |
      mkdir -p vendor/lib/.git
      cp -r .git/HEAD .git/refs .git/objects vendor/lib/.git/
      printf '[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = touch @TMP@/fsmonitor-ran\n' > vendor/lib/.git/config
      echo lib > vendor/lib/lib.txt
      echo planted
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let marker = ws.dir().join("fsmonitor-ran");
    let base = ws.head();
    ws.run(&[], &[], 120).code(1);
    assert!(ws.step_log("plant").contains("planted"));
    ws.assert_refused(&["embedded git repository", "vendor/lib"]);
    assert_eq!(ws.head(), base, "something was committed");
    assert!(!marker.exists(), "the planted fsmonitor ran during the run");
    ws.host_git_status();
    assert!(
        !marker.exists(),
        "a host `git status` ran the planted fsmonitor"
    );
    let anywhere: Vec<PathBuf> = walk(ws.dir())
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "fsmonitor-ran"))
        .collect();
    assert!(anywhere.is_empty(), "{anywhere:?}");
}

/// Finding 2. A background process swaps `x` (a directory) with `xl` (a
/// symlink to the host's `.git`) in a tight loop while the built-in agent's
/// `write_file` writes `x/config` 40 times with an fsmonitor in it.
#[test]
fn write_file_racing_a_symlink_swap_never_reaches_the_host_git_dir() {
    let racer = r#"mkdir -p x && ln -sfn @REPO@/.git xl && (setsid nohup perl -e 'my ($p, $q) = ("x", "xl"); while (1) { syscall(316, -100, $p, -100, $q, 2) }' >/dev/null 2>&1 &) && sleep 0.3 && echo racer-started"#;
    let mut script = format!(
        "turns:\n  - name: racer\n    reply:\n      tool_calls: [{{name: terminal, arguments: {{command: {}}}}}]\n",
        json(racer)
    );
    for i in 0..40 {
        let content = format!("[core]\n\tfsmonitor = touch @TMP@/race-marker\n# write {i}\n");
        script.push_str(&format!(
            "  - name: write-{i}\n    reply:\n      tool_calls: [{{name: write_file, arguments: {{path: x/config, content: {}}}}}]\n",
            json(&content)
        ));
    }
    script.push_str(
        "  - name: done\n    reply:\n      tool_calls: [{name: finish, arguments: {summary: done}}]\n",
    );
    let pipeline = format!(
        "name: bi-race\n{LLM}deps_policy: open\nsteps:\n  - name: dev\n    agent: dev\n    max_iterations: 60\n    mounts: {{workspace: rw}}\n"
    );
    let ws = workspace(&script, &pipeline, &[]);
    let marker = ws.dir().join("race-marker");
    let config = std::fs::read(ws.repo.join(".git/config")).unwrap();
    let (repo, state, log) = (ws.repo.clone(), ws.state.clone(), ws.replay.log.clone());
    let worktree = move |p: &Path| {
        p.starts_with(&state)
            || p == log
            || p == repo.join(".git/index")
            || p == repo.join(".git/index.lock")
            || (p.starts_with(&repo) && !p.starts_with(repo.join(".git")))
    };
    let before = snapshot(ws.dir(), &worktree);
    ws.run(&[], &[], 300);
    let run = ws.run_dir();
    let said = all_logs(&run) + &std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert!(said.contains("racer-started"), "the racer never started");
    assert!(
        ws.replay.requests().len() >= 30,
        "the agent did not make the writes"
    );
    assert_eq!(
        std::fs::read(ws.repo.join(".git/config")).unwrap(),
        config,
        "the host's .git/config changed"
    );
    assert!(!marker.exists(), "the planted fsmonitor ran during the run");
    ws.host_git_status();
    assert!(
        !marker.exists(),
        "a host `git status` ran the planted fsmonitor"
    );
    let diff = changed(&before, &snapshot(ws.dir(), &worktree));
    assert!(
        diff.is_empty(),
        "files outside the workspace changed: {diff:?}"
    );
}

/// Finding 3. A step's `produces` file holds a secret, so belay rewrites it
/// host-side; a racer disguised as the container's own `sleep infinity` (so
/// that a sweep by name spares it) swaps `out` with a symlink to a host
/// directory outside the workspace meanwhile. The scrub is repeated 25 times
/// (a retry loop), which the old code lost within a run.
#[test]
fn produces_scrubbing_racing_a_symlink_swap_never_writes_outside() {
    let canary = unique("bi-scrub-canary");
    let pipeline = r#"name: bi-scrub-race
deps_policy: open
max_attempts: 25
secrets:
  tok: {from: env, key: BELAY_BI_TOKEN}
steps:
  - name: write
    secrets: [tok]
    produces: out/summary.md
    command: |
      rm -rf out; mkdir -p out
      { head -c 3000000 /dev/zero | tr '\0' x; printf '\ntoken %s\n' "$BELAY_BI_TOKEN"; } > out/summary.md
      ln -sfn @TMP@/outside outl
      [ -f .racer.pid ] && kill -9 "$(cat .racer.pid)" 2>/dev/null
      printf '%s\n' 'echo $$ > /workspace/repo/.racer.pid; exec perl -e '"'"'my ($p, $q) = ("/workspace/repo/out", "/workspace/repo/outl"); while (1) { syscall(316, -100, $p, -100, $q, 2) }'"'" > /tmp/infinity
      (cd /tmp && setsid nohup bash -c 'exec -a sleep bash infinity' >/dev/null 2>&1 &)
      sleep 0.2
      echo racing
  - name: again
    command: |
      n=$(( $(cat .rounds 2>/dev/null || echo 0) + 1 )); echo $n > .rounds; echo "round $n"; [ $n -ge 25 ]
    on_fail: { goto: write, retry: true }
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let outside = ws.dir().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let run = ws.run(&[("BELAY_BI_TOKEN", canary.as_str())], &[], 300);
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&run.get_output().stdout),
        String::from_utf8_lossy(&run.get_output().stderr)
    );
    assert!(ws.step_log("write").contains("racing"), "{said}");
    let written = walk(&outside);
    assert!(
        written.is_empty(),
        "belay wrote outside the workspace: {written:?}"
    );
    assert!(ws.state_hits(&canary).is_empty());
    let rounds: u32 = std::fs::read_to_string(ws.repo.join(".rounds"))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(rounds >= 20, "the loop ran {rounds} rounds:\n{said}");
    // Each round, the racer either lost (the file was scrubbed) or won at
    // that moment (the path was a link: refused, never followed).
    let scrubbed = ws.events_of("artifact_scrubbed").len();
    let refused = ws.events_of("artifact_unreachable").len();
    assert!(
        scrubbed + refused >= 20 && scrubbed >= 5,
        "belay scrubbed {scrubbed} times and refused {refused} times"
    );
}

/// Finding 4. Step `plant` leaves a process disguised as the container's own
/// `sleep infinity` (argv `sleep infinity`, reparented to PID 1), which
/// reads every process's environment; the next step holds a secret.
#[test]
fn a_disguised_leftover_process_cannot_steal_a_later_steps_secret() {
    let canary = unique("bi-steal-canary");
    let pipeline = r#"name: bi-steal
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BI_TOKEN}
steps:
  - name: plant
    command: |
      printf '%s\n' 'while :; do for f in /proc/[0-9]*/environ; do tr "\0" "\n" < $f 2>/dev/null | grep BELAY_BI_TOKEN= | base64 -w0 >> /workspace/repo/stolen.txt; done; sleep 0.1; done' > /tmp/infinity
      (cd /tmp && setsid nohup bash -c 'exec -a sleep bash infinity' >/dev/null 2>&1 &)
      sleep 0.5
      echo planted
  - name: use
    secrets: [tok]
    command: sleep 2; echo used
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(&[("BELAY_BI_TOKEN", canary.as_str())], &[], 120);
    assert!(ws.step_log("plant").contains("planted"));
    assert!(
        ws.step_log("use").contains("used"),
        "the secret step never ran"
    );
    let stolen = std::fs::read_to_string(ws.repo.join("stolen.txt")).unwrap_or_default();
    for needle in [
        canary.clone(),
        b64(canary.as_bytes()),
        b64(format!("{canary}\n").as_bytes()),
        b64(format!("BELAY_BI_TOKEN={canary}\n").as_bytes()),
    ] {
        assert!(
            !stolen.contains(&needle),
            "stolen.txt holds the secret: {stolen}"
        );
        let seen = ws.sightings(&needle);
        assert!(seen.is_empty(), "{needle}: {seen:?}");
    }
}

/// Finding 5. A step with a secret leaves it in `~/.netrc`, `/tmp` and
/// `/dev/shm`; the next step, in the same kind of container, reads them.
#[test]
fn secrets_left_in_home_tmp_or_shm_do_not_reach_the_next_step() {
    let canary = unique("bi-home-canary");
    let pipeline = r#"name: bi-home
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BI_TOKEN}
steps:
  - name: a
    secrets: [tok]
    command: |
      echo "machine x login u password $BELAY_BI_TOKEN" > ~/.netrc
      echo "machine x login u password $BELAY_BI_TOKEN" > /tmp/leak
      echo "machine x login u password $BELAY_BI_TOKEN" > /dev/shm/leak
      echo left
  - name: b
    command: |
      cat ~/.netrc /tmp/leak /dev/shm/leak > got.txt 2>&1; true
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(&[("BELAY_BI_TOKEN", canary.as_str())], &[], 120);
    assert!(ws.step_log("a").contains("left"));
    let got = std::fs::read_to_string(ws.repo.join("got.txt")).expect("step b did not run");
    assert!(!got.contains(&canary), "step b read step a's secret: {got}");
    let seen = ws.sightings(&canary);
    assert!(seen.is_empty(), "{seen:?}");
}

/// Finding 6. A secret split over stdout and stderr, one straddling the
/// 64 KiB flush, and a multi-line secret printed line by line: none reaches a
/// log in the clear.
#[test]
fn split_straddling_and_multiline_secrets_are_redacted_in_logs() {
    let canary = unique("bi-logs-canary");
    let (pem, body) = pem_value(&canary);
    let pipeline = r#"name: bi-logs
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BI_TOKEN}
  pem: {from: env, key: BELAY_BI_PEM}
steps:
  - name: halves
    secrets: [tok]
    command: |
      printf %s "${BELAY_BI_TOKEN:0:6}"; printf %s "${BELAY_BI_TOKEN:6}" >&2
  - name: straddle
    secrets: [tok]
    command: |
      head -c 65530 /dev/zero | tr '\0' a; printf %s "$BELAY_BI_TOKEN"
  - name: lines
    secrets: [pem]
    command: |
      printf '%s\n' "$BELAY_BI_PEM" | while IFS= read -r l; do echo "line: $l"; done
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(
        &[
            ("BELAY_BI_TOKEN", canary.as_str()),
            ("BELAY_BI_PEM", pem.as_str()),
        ],
        &[],
        120,
    )
    .success();
    let hits = ws.state_hits(&canary);
    assert!(hits.is_empty(), "the token in the clear: {hits:?}");
    for line in &body {
        let hits = ws.state_hits(line);
        assert!(hits.is_empty(), "a PEM line in the clear: {hits:?}");
    }
    let logs = all_logs(&ws.run_dir());
    assert!(logs.contains("[REDACTED:"), "nothing was redacted");
    assert!(ws.step_log("lines").contains("line: "));
    assert!(ws.step_log("straddle").contains("aaaa"));
}

/// Finding 7. A multi-line secret written to a file and committed: the
/// commit refuses, and no object in the repository keeps it.
#[test]
fn a_committed_multiline_secret_is_refused_and_leaves_no_object() {
    let seed = unique("bi-pem");
    let (pem, body) = pem_value(&seed);
    let pipeline = r#"name: bi-pem
deps_policy: open
secrets:
  bi-key: {from: env, key: BELAY_BI_PEM}
steps:
  - name: write
    secrets: [bi-key]
    command: |
      printf '%s\n' "$BELAY_BI_PEM" > key.pem
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let base = ws.head();
    ws.run(&[("BELAY_BI_PEM", pem.as_str())], &[], 120).code(1);
    assert!(
        ws.repo.join("key.pem").exists(),
        "the step did not write the key"
    );
    ws.assert_refused(&["secret", "bi-key"]);
    assert_eq!(ws.head(), base, "something was committed");
    let history = ws.history();
    let objects = ws.all_objects();
    for line in &body {
        assert!(
            !history.contains(line.as_str()),
            "the key is in the history"
        );
        assert!(
            !contains_bytes(&objects, line),
            "an object in the repository holds the key"
        );
        assert!(ws.state_hits(line).is_empty());
    }
}

/// Finding 8. A secret with a quote, a backslash and a newline, read by the
/// built-in agent from a file: not in any record, not sent to the model, in
/// no escaping.
#[test]
fn a_quoted_multiline_secret_stays_out_of_events_and_model_requests() {
    let tag = unique("4c1d");
    let canary = format!("bi-canary-\"quoted\"\\back-{tag}\nsecond-line-4c1d-{tag}");
    let script = r#"turns:
  - name: read
    reply:
      tool_calls: [{name: read_file, arguments: {path: notes.txt}}]
  - name: done
    reply:
      tool_calls: [{name: finish, arguments: {summary: "read the notes"}}]
"#;
    let pipeline = format!(
        "name: bi-events\n{LLM}deps_policy: open\nsecrets:\n  tok: {{from: env, key: BELAY_BI_TOKEN}}\nsteps:\n  - name: seed\n    secrets: [tok]\n    command: |\n      printf '%s' \"$BELAY_BI_TOKEN\" > notes.txt\n  - name: dev\n    agent: dev\n    max_iterations: 6\n"
    );
    let ws = workspace(script, &pipeline, &[]);
    ws.run(&[("BELAY_BI_TOKEN", canary.as_str())], &[], 180);
    assert_eq!(
        std::fs::read_to_string(ws.repo.join("notes.txt")).unwrap(),
        canary,
        "the seed step did not write the secret"
    );
    assert!(
        ws.replay.requests().len() >= 2,
        "the read_file result never went back to the model"
    );
    let mut needles = escaped_forms(&canary);
    needles.extend(escaped_forms(&format!("back-{tag}\nsecond-line-4c1d")));
    needles.push(format!("second-line-4c1d-{tag}"));
    let requests = ws.replay_log();
    for n in &needles {
        let hits = ws.state_hits(n);
        assert!(hits.is_empty(), "{n:?} in {hits:?}");
        assert!(!requests.contains(n.as_str()), "{n:?} sent to the model");
    }
    let events = std::fs::read_to_string(ws.run_dir().join("events.jsonl")).unwrap();
    assert!(events.contains("[REDACTED:"), "nothing was redacted");
}

/// Probes, from a networked step, every address of the host on a port that
/// a listener of this test holds on all addresses; the step's log and how
/// many connections the listener accepted. `header` is the pipeline up to
/// its steps (it decides the step's network).
fn probe_host_ports(name: &str, header: &str) -> (String, usize) {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = {
        let (stop, accepted) = (stop.clone(), accepted.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok(_) => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
    };
    let probe = r#"port=@PORT@
ips="@HOSTIPS@ 172.17.0.1"
while read -r iface dest gw rest; do
  [ "$iface" = Iface ] && continue
  h=$gw; [ "$dest" != 00000000 ] && h=$dest
  [ "$h" = 00000000 ] && continue
  a=$((16#${h:6:2})); b=$((16#${h:4:2})); c=$((16#${h:2:2})); d=$((16#${h:0:2}))
  if [ "$dest" = 00000000 ]; then ips="$ips $a.$b.$c.$d"; else ips="$ips $a.$b.$c.$((d + 1))"; fi
done < /proc/net/route
p=${HTTP_PROXY#http://}; p=${p%/}; ph=${p%:*}; pp=${p##*:}
seen=" "
for ip in $ips $ph; do
  case "$seen" in *" $ip "*) continue;; esac
  seen="$seen$ip "
  if timeout 5 bash -c "exec 3<>/dev/tcp/$ip/$port" 2>/dev/null; then echo "reached $ip"; else echo "blocked $ip"; fi
done
( exec 4<>/dev/tcp/$ph/$pp; printf 'CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n' >&4; IFS= read -r -t 10 status <&4; echo "connect-status: $status" )
true
"#
    .replace("@PORT@", &port.to_string())
    .replace("@HOSTIPS@", &host_ipv4s().join(" "));
    let indented: String = probe.lines().map(|l| format!("      {l}\n")).collect();
    let pipeline = format!(
        "name: {name}\n{header}steps:\n  - name: probe\n    network: true\n    timeout: 120\n    command: |\n{indented}"
    );
    let ws = workspace(NO_MODEL, &pipeline, &[]);
    ws.run(&[], &[], 180);
    stop.store(true, Ordering::SeqCst);
    counter.join().unwrap();
    (ws.step_log("probe"), accepted.load(Ordering::SeqCst))
}

/// Finding 9. A networked step behind the egress proxy tries every host
/// address (the test's listener on 0.0.0.0), the default bridge, its own
/// gateways and the proxy's address; and a CONNECT to port 22.
#[test]
fn a_networked_step_reaches_no_host_port_beyond_the_egress_proxy() {
    let (log, accepted) = probe_host_ports(
        "bi-net",
        "deps_policy: open\negress: {presets: [package-registries]}\n",
    );
    assert!(
        log.contains("blocked 172.17.0.1"),
        "the probe did not run: {log}"
    );
    assert_eq!(accepted, 0, "a step connected to a port on the host: {log}");
    assert!(!log.contains("reached "), "{log}");
    let status = log
        .lines()
        .find(|l| l.starts_with("connect-status:"))
        .unwrap_or_else(|| panic!("no CONNECT answer: {log}"));
    assert!(status.contains("HTTP/1."), "{status}");
    assert!(
        !status.contains("200"),
        "the proxy tunnelled to port 22: {status}"
    );
}

/// The same probe from a `network: true` step without egress presets: it
/// gets the internet (the apt mirror answers), but not the host's services.
#[test]
fn an_open_network_step_reaches_the_internet_but_not_the_host() {
    let (log, accepted) = probe_host_ports("bi-open", "deps_policy: open\n");
    assert!(
        log.contains("blocked 172.17.0.1"),
        "the probe did not run: {log}"
    );
    assert_eq!(accepted, 0, "a step connected to a port on the host: {log}");
    assert!(!log.contains("reached "), "{log}");
    let mirror = r#"host=$(grep -hoE 'https?://[^/ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -1 | sed 's#.*://##'); timeout 15 bash -c "exec 3<>/dev/tcp/$host/80 && printf 'HEAD / HTTP/1.0\r\nHost: $host\r\n\r\n' >&3 && head -1 <&3""#;
    let pipeline = format!(
        "name: bi-open-mirror\ndeps_policy: open\nsteps:\n  - name: online\n    network: true\n    command: {}\n",
        json(mirror)
    );
    let ws = workspace(NO_MODEL, &pipeline, &[]);
    ws.run(&[], &[], 120).success();
    assert!(
        ws.step_log("online").contains("HTTP/1."),
        "{}",
        ws.step_log("online")
    );
}

/// Finding 10. A step loosens the committed seccomp profile; a later step
/// needs a new container, which must not get the loosened profile.
#[test]
fn a_seccomp_profile_changed_by_a_step_stops_the_run() {
    let profile = r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["acct"],"action":"SCMP_ACT_ERRNO"}]}"#;
    let pipeline = r#"name: bi-seccomp
deps_policy: open
isolation: {seccomp_profile: seccomp.json}
steps:
  - name: loosen
    command: |
      printf '%s' '{"defaultAction":"SCMP_ACT_ALLOW"}' > seccomp.json
  - name: online
    network: true
    command: echo online
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[("seccomp.json", profile)]);
    let base = ws.head();
    let out = ws.run(&[], &[], 180);
    let o = out.get_output();
    assert_ne!(o.status.code(), Some(0), "the run succeeded");
    let mut said =
        String::from_utf8_lossy(&o.stdout).into_owned() + &*String::from_utf8_lossy(&o.stderr);
    if ws.state.join("runs").exists() {
        said += ws.state_json()["failure"].as_str().unwrap_or("");
    }
    assert!(said.contains("changed during the run"), "{said}");
    assert_eq!(ws.head(), base, "something was committed");
    assert_eq!(git(&ws.repo, &["show", "HEAD:seccomp.json"]), profile);
}

/// Finding 11. A 300 MB file at the commit: belay's own memory stays small.
#[test]
fn a_300_mb_commit_keeps_belays_peak_memory_small() {
    let pipeline = r#"name: bi-big
deps_policy: open
steps:
  - name: write
    timeout: 200
    command: |
      head -c 225000000 /dev/urandom | base64 -w 76 > big.txt
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(&[], &[], 240).success();
    assert!(std::fs::metadata(ws.repo.join("big.txt")).unwrap().len() > 290_000_000);
    let summary: Value =
        serde_json::from_slice(&std::fs::read(ws.run_dir().join("summary.json")).unwrap()).unwrap();
    let peak = summary["peak_rss_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no peak_rss_bytes in {summary}"));
    assert!(peak > 0 && peak <= 64 << 20, "belay peaked at {peak} bytes");
}

/// Finding 12a. `isolation.log_limit` caps a step's log.
#[test]
fn log_limit_truncates_a_flooding_step() {
    let pipeline = r#"name: bi-flood
deps_policy: open
isolation: {log_limit: 1m}
steps:
  - name: flood
    command: |
      head -c 20000000 /dev/zero | tr '\0' x
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(&[], &[], 120);
    let logs = ws.step_logs("flood");
    assert!(!logs.is_empty(), "no log for the step");
    for p in logs {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len <= (1 << 20) + 4096, "{}: {len} bytes", p.display());
        let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
        let last = text.trim_end().lines().last().unwrap_or("");
        assert!(
            last.contains("[belay] log truncated"),
            "{}: ends {last:?}",
            p.display()
        );
    }
}

/// Finding 12b. A fork bomb under the default limits: the run ends, and the
/// sandbox records a pids and a memory limit. (A guard step refuses to start
/// the bomb in a container without a pids limit, so a regression fails the
/// test instead of exhausting the host's pids.)
#[test]
fn a_fork_bomb_is_contained_by_the_default_limits() {
    let pipeline = r#"name: bi-forkbomb
deps_policy: open
steps:
  - name: guard
    command: |
      m=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || echo unknown)
      echo "pids.max=$m"
      case "$m" in ''|max|unknown) echo "no pids limit: the bomb stays off"; exit 1;; esac
  - name: bomb
    timeout: 20
    command: |
      bash -c ':(){ :|:& };:'
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let t0 = Instant::now();
    let out = ws.run(&[], &[], 150);
    let took = t0.elapsed();
    let code = out.get_output().status.code();
    assert!(took <= Duration::from_secs(90), "the run took {took:?}");
    assert!(matches!(code, Some(0 | 1)), "exit {code:?}");
    let sandboxes = ws.events_of("sandbox");
    assert!(!sandboxes.is_empty());
    for e in &sandboxes {
        let pids = field(e, "pids_limit").as_f64().unwrap_or(0.0);
        let mem = field(e, "memory_bytes").as_f64().unwrap_or(0.0);
        assert!(pids > 0.0 && mem > 0.0, "no default limits: {e}");
    }
}

/// Finding 12c. A `produces` file under a symlinked directory does not break
/// the commit's `git add`.
#[test]
fn a_symlinked_produces_parent_does_not_block_the_commit() {
    let pipeline = r#"name: bi-linked-out
deps_policy: open
steps:
  - name: write
    produces: out/summary.md
    command: |
      mkdir real; ln -s real out; echo hi > real/summary.md
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let out = ws.run(&[], &[], 120);
    let o = out.get_output();
    assert!(
        o.status.success(),
        "the run failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(ws.state_json()["status"], "succeeded");
}

/// Finding 12d. Credentials in the remote URL are not readable from a step.
#[test]
fn remote_credentials_are_not_readable_in_steps() {
    let pipeline = r#"name: bi-remote
deps_policy: open
steps:
  - name: look
    command: |
      cat .git/config > seen.txt; git config --get remote.origin.url >> seen.txt 2>&1; true
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    git(
        &ws.repo,
        &[
            "remote",
            "add",
            "origin",
            "https://bi-user:bi-pass-9d2e@example.invalid/r.git",
        ],
    );
    ws.run(&[], &[], 120);
    let seen = std::fs::read_to_string(ws.repo.join("seen.txt")).expect("the step did not run");
    assert!(!seen.contains("bi-pass-9d2e"), "{seen}");
    assert!(
        seen.contains("example.invalid"),
        "the step did not read the config: {seen}"
    );
}

/// Finding 13: what held must stay held. Shell in the commit message template
/// and in a step name does not run; `--dry-run` with a secret set shows and
/// writes nothing of it; the run's records never hold it.
#[test]
fn held_attacks_stay_held() {
    let canary = unique("bi-held-canary");
    let pipeline = r#"name: bi-held
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BI_TOKEN}
steps:
  - name: change
    secrets: [tok]
    command: |
      echo "tok=$BELAY_BI_TOKEN"; echo changed > changed.txt
  - name: commit
    action: commit
    params: {message: "x $(touch @TMP@/m1) `touch @TMP@/m2`"}
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let env = [("BELAY_BI_TOKEN", canary.as_str())];

    let dry_state = ws.dir().join("dry-state");
    let mut c = belay();
    let out = c
        .arg("run")
        .arg(ws.repo.join("pipeline.yaml"))
        .arg("--dry-run")
        .arg("--state-dir")
        .arg(&dry_state)
        .env("BELAY_BI_TOKEN", canary.as_str())
        .timeout(Duration::from_secs(60))
        .assert()
        .success();
    let o = out.get_output();
    assert!(!String::from_utf8_lossy(&o.stdout).contains(&canary));
    assert!(!String::from_utf8_lossy(&o.stderr).contains(&canary));
    assert!(!dry_state.exists(), "--dry-run wrote state");

    let base = ws.head();
    ws.run(&env, &[], 120).success();
    assert!(!ws.dir().join("m1").exists() && !ws.dir().join("m2").exists());
    assert_eq!(
        git(&ws.repo, &["log", "-1", "--format=%s"]),
        format!("x $(touch {t}/m1) `touch {t}/m2`", t = ws.dir().display())
    );
    assert_eq!(git(&ws.repo, &["rev-parse", "HEAD~1"]), base);
    for f in ["state.json", "summary.json"] {
        let text = std::fs::read_to_string(ws.run_dir().join(f)).unwrap();
        assert!(!text.contains(&canary), "{f} holds the secret");
    }
    assert!(ws.step_log("change").contains("tok=[REDACTED:tok]"));
    let seen = ws.sightings(&canary);
    assert!(seen.is_empty(), "{seen:?}");

    // A step named with shell in it: refused at load, or run as a name.
    let named = ws.dir().join("named");
    std::fs::create_dir(&named).unwrap();
    let p = named.join("pipeline.yaml");
    std::fs::write(
        &p,
        format!(
            "name: bi-named\ndeps_policy: open\nsteps:\n  - name: \"s$(touch {t}/m3)`touch {t}/m4`\"\n    command: echo ran\n",
            t = ws.dir().display()
        ),
    )
    .unwrap();
    init_repo(&named);
    let out = belay()
        .arg("run")
        .arg(&p)
        .arg("--state-dir")
        .arg(ws.dir().join("named-state"))
        .timeout(Duration::from_secs(120))
        .assert();
    let code = out.get_output().status.code();
    assert!(matches!(code, Some(0 | 2)), "exit {code:?}");
    assert!(!ws.dir().join("m3").exists() && !ws.dir().join("m4").exists());
}

// ---- Found by the break-in review of the hardened sandbox ----

/// Review 1. The container's own processes (its init and idle main process)
/// outlive every step. A step that writes code into one through
/// `/proc/<pid>/mem` (or stops it, or ptraces it) would survive the sweep and
/// change the tree after the gates. They run as another user: every way in
/// is refused.
#[test]
fn a_step_cannot_hijack_the_containers_own_processes() {
    let pipeline = r#"name: bi-hijack
deps_policy: open
steps:
  - name: try
    command: |
      main=$(cut -d' ' -f1 /proc/1/task/1/children)
      echo "main=$main"
      for p in 1 $main; do
        if perl -e 'open M, "+<", "/proc/$ARGV[0]/mem" or exit 1; exit 0' $p; then echo "mem-open $p"; else echo "mem-denied $p"; fi
        if cat /proc/$p/syscall >/dev/null 2>&1; then echo "syscall-read $p"; else echo "syscall-denied $p"; fi
        if kill -STOP $p 2>/dev/null; then echo "signal-sent $p"; kill -CONT $p; else echo "signal-denied $p"; fi
      done
      true
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(&[], &[], 120).success();
    let log = ws.step_log("try");
    assert!(log.contains("main="), "{log}");
    for bad in ["mem-open", "syscall-read", "signal-sent"] {
        assert!(!log.contains(bad), "{bad}: {log}");
    }
    assert_eq!(log.matches("mem-denied").count(), 2, "{log}");
    assert_eq!(log.matches("signal-denied").count(), 2, "{log}");
}

/// Review 2. In a git worktree, `.git` is a file naming the real git dir. A
/// step that replaced it with a repository of its own (whose config sets
/// `core.fsmonitor`) made the next host `git status` run the command as root.
/// The file is mounted read-only like a `.git` directory.
#[test]
fn a_worktrees_git_file_cannot_be_swapped_for_a_planted_repository() {
    let pipeline = r#"name: bi-worktree
deps_policy: open
steps:
  - name: swap
    command: |
      if rm -f .git 2>/dev/null && mkdir -p .git/objects .git/refs/heads; then
        echo 'ref: refs/heads/main' > .git/HEAD
        printf '[core]\n\tfsmonitor = touch @TMP@/worktree-marker\n' > .git/config
        echo swapped
      else
        echo swap-refused
      fi
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    // Make the workspace a worktree of another repository.
    let main_repo = ws.dir().join("main");
    let st = Command::new("cp")
        .arg("-r")
        .arg(&ws.repo)
        .arg(&main_repo)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_dir_all(&ws.repo).unwrap();
    git(
        &main_repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "wt",
            ws.repo.to_str().unwrap(),
        ],
    );
    assert!(ws.repo.join(".git").is_file());
    ws.run(&[], &[], 120);
    let log = ws.step_log("swap");
    assert!(log.contains("swap-refused"), "{log}");
    assert!(ws.repo.join(".git").is_file(), "the .git file was replaced");
    ws.host_git_status();
    assert!(
        !ws.dir().join("worktree-marker").exists(),
        "a host git ran the planted fsmonitor"
    );
}

/// Review 3. Steps run as root, so a set-uid copy of a shell left in the
/// workspace was a root shell for any user of the host. Set-id bits are
/// cleared from the workspace at the end of every step.
#[test]
fn a_setuid_file_left_in_the_workspace_loses_its_bits() {
    let pipeline = r#"name: bi-setuid
deps_policy: open
steps:
  - name: plant
    command: |
      mkdir -p tools && cp /bin/bash tools/rootsh && chmod 4755 tools/rootsh && chmod 2755 tools && stat -c '%a' tools/rootsh
  - name: look
    command: stat -c 'mode %a' tools/rootsh
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(&[], &[], 120).success();
    assert!(
        ws.step_log("plant").contains("4755"),
        "{}",
        ws.step_log("plant")
    );
    assert!(
        ws.step_log("look").contains("mode 755"),
        "{}",
        ws.step_log("look")
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(ws.repo.join("tools/rootsh"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o6000, 0, "set-id bits left: {mode:o}");
    assert!(ws
        .events_of("setid_cleared")
        .iter()
        .any(|e| e.to_string().contains("tools/rootsh")));
}

/// Review 4. A secret in a file or directory name, and a secret encoded by
/// plain `base64` (which wraps its output at 76 columns), are refused by the
/// commit; the wrapped encoding is redacted in the log too.
#[test]
fn secrets_in_names_and_wrapped_base64_are_caught() {
    let canary = unique("bi-names-canary");
    let pipeline = r#"name: bi-names
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BI_TOKEN}
steps:
  - name: encode
    secrets: [tok]
    command: |
      pad=$(head -c 50 /dev/zero | tr '\0' p)
      printf '%s%s\n' "$pad" "$BELAY_BI_TOKEN" | base64
      printf '%s%s\n' "$pad" "$BELAY_BI_TOKEN" | base64 > encoded.txt
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let base = ws.head();
    ws.run(&[("BELAY_BI_TOKEN", canary.as_str())], &[], 120)
        .code(1);
    let reason = ws
        .events_of("commit_refused")
        .iter()
        .map(|e| field(e, "reason").to_string())
        .collect::<String>();
    assert!(reason.contains("secret `tok`"), "{reason}");
    assert_eq!(ws.head(), base);
    let pad = "p".repeat(50);
    let wrapped = {
        let out = Command::new("base64")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write as _;
                c.stdin
                    .take()
                    .unwrap()
                    .write_all(format!("{pad}{canary}\n").as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let log = ws.step_log("encode");
    for line in wrapped.lines().skip(1) {
        assert!(
            !log.contains(line),
            "a wrapped base64 line of the secret is in the log: {line}"
        );
    }
    // In a name.
    let pipeline = r#"name: bi-names2
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BI_TOKEN}
steps:
  - name: name
    secrets: [tok]
    command: mkdir -p "cache/$BELAY_BI_TOKEN" && touch "cache/$BELAY_BI_TOKEN/x" "note-$BELAY_BI_TOKEN.txt"
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(&[("BELAY_BI_TOKEN", canary.as_str())], &[], 120)
        .code(1);
    let reason = ws
        .events_of("commit_refused")
        .iter()
        .map(|e| field(e, "reason").to_string())
        .collect::<String>();
    assert!(
        reason.contains("name") && reason.contains("`tok`"),
        "{reason}"
    );
    assert!(!git(&ws.repo, &["ls-tree", "-r", "--name-only", "HEAD"]).contains(&canary));
    assert!(
        ws.state_hits(&canary).is_empty(),
        "{:?}",
        ws.state_hits(&canary)
    );
}

/// Review 5. A step replaced the seccomp profile with a link to `/dev/zero`:
/// belay's re-check followed it and grew without bound. Policy files are
/// read without following links, at most 1 MiB.
#[test]
fn a_seccomp_profile_swapped_for_dev_zero_is_refused_quickly() {
    let pipeline = r#"name: bi-zero
deps_policy: open
isolation: {seccomp_profile: seccomp.json}
steps:
  - name: swap
    command: rm -f seccomp.json && ln -s /dev/zero seccomp.json && echo swapped
  - name: online
    network: true
    command: echo should-not-run
"#;
    let profile = r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["acct"],"action":"SCMP_ACT_ERRNO"}]}"#;
    let ws = workspace(NO_MODEL, pipeline, &[("seccomp.json", profile)]);
    let t = Instant::now();
    let out = ws.run(&[], &[], 60);
    let code = out.get_output().status.code();
    assert_ne!(code, Some(0));
    assert!(t.elapsed() < Duration::from_secs(50));
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        err.contains("seccomp") && err.contains("changed during the run"),
        "{err}"
    );
    assert!(!ws.step_log("online").contains("should-not-run"));
}

/// Review 6. A declared output larger than 64 MiB was neither scrubbed past
/// that mark nor kept whole (it was cut to 64 MiB). Scrubbing is streamed.
#[test]
fn a_large_declared_output_is_scrubbed_whole_and_not_cut() {
    let canary = unique("bi-large-canary");
    let pipeline = r#"name: bi-large
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BI_TOKEN}
steps:
  - name: write
    secrets: [tok]
    produces: out.md
    command: |
      { head -c 70000000 /dev/zero | tr '\0' x; printf ' %s end\n' "$BELAY_BI_TOKEN"; } > out.md
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    ws.run(&[("BELAY_BI_TOKEN", canary.as_str())], &[], 180)
        .success();
    let out = std::fs::read(ws.repo.join("out.md")).unwrap();
    assert_eq!(
        out.len(),
        70_000_000 + " [REDACTED:tok] end\n".len(),
        "the file was cut"
    );
    assert!(out.ends_with(b" [REDACTED:tok] end\n"));
}

/// Review 7. A nested repository planted inside a tracked directory (where
/// `git ls-files --others` does not look), whose config sets an fsmonitor:
/// the commit refuses it, and a host git inside that directory is never run
/// by belay. A set-id file with a name that is not UTF-8, deep in the tree,
/// loses its bits too.
#[test]
fn a_nested_repository_in_a_tracked_directory_is_refused() {
    let pipeline = r#"name: bi-nested
deps_policy: open
steps:
  - name: plant
    command: |
      git init -q tests/ 2>/dev/null || { mkdir -p tests/.git/objects tests/.git/refs && echo 'ref: refs/heads/main' > tests/.git/HEAD; }
      printf '[core]\n\tfsmonitor = touch @TMP@/nested-marker\n' >> tests/.git/config
      d="$(printf 'odd\376')"; p="$d"; for i in $(seq 1 270); do p="$p/a"; done
      mkdir -p "$p" && cp /bin/bash "$p/sh" && chmod 4755 "$p/sh" && echo planted
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let base = ws.head();
    ws.run(&[], &[], 120).code(1);
    assert!(
        ws.step_log("plant").contains("planted"),
        "{}",
        ws.step_log("plant")
    );
    ws.assert_refused(&["embedded git repository", "tests"]);
    assert_eq!(ws.head(), base);
    ws.host_git_status();
    assert!(!ws.dir().join("nested-marker").exists());
    let cleared = ws.events_of("setid_cleared");
    assert!(
        cleared.iter().any(|e| e.to_string().contains("/a/a/a/sh")),
        "{cleared:?}"
    );
}

/// Run-layer issue: a step with `allow_git_mutations: true` plants an
/// fsmonitor and a filter driver (in the repository's config, where the host
/// put them before the run as a sandbox with a writable config would have,
/// and again from inside the step), a pre-commit hook, and attributes that
/// route every file through the filter. The host-side commit runs none of
/// them, which marker files prove, and commits the files as they are.
#[test]
fn planted_fsmonitor_filter_and_hooks_never_run_in_the_host_commit() {
    let pipeline = r#"name: bi-mutations
deps_policy: open
isolation: {allow_git_mutations: true}
steps:
  - name: plant
    command: |
      printf '[core]\n\tfsmonitor = touch @TMP@/fsmonitor-step\n' >> .git/config 2>/dev/null && echo config-written || echo config-read-only
      git config filter.step.clean 'touch @TMP@/filter-step; cat' 2>/dev/null || true
      printf '#!/bin/sh\ntouch @TMP@/hook-ran\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit
      printf '#!/bin/sh\ntouch @TMP@/hook-ran\n' > .git/hooks/post-commit && chmod +x .git/hooks/post-commit
      printf '* filter=evil diff=evil\n' > .gitattributes
      printf '* filter=step\n' > .git/info/attributes
      echo payload > new-file.txt
      echo planted
  - name: commit
    action: commit
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let tmp = ws.dir().display().to_string();
    // Planted on the host before the run; from here on only belay's git
    // touches the repository (a plain `git status` would run these).
    let mut cfg = std::fs::OpenOptions::new()
        .append(true)
        .open(ws.repo.join(".git/config"))
        .unwrap();
    use std::io::Write as _;
    write!(
        cfg,
        "[core]\n\tfsmonitor = touch {tmp}/fsmonitor-host\n[filter \"evil\"]\n\tclean = touch {tmp}/filter-host; cat\n\tsmudge = touch {tmp}/filter-host; cat\n\tprocess = touch {tmp}/filter-host\n\trequired = true\n[diff \"evil\"]\n\ttextconv = touch {tmp}/textconv-host; cat\n\tcommand = touch {tmp}/textconv-host\n"
    )
    .unwrap();
    drop(cfg);
    let base = ws.head();
    ws.run(&[], &[], 180).success();
    assert!(ws.step_log("plant").contains("planted"));
    let ran: Vec<String> = std::fs::read_dir(ws.dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("-host") || n.ends_with("-step") || n == "hook-ran")
        .collect();
    assert!(ran.is_empty(), "ran on the host: {ran:?}");
    let head = ws.head();
    assert_ne!(head, base, "nothing was committed");
    // The blob is the file itself, not a filter's output.
    assert_eq!(
        git(
            &ws.repo,
            &["cat-file", "-p", &format!("{head}:new-file.txt")]
        ),
        "payload"
    );
    let cfg = std::fs::read_to_string(ws.repo.join(".git/config")).unwrap();
    assert!(
        !cfg.contains("fsmonitor-step") && !cfg.contains("filter-step"),
        "the step changed the host's config: {cfg}"
    );
    assert!(ws.step_log("plant").contains("config-read-only"));
    // The plant is live: a plain git on the host runs it.
    std::fs::write(ws.repo.join("new-file.txt"), "changed\n").unwrap();
    let _ = Command::new("git")
        .args(["add", "-A"])
        .current_dir(&ws.repo)
        .output()
        .unwrap();
    assert!(
        ws.dir().join("fsmonitor-host").exists() || ws.dir().join("filter-host").exists(),
        "the planted commands were inert, so the test proves nothing"
    );
}

/// Trust-boundary finding 3. A networked step gets the host's proxy
/// settings (so that installs work behind a proxy) and prints them; the
/// proxy password must not reach its log, `state.json`, `events.jsonl`, the
/// feedback handed to the next step, that agent's prompt or the model
/// request. Before the one redaction policy the pipeline's redactor held
/// only its own secrets and the model key, and the password was in all of
/// them.
#[test]
fn the_host_proxy_password_stays_out_of_every_pipeline_record() {
    let tag = unique("px");
    let password = format!("proxy-pw-{tag}");
    let proxy = format!("http://bi-user:{password}@127.0.0.1:9/");
    let script = r#"turns:
  - name: done
    reply:
      tool_calls: [{name: finish, arguments: {summary: "looked at the feedback"}}]
"#;
    let pipeline = format!(
        "name: bi-proxy\n{LLM}deps_policy: open\nmax_attempts: 2\nsteps:\n  - name: probe\n    network: true\n    command: |\n      echo \"proxy is $HTTPS_PROXY and $http_proxy\"\n      exit 1\n    on_fail: {{goto: dev, retry: true}}\n  - name: dev\n    agent: dev\n    max_iterations: 2\n    on_pass: success\n"
    );
    let ws = workspace(script, &pipeline, &[]);
    ws.run(
        &[
            ("HTTPS_PROXY", proxy.as_str()),
            ("http_proxy", proxy.as_str()),
            ("NO_PROXY", "127.0.0.1,localhost"),
            ("no_proxy", "127.0.0.1,localhost"),
        ],
        &[],
        240,
    );
    let log = ws.step_log("probe");
    assert!(log.contains("proxy is "), "the probe did not run: {log}");
    assert!(
        log.contains("[REDACTED:"),
        "the step saw no proxy password to redact: {log}"
    );
    assert!(
        !ws.replay.requests().is_empty(),
        "the feedback never reached the next agent's model request"
    );
    for n in escaped_forms(&password) {
        let hits = ws.sightings(&n);
        assert!(hits.is_empty(), "{n:?} in {hits:?}");
    }
}

/// Fresh-eyes round: a step with `allow_git_mutations: true` (in the agents'
/// image, which has git) plants `post-commit` and `pre-commit` hooks, and
/// commits a submodule (a gitlink and `.gitmodules`) whose repository, left
/// at its path, sets `core.fsmonitor`. The run used to succeed, and the
/// user's next `git status` and `git commit` ran both on the host. Now the
/// hooks are put back as they were and the submodule's repository is moved
/// aside (`sub/.git.belay-quarantined`); the run stops and says so.
#[test]
fn planted_hooks_and_a_committed_submodules_fsmonitor_never_reach_the_users_git() {
    let pipeline = r#"name: bi-submodule
deps_policy: open
max_attempts: 1
isolation: {allow_git_mutations: true, image: "belay-agent:bookworm"}
steps:
  - name: dev
    command: |
      printf '#!/bin/sh\ntouch @TMP@/hook-ran\n' > .git/hooks/post-commit; chmod +x .git/hooks/post-commit
      cp .git/hooks/post-commit .git/hooks/pre-commit
      mkdir sub && cd sub && git init -q -b main && git -c user.name=a -c user.email=a@a commit -q --allow-empty -m s
      git config core.fsmonitor 'touch @TMP@/fsmonitor-ran; false'
      S=$(git rev-parse HEAD); cd ..
      printf '[submodule "sub"]\n\tpath = sub\n\turl = ./sub\n' > .gitmodules
      git update-index --add --cacheinfo 160000,$S,sub && git add .gitmodules
      git -c user.name=a -c user.email=a@a -c core.hooksPath=/dev/null commit -q -m docs && echo COMMITTED
      echo change > change.txt
"#;
    let ws = workspace(NO_MODEL, pipeline, &[]);
    let out = ws.run(&[], &[], 240).failure();
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        ws.step_log("dev").contains("COMMITTED"),
        "the plant did not run"
    );
    assert!(err.contains("sub/.git.belay-quarantined"), "{err}");
    assert!(!ws.repo.join("sub/.git").exists());
    for h in ["post-commit", "pre-commit"] {
        assert!(
            !ws.repo.join(".git/hooks").join(h).exists(),
            "{h} is still there"
        );
    }
    assert!(!ws.events_of("git_tampered").is_empty());
    // The user's own git, as they would run it next.
    git(&ws.repo, &["status", "--short"]);
    git(&ws.repo, &["add", "change.txt"]);
    git(
        &ws.repo,
        &[
            "-c",
            "user.name=u",
            "-c",
            "user.email=u@u",
            "commit",
            "-qm",
            "mine",
        ],
    );
    for m in ["hook-ran", "fsmonitor-ran"] {
        assert!(!ws.dir().join(m).exists(), "{m}: the plant ran on the host");
    }
}
