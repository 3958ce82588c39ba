//! `build-projects --executor swarm` on this engine as a single-node swarm
//! (`docker swarm init` by scripts/setup-host.sh --tests), with the loopback registry:
//! the same results as a local batch, the cache shared through the registry
//! with an emptied image store, and a task killed mid-build resumed by the
//! task that replaces it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;
use crate::registry::registry;

/// The worker image of this belay, built and pushed once per test process.
fn worker_image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let (_, state, _) = docker(&["info", "--format", "{{.Swarm.LocalNodeState}}"]);
        assert_eq!(
            state.trim(),
            "active",
            "this engine is not a swarm: run scripts/setup-host.sh --tests (docker swarm init)"
        );
        let a = belay()
            .args(["image", "worker", "--registry", &registry()])
            .assert()
            .success();
        let out = String::from_utf8_lossy(&a.get_output().stdout).to_string();
        out.split_whitespace().next().unwrap().to_string()
    })
}

/// Four projects, one broken.
fn projects(root: &Path) -> PathBuf {
    for n in ["alpha", "beta", "gamma"] {
        std::fs::create_dir_all(root.join(n)).unwrap();
        std::fs::write(root.join(n).join("README.md"), format!("project {n}\n")).unwrap();
        std::fs::write(root.join(n).join(format!("{n}.txt")), format!("{n} data\n")).unwrap();
    }
    std::fs::create_dir_all(root.join("broken")).unwrap();
    std::fs::write(
        root.join("broken/requirements.txt"),
        "belay-no-such-package-xyz==1.0.0\n",
    )
    .unwrap();
    let f = root.join("projects.txt");
    std::fs::write(&f, "./alpha\n./broken\n./beta\n./gamma\n").unwrap();
    f
}

fn batch(projects: &Path, dir: &Path, prefix: &str, extra: &[&str]) -> (i32, Value, String) {
    let a = belay()
        .args(["env", "build-projects", "--projects-file"])
        .arg(projects)
        .arg("--projects-dir")
        .arg(dir)
        .args(["--jobs", "2", "--run-id-prefix", prefix])
        .args(extra)
        .timeout(Duration::from_secs(900))
        .assert();
    let code = a.get_output().status.code().unwrap_or(-1);
    let summary = dir.join("build-projects-summary.json");
    assert!(
        summary.is_file(),
        "no summary: {}",
        String::from_utf8_lossy(&a.get_output().stderr)
    );
    let failed = std::fs::read_to_string(dir.join("failed-projects.log")).unwrap();
    (code, read_json(&summary), failed)
}

fn guards(prefix: &str) -> Vec<RunGuard> {
    ["alpha", "broken", "beta", "gamma"]
        .iter()
        .map(|n| RunGuard(format!("{prefix}-{n}")))
        .collect()
}

/// What a summary says of each project, without times and paths.
fn outcome(s: &Value) -> Vec<(String, String, Option<String>, u64)> {
    s["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["status"].as_str().unwrap().to_string(),
                p["stage"].as_str().map(String::from),
                p["blocks"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn files_in(image: &str) -> String {
    let (ok, out, err) = sh_offline(
        image,
        "cd /workspace/repo && find . -type f | sort && cat *.txt",
    );
    assert!(ok, "{err}");
    out
}

#[test]
fn a_swarm_batch_gives_the_local_batch_result() {
    require_engine();
    let reg = registry();
    let image = worker_image().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let pf = projects(tmp.path());
    let (lp, sp) = (run_id("sw-local"), run_id("sw-swarm"));
    let _g: Vec<RunGuard> = guards(&lp).into_iter().chain(guards(&sp)).collect();

    let (code_l, local, failed_l) = batch(&pf, &tmp.path().join("local"), &lp, &["--no-cache"]);
    let on_swarm = [
        "--executor",
        "swarm",
        "--registry",
        &reg,
        "--worker-image",
        &image,
    ];
    let (code_s, swarm, failed_s) = batch(
        &pf,
        &tmp.path().join("swarm"),
        &sp,
        &[&["--no-cache"][..], &on_swarm].concat(),
    );
    assert_eq!((code_l, code_s), (1, 1), "one project fails in each");
    assert_eq!(outcome(&local), outcome(&swarm));
    assert_eq!(swarm["failed"], 1);
    assert_eq!(swarm["projects"][1]["name"], "broken");
    // failed-projects.log: the same line, in its own projects dir.
    assert_eq!(
        failed_l.replace(&tmp.path().join("local").display().to_string(), "D"),
        failed_s.replace(&tmp.path().join("swarm").display().to_string(), "D")
    );
    assert_eq!(failed_s.lines().count(), 1);
    // The same final images, the swarm's in the registry.
    for i in [0, 2, 3] {
        let l = local["projects"][i]["final_image"].as_str().unwrap();
        let s = swarm["projects"][i]["final_image"].as_str().unwrap();
        assert!(s.starts_with(&format!("{reg}/")), "{s}");
        assert_eq!(files_in(l), files_in(s), "{l} and {s} differ");
    }
    // The job's service is gone once the batch has reported.
    let (_, services, _) = docker(&["service", "ls", "--filter", "label=belay.batch", "-q"]);
    let ours: Vec<&str> = services
        .lines()
        .filter(|id| {
            let (_, labels, _) = docker(&[
                "service",
                "inspect",
                "--format",
                "{{json .Spec.Labels}}",
                id,
            ]);
            labels.contains(&sp)
        })
        .collect();
    assert!(ours.is_empty(), "the swarm job was left behind: {ours:?}");

    // A second swarm batch of the same projects on an engine without any of
    // the first one's images: every block comes through the registry.
    for g in guards(&sp).into_iter().chain(guards(&lp)) {
        cleanup_run(&g.0);
    }
    let sp2 = run_id("sw-again");
    let _g2 = guards(&sp2);
    let (code, again, _) = batch(&pf, &tmp.path().join("swarm2"), &sp2, &on_swarm);
    assert_eq!(code, 1);
    for p in again["projects"].as_array().unwrap() {
        if p["status"] != "ok" {
            continue;
        }
        assert_eq!(p["cache_misses"], 0, "{p}");
        let m = read_json(Path::new(p["manifest"].as_str().unwrap()));
        assert_eq!(
            m["registry"]["hits"].as_u64().unwrap(),
            p["blocks"].as_u64().unwrap() + 1,
            "every checkpoint (the workspace too) through the registry: {}",
            m["registry"]
        );
        assert!(phases(&m, "block").is_empty(), "a block ran: {}", p["name"]);
    }
}

#[test]
fn a_killed_task_is_replaced_and_the_project_resumes() {
    require_engine();
    let reg = registry();
    let image = worker_image().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("slow");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(
        repo.join("README.md"),
        format!("slow {}\n", std::process::id()),
    )
    .unwrap();
    let pf = tmp.path().join("projects.txt");
    std::fs::write(&pf, "./slow\n").unwrap();
    let prefix = run_id("sw-kill");
    let run = format!("{prefix}-slow");
    let _g = RunGuard(run.clone());
    let dir = tmp.path().join("out");
    // Hand-written blocks for the run: a quick one, then one slow enough to
    // be killed in.
    let blocks_dir = dir.join(".belay-state/runs").join(&run).join("blocks");
    std::fs::create_dir_all(&blocks_dir).unwrap();
    for (order, (id, body)) in [
        ("00-a", "echo a > /opt/a"),
        ("10-slow", "sleep 15; echo b > /opt/b"),
    ]
    .iter()
    .enumerate()
    {
        let script = format!(
            "#!/usr/bin/env bash\n# belay block {id}: test\nset -euo pipefail\ncd /workspace/repo\n\n{body}\n"
        );
        let b = json!({
            "id": id, "title": id, "goal": "test", "script": script, "order": order,
            "validation_command": "true", "status": "planned", "last_error": null,
            "baseline_checkpoint": null, "success_checkpoint": null, "repair_attempts": 0
        });
        std::fs::write(blocks_dir.join(format!("{id}.json")), b.to_string()).unwrap();
    }
    let mut child = std::process::Command::new(belay_path())
        .args(["env", "build-projects", "--projects-file"])
        .arg(&pf)
        .arg("--projects-dir")
        .arg(&dir)
        .args([
            "--run-id-prefix",
            &prefix,
            "--no-cache",
            "--executor",
            "swarm",
        ])
        .args(["--registry", &reg, "--worker-image", &image])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the slow block to run, then kill the task's container.
    let deadline = Instant::now() + Duration::from_secs(300);
    let slow = blocks_dir.join("10-slow.json");
    loop {
        assert!(Instant::now() < deadline, "the slow block never started");
        assert!(child.try_wait().unwrap().is_none(), "the batch ended early");
        let running = std::fs::read_to_string(&slow)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|b| b["status"] == "running");
        if running {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, tasks, _) = docker(&[
        "ps",
        "-q",
        "--filter",
        "label=belay.kind=worker",
        "--filter",
        "label=belay.batch",
    ]);
    let mine: Vec<&str> = tasks
        .lines()
        .filter(|id| {
            let (_, args, _) = docker(&["inspect", "--format", "{{json .Args}}", id]);
            args.contains(dir.to_str().unwrap())
        })
        .collect();
    assert_eq!(mine.len(), 1, "{tasks}");
    assert!(docker(&["kill", mine[0]]).0);
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "the project must finish after the resume"
    );
    let s = read_json(&dir.join("build-projects-summary.json"));
    assert_eq!(s["ok"], 1, "{s}");
    let m = read_json(Path::new(s["projects"][0]["manifest"].as_str().unwrap()));
    assert_eq!(m["starts"], 2, "the manifest shows the resume");
    let ran: Vec<&str> = phases(&m, "block")
        .iter()
        .map(|e| e["block_id"].as_str().unwrap())
        .collect();
    // 00-a ran once, before the kill; the slow block ran again from 00-a's checkpoint.
    assert_eq!(ran.iter().filter(|b| **b == "00-a").count(), 1, "{ran:?}");
    assert!(
        ran.iter().filter(|b| **b == "10-slow").count() >= 1,
        "{ran:?}"
    );
    let work = std::fs::read_dir(dir.join(".belay-swarm"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // The first claim, and the take-over's, a generation later.
    assert!(work.join("claims/0.0.json").is_file());
    let claim = read_json(&work.join("claims/0.1.json"));
    assert_eq!(claim["earlier"].as_array().unwrap().len(), 1, "{claim}");
    assert!(
        claim["earlier"][0]
            .as_str()
            .unwrap()
            .starts_with(&mine[0][..12]),
        "{claim} {}",
        mine[0]
    );
    let (ok, out, _) = docker(&[
        "run",
        "--rm",
        m["final_image"].as_str().unwrap(),
        "cat",
        "/opt/a",
        "/opt/b",
    ]);
    assert!(ok && out == "a\nb\n", "{out}");
}

/// `--executor kubernetes` on a machine without a cluster: each missing
/// piece is named, and the real kube-rs client's failure to reach an API
/// server is E306 (exit 3). Nothing here reaches a cluster: none exists here.
#[test]
fn a_kubernetes_batch_without_a_cluster_says_what_is_missing() {
    let root = tempfile::tempdir().unwrap();
    let file = projects(root.path());
    let dir = root.path().join("out");
    let run = |extra: &[&str], envs: &[(&str, &std::ffi::OsStr)]| {
        let mut cmd = belay();
        cmd.args(["env", "build-projects", "--projects-file"])
            .arg(&file)
            .arg("--projects-dir")
            .arg(&dir)
            .args(["--executor", "kubernetes", "--registry", &registry()])
            .args(["--run-id-prefix", "k8s-none"])
            .args(extra);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let a = cmd.timeout(Duration::from_secs(300)).assert();
        (
            a.get_output().status.code().unwrap_or(-1),
            String::from_utf8_lossy(&a.get_output().stderr).to_string(),
        )
    };
    let _g = guards("k8s-none");
    let (code, err) = run(&[], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--k8s-work-claim"), "{err}");

    let image = worker_image();
    let claim = ["--k8s-work-claim", "belay-work", "--worker-image", image];
    let home = root.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let none = root.path().join("no-such-kubeconfig");
    let (code, err) = run(&claim, &[("KUBECONFIG", none.as_os_str())]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("BELAY-E306"), "{err}");
    assert!(err.contains("KUBECONFIG"), "{err}");

    // A kubeconfig whose API server does not answer (nothing listens on
    // port 9): the client's connection error, with the way to check.
    let kubeconfig = root.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:9\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: builds\ncurrent-context: x\n",
    )
    .unwrap();
    let (code, err) = run(&claim, &[("KUBECONFIG", kubeconfig.as_os_str())]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("BELAY-E306"), "{err}");
    assert!(err.contains("kubectl get jobs"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
