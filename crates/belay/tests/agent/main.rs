//! `belay agent run` through the one agent service: any program as an agent
//! (`cmd:`), in a container by default, on the host only when asked. Real
//! engine, real git, real processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../shared/pipeline.rs"]
#[allow(dead_code)]
mod common;
#[path = "../shared/git.rs"]
#[allow(dead_code)]
mod git_cli;
#[path = "../shared/replay.rs"]
#[allow(dead_code)]
mod replay;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use git_cli::init_repo;

struct Ws {
    tmp: tempfile::TempDir,
    repo: PathBuf,
    script: PathBuf,
}

/// A repository, and outside it an agent script that records where it ran
/// and what it could do.
fn ws() -> Ws {
    common::require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("README"), "hi\n").unwrap();
    init_repo(&repo);
    git_cli::git(
        &repo,
        &[
            "remote",
            "add",
            "origin",
            "https://bob:hunter2-x@example.invalid/r.git",
        ],
    );
    let script = tmp.path().join("my agent.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         { echo \"prompt: $1\"; echo \"host: $(cat /proc/sys/kernel/hostname)\"; } > from-agent.txt\n\
         touch .git/planted 2>/dev/null && echo git-writable >> from-agent.txt\n\
         mknod blockdev b 8 0 2>/dev/null && echo mknod-ok >> from-agent.txt\n\
         grep -q hunter2 .git/config 2>/dev/null && echo credentials-visible >> from-agent.txt\n\
         printf '[core]\\n\\tfsmonitor = touch /tmp/x\\n' > .git/config 2>/dev/null && echo config-written >> from-agent.txt\n\
         echo \"the answer to $1\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    Ws { tmp, repo, script }
}

impl Ws {
    fn agent(&self, spec: &str, extra: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_belay"))
            .env("BELAY_STATE_HOME", self.tmp.path().join("registry"))
            .env_remove("OPENAI_API_KEY")
            .args([
                "agent",
                "run",
                "--agent",
                spec,
                "--prompt",
                "forty-two",
                "--repo",
            ])
            .arg(&self.repo)
            .args(extra)
            .output()
            .unwrap()
    }

    fn spec(&self) -> String {
        format!("cmd:'{}' {{prompt}}", self.script.display())
    }

    fn written(&self) -> String {
        std::fs::read_to_string(self.repo.join("from-agent.txt")).unwrap_or_default()
    }
}

fn events(out_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out_dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// By default a `cmd:` agent runs in a container: the workspace is mounted
/// (its change lands), `.git` is read-only (it cannot commit or plant), the
/// program is mounted read-only at its own path (a path with a space), and
/// its run is recorded with one envelope.
#[test]
fn a_cmd_agent_runs_in_a_container_by_default() {
    let w = ws();
    let out_dir = w.tmp.path().join("out");
    let o = w.agent(&w.spec(), &["--out", out_dir.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("the answer to forty-two"),
        "{err}"
    );
    let written = w.written();
    assert!(written.contains("prompt: forty-two"), "{written}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(
        !written.contains(&format!("host: {}", host.trim())),
        "the agent ran on the host: {written}"
    );
    for bad in [
        "git-writable",
        "mknod-ok",
        "credentials-visible",
        "config-written",
    ] {
        assert!(!written.contains(bad), "{bad}: {written}");
    }
    assert!(!w.repo.join(".git/planted").exists());
    assert!(!w.repo.join("blockdev").exists());
    let ev = events(&out_dir);
    assert!(ev.iter().all(|e| e["mode"] == "agent" && e["v"] == 1));
    assert!(ev.iter().any(|e| e["kind"] == "agent"), "{ev:?}");
    assert!(ev.iter().any(|e| e["kind"] == "agent_report"), "{ev:?}");
    // The container is gone.
    let run_id = ev[0]["run_id"].as_str().unwrap();
    let left = common::containers_of(run_id);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `--on-host` is the explicit opt-out: the same agent runs on this machine.
#[test]
fn on_host_runs_the_agent_here() {
    let w = ws();
    let o = w.agent(&w.spec(), &["--on-host"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(w.written().contains(&format!("host: {}", host.trim())));
}

/// A spec that does not parse exits 2 and says which forms there are.
#[test]
fn a_bad_agent_spec_exits_2_with_the_forms() {
    let w = ws();
    for bad in ["aider", "codex@", "cmd:", "cmd:'unclosed"] {
        let o = w.agent(bad, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("cmd:PROGRAM"), "{bad}: {err}");
    }
    let o = w.agent("cmd:/no/such/program {prompt}", &[]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A directory that is no repository gets an empty read-only `.git`: the
/// agent cannot make one for the next host git to read. A subdirectory of a
/// repository mounts the whole work tree, so its `.git` is covered too.
#[test]
fn the_agent_cannot_plant_a_repository() {
    let w = ws();
    let plain = w.tmp.path().join("plain");
    std::fs::create_dir_all(plain.join("sub")).unwrap();
    let planter = w.tmp.path().join("plant.sh");
    std::fs::write(
        &planter,
        "#!/bin/sh\nmkdir -p .git 2>/dev/null; printf '[core]\\n\\tfsmonitor = touch /tmp/x\\n' > .git/config 2>/dev/null && echo planted\necho done\n",
    )
    .unwrap();
    std::fs::set_permissions(&planter, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", w.tmp.path().join("registry"))
        .args(["agent", "run", "--prompt", "x", "--agent"])
        .arg(format!("cmd:{}", planter.display()))
        .arg("--repo")
        .arg(&plain)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("planted"));
    assert!(!plain.join(".git/config").exists());
    // From a subdirectory of a repository: the work tree's .git stays read-only.
    std::fs::create_dir_all(w.repo.join("sub")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", w.tmp.path().join("registry"))
        .args(["agent", "run", "--prompt", "x", "--agent"])
        .arg(format!("cmd:{}", planter.display()))
        .arg("--repo")
        .arg(w.repo.join("sub"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("planted"));
    let cfg = std::fs::read_to_string(w.repo.join(".git/config")).unwrap();
    assert!(!cfg.contains("fsmonitor"), "{cfg}");
}

/// Each real CLI answers through `belay agent run` in its container, in its
/// own dialect (no `--llm-api`), against the one scripted model server, and
/// the one history has its tokens.
#[test]
fn every_real_cli_answers_in_its_container_in_its_own_dialect() {
    let w = ws();
    let server = replay::Replay::start(
        w.tmp.path(),
        "turns:\n  - name: any\n    reply: {text: \"Done by the scripted model.\"}\n    repeat: true\n",
    );
    for (spec, path) in [
        ("codex@gpt-5-codex", "/responses"),
        ("claude@claude-sonnet-4-5", "/v1/messages"),
        ("gemini@gemini-2.5-flash", ":streamGenerateContent"),
    ] {
        let before = server.requests().len();
        let (ok, out) =
            replay::scripted_agent(&server, w.tmp.path(), &w.repo, spec, "Say done", &[], &[]);
        assert!(ok, "{spec}: {out}");
        assert!(out.contains("Done by the scripted model."), "{spec}: {out}");
        let reqs = server.requests();
        assert!(
            reqs[before..]
                .iter()
                .any(|r| r["path"].as_str().unwrap_or("").ends_with(path)),
            "{spec}: {:?}",
            &reqs[before..]
        );
    }
    let runs = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", w.tmp.path().join("registry"))
        .args(["runs", "list", "--json"])
        .output()
        .unwrap();
    let runs: Vec<serde_json::Value> = String::from_utf8_lossy(&runs.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    for r in &runs {
        assert_eq!(r["status"], "ok", "{r}");
        assert!(r["tokens"].as_u64().unwrap() > 0, "{r}");
    }
}

/// A CLI's container has no network at all: its model comes through belay's
/// socket and relay, a lookup or a connection out is refused at once, and
/// only the loopback interface is there. Where belay's relay cannot run in
/// the image, the box falls back to the fenced network route and the call
/// still works.
#[test]
fn a_cli_reaches_only_its_model_through_the_socket_route_or_the_network_fallback() {
    let w = ws();
    let probe = "ls /sys/class/net | tr '\\n' ' '; s=$(date +%s%N); (exec 3<>/dev/tcp/1.1.1.1/80) 2>/dev/null && echo OUT-OPEN || echo out-refused; getent hosts example.com >/dev/null && echo DNS-OPEN || echo dns-refused; echo took=$(( ($(date +%s%N) - s) / 1000000 ))ms";
    let server = replay::Replay::start(
        w.tmp.path(),
        &replay::exec_once(probe, "Probe", "dns-refused", "Probed."),
    );
    let call = |relay_bin: Option<&str>| {
        let before = server.requests().len();
        let env: Vec<(&str, &str)> = relay_bin
            .map(|b| ("BELAY_RELAY_BIN", b))
            .into_iter()
            .collect();
        let (ok, out) = replay::scripted_agent(
            &server,
            w.tmp.path(),
            &w.repo,
            "codex@gpt-5-codex",
            "Probe the network",
            &[],
            &env,
        );
        assert!(ok, "{out}");
        assert!(out.contains("Probed."), "{out}");
        server.seen_since(before)
    };
    let socket = call(None);
    // (The outcomes as printed, each ending its line; the command itself
    // names them too.)
    let printed = |all: &str, what: &str| all.contains(&format!("{what}\\n"));
    assert!(
        printed(&socket, "lo out-refused"),
        "only loopback, refused: {socket}"
    );
    assert!(printed(&socket, "dns-refused"), "{socket}");
    assert!(
        !printed(&socket, "OUT-OPEN") && !printed(&socket, "DNS-OPEN"),
        "{socket}"
    );
    let took: u64 = socket
        .split("took=")
        .filter_map(|t| t.split("ms").next()?.parse().ok())
        .next()
        .unwrap_or(u64::MAX);
    assert!(took < 1000, "refusals took {took} ms: {socket}");
    // A relay that cannot run (here: one that exits at once): the network route.
    let net = call(Some("/bin/false"));
    assert!(
        printed(&net, "eth0 lo out-refused"),
        "a fenced network route: {net}"
    );
    assert!(printed(&net, "dns-refused"), "{net}");
}

/// A pinned node CLI (codex) runs on belay's node, mounted on no `PATH`:
/// the commands it runs find the image's own `node` (none in this image),
/// not the host's. Before, the host's node was mounted at
/// `/usr/local/bin/node`, where an env build's image keeps the project's
/// pinned node, and the agent's tests ran on the host's.
#[test]
fn an_agents_commands_find_the_images_node_not_belays() {
    let w = ws();
    let probe = "echo node=$(command -v node || echo none) mounted=$(test -x /opt/belay-agent-node/node && echo yes)";
    let server = replay::Replay::start(
        w.tmp.path(),
        &replay::exec_once(probe, "Look", "mounted=", "Looked."),
    );
    let (ok, out) = replay::scripted_agent(
        &server,
        w.tmp.path(),
        &w.repo,
        "codex@gpt-5-codex",
        "Look for node",
        &[],
        &[],
    );
    assert!(ok && out.contains("Looked."), "{out}");
    let seen = server.seen_since(0);
    assert!(seen.contains("node=none mounted=yes"), "{seen}");
}

/// What belay warns about after an agent is in the run's events (the
/// dashboard and `runs events` show it), not only on the terminal: here a
/// repository the agent left in the work tree.
#[test]
fn a_warning_after_the_agent_is_an_event_of_the_run() {
    let w = ws();
    let nester = w.tmp.path().join("nest.sh");
    std::fs::write(
        &nester,
        "#!/bin/sh\nmkdir -p nested/.git/objects nested/.git/refs && echo 'ref: refs/heads/main' > nested/.git/HEAD\necho done\n",
    )
    .unwrap();
    std::fs::set_permissions(&nester, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = w.tmp.path().join("out");
    let o = w.agent(
        &format!("cmd:{}", nester.display()),
        &["--out", out.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("left repositories"), "{err}");
    let warnings: Vec<_> = events(&out)
        .into_iter()
        .filter(|e| e["kind"] == "warning")
        .collect();
    assert!(
        warnings.iter().any(|e| e["data"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("nested")),
        "{warnings:?}"
    );
}
