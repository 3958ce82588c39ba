//! The four fixture builds: each succeeds, and the project's own tests pass
//! inside the final image.

use std::path::Path;

use serde_json::Value;

use crate::common::*;

/// Build `fixture` with its own run id and state dir; returns the manifest.
fn build(fixture_name: &str, run: &str, state: &Path) -> Value {
    build_with(fixture_name, run, state, &[])
}

fn build_with(fixture_name: &str, run: &str, state: &Path, extra: &[&str]) -> Value {
    require_engine();
    let a = belay()
        .args(["env", "build", "--repo"])
        .arg(fixture(fixture_name))
        .arg("--state-dir")
        .arg(state)
        // Real builds: a CI machine keeps images between runs, and these tests
        // are about building, so the cache is off here (tests/env/cache.rs tests it).
        .args(["--run-id", run, "--command-timeout", "900", "--no-cache"])
        .args(extra)
        .assert();
    let out = a.get_output();
    let m = manifest(state, run);
    assert!(
        out.status.success() && m["ok"] == true,
        "build of {fixture_name} failed: {}\n{}\nmanifest error: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        m["error"]
    );
    m
}

fn all_blocks_succeeded(m: &Value) {
    for b in m["blocks"].as_array().unwrap() {
        assert_eq!(
            b["status"], "succeeded",
            "block {} is {}",
            b["id"], b["status"]
        );
    }
}

#[test]
fn python_fixture_builds_and_its_tests_pass() {
    let run = run_id("py");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("py-pyproject", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "2 passed");
    // A place to work: the project's test command as a developer types it,
    // `python3` is the project's interpreter, and the basic tools are there.
    let image = m["final_image"].as_str().unwrap();
    let (ok, out, err) = docker(&["run", "--rm", "--network", "none", image, "pytest", "-q"]);
    assert!(
        ok && out.contains("2 passed"),
        "`docker run IMAGE pytest -q`:\n{out}\n{err}"
    );
    project_tests_pass(
        &m,
        "python3 -c 'import sys; print(sys.prefix)'",
        "/workspace/repo/.venv",
    );
    project_tests_pass(&m, "echo $VIRTUAL_ENV", "/workspace/repo/.venv");
    // `SHELL` as a terminal has it, in the image's environment (dash sets
    // none of its own; bash would set one unexported).
    let (ok, out, err) = sh_offline(image, "echo shell=$SHELL");
    assert!(ok && out.contains("shell=/bin/bash"), "{out}\n{err}");
    project_tests_pass(
        &m,
        "command -v git make curl ps ssh && test -s /etc/ssl/certs/ca-certificates.crt && echo tools-ok",
        "tools-ok",
    );
    check_run_records(state.path(), &run, &m);
    check_shell(&run);
    check_dockerfile_rebuilds(state.path(), &run);
    assert!(
        run_containers(&run).is_empty(),
        "containers left behind: {:?}",
        run_containers(&run)
    );
    check_resume_from(state.path(), &run);
    check_oracles(state.path(), &run);
}

/// Oracles run on the final image; the build is ok only if they pass. The same
/// run id reuses the finished build, so each oracle run is quick.
fn check_oracles(state: &Path, run: &str) {
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pass.oracle.json");
    std::fs::write(&pass, r#"{"fixed_test_commands": [{"command": ".venv/bin/python -m pytest -q", "oracle_id": "pytest-run", "source": "generic", "oracle_priority": 1}]}"#).unwrap();
    let fail = dir.path().join("fail.oracle.json");
    std::fs::write(&fail, r#"{"fixed_test_commands": [{"commands": ["true", "test -f /no/such/oracle-file"], "oracle_id": "must-fail"}]}"#).unwrap();

    let m = build_with(
        "py-pyproject",
        run,
        state,
        &["--oracle-file", pass.to_str().unwrap()],
    );
    assert_eq!(m["oracle"]["ok"], true);
    let cmd = &m["oracle"]["commands"][0];
    assert_eq!(
        cmd["command"], ".venv/bin/python -m pytest -q",
        "a full test-suite command is run as written"
    );
    assert!(cmd["rewritten_from"].is_null());

    let a = belay()
        .args(["env", "build", "--no-cache", "--repo"])
        .arg(fixture("py-pyproject"))
        .arg("--state-dir")
        .arg(state)
        .args(["--run-id", run, "--oracle-file", fail.to_str().unwrap()])
        .assert()
        .code(1);
    let m = manifest(state, run);
    assert_eq!(
        m["ok"],
        false,
        "{}",
        String::from_utf8_lossy(&a.get_output().stderr)
    );
    assert_eq!(m["oracle"]["ok"], false);
    let cmds = m["oracle"]["commands"].as_array().unwrap();
    assert_eq!(cmds.len(), 2);
    assert_eq!(cmds[0]["ok"], true);
    assert_eq!(cmds[1]["ok"], false);
    assert!(
        m["error"].as_str().unwrap().contains("oracle"),
        "{}",
        m["error"]
    );

    // Rewriting to collect-only is an explicit flag, and recorded.
    let m = build_with(
        "py-pyproject",
        run,
        state,
        &[
            "--oracle-file",
            pass.to_str().unwrap(),
            "--oracle-collect-only",
        ],
    );
    let cmd = &m["oracle"]["commands"][0];
    assert!(
        cmd["command"].as_str().unwrap().contains("--collect-only"),
        "{cmd}"
    );
    assert_eq!(cmd["rewritten_from"], ".venv/bin/python -m pytest -q");
}

/// `--resume-from IMAGE` without `--start-at-block` infers the block from the tag
/// and runs only the blocks after it.
fn check_resume_from(state: &Path, run: &str) {
    let resumed = format!("{run}-r");
    let _guard = RunGuard(resumed.clone());
    let image = format!("belay:{run}-003-20-python-runtime-success");
    let m = build_with("py-pyproject", &resumed, state, &["--resume-from", &image]);
    let ran: Vec<&str> = m["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["phase"] == "block")
        .map(|e| e["block_id"].as_str().unwrap())
        .collect();
    assert_eq!(ran, ["30-python-deps", "50-test-tooling"]);
    let statuses: Vec<&str> = m["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["skipped", "skipped", "skipped", "succeeded", "succeeded"]
    );
    // The Dockerfile still starts from the true base, recorded on the checkpoint.
    assert_eq!(m["base_image"], BASE_IMAGE);
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "2 passed");
}

#[test]
fn node_fixture_builds_and_its_tests_pass() {
    let run = run_id("node");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("node-npm", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(&m, "npm test", "# pass 2");
    project_tests_pass(
        &m,
        "test -f node_modules/is-number/package.json && echo dep-installed",
        "dep-installed",
    );
}

/// Node newer than Debian's (`.nvmrc` 20 on bookworm's 18) from the npm
/// registry's `node` package, pnpm at the version `packageManager` pins
/// (with corepack's hash, which no registry knows), and an install script
/// that downloads a browser told not to: the build passes, and the final
/// image runs the project's tests with that node.
#[test]
fn a_pinned_node_and_pnpm_build_and_its_tests_pass() {
    let run = run_id("nodepin");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("node-pnpm-pinned", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(&m, "node -p 'process.versions.node.split(\".\")[0]'", "20");
    project_tests_pass(&m, "pnpm --version", "9.2.0");
    // A sandbox's HOME is a fresh directory: pnpm still runs, offline.
    project_tests_pass(&m, "HOME=/tmp/elsewhere pnpm --version", "9.2.0");
    project_tests_pass(&m, "pnpm test 2>&1", "# pass 2");
    // pnpm came from corepack (npm's package of it: neither Debian's node
    // nor the npm registry's ships one), checked against the hash
    // `packageManager` pins, and the final image keeps it (COREPACK_HOME).
    let runtime = phases(&m, "block")
        .into_iter()
        .find(|e| e["block_id"] == "20-node-runtime")
        .unwrap();
    let log = std::fs::read_to_string(runtime["log_path"].as_str().unwrap()).unwrap();
    assert!(log.contains("belay: pnpm 9.2.0 from corepack"), "{log}");
}

/// A yarn berry project (a `__metadata` lockfile, `packageManager`
/// yarn 4, `nodeLinker: node-modules` in its `.yarnrc.yml`): yarn at the
/// pinned version from its npm package, a `node_modules` tree, and the final
/// image keeps the linker, so that `yarn test` there finds the project
/// installed (without it yarn says the project "doesn't seem to have been
/// installed").
#[test]
fn a_yarn_berry_project_builds_and_yarn_test_passes_in_the_image() {
    let run = run_id("berry");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("node-yarn-berry", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(&m, "yarn --version", "4.18.1");
    project_tests_pass(&m, "echo $YARN_NODE_LINKER", "node-modules");
    project_tests_pass(
        &m,
        "test -f node_modules/is-number/package.json && test ! -e .pnp.cjs && echo linked",
        "linked",
    );
    project_tests_pass(&m, "yarn test 2>&1", "berry tests pass");
}

/// The same project with no `.yarnrc.yml` and yarn's advised `.gitignore`
/// (`.pnp.*`): Plug'n'Play, yarn's default, as its CI has it. No `node_modules` is made; the archives `.pnp.cjs` names,
/// the unplugged packages and the install state are under `/opt/belay/yarn`
/// (in the image, outside the project, which a mode's sandbox mounts its
/// work tree over), and `yarn test` passes offline in the final image under
/// a fresh `HOME`. (A plan run gates in this image: `plan` tests.)
#[test]
fn a_yarn_plug_n_play_project_keeps_its_linker_and_yarn_test_passes() {
    let run = run_id("pnp");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("node-yarn-pnp", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(
        &m,
        "test -f .pnp.cjs && test ! -e node_modules && test ! -e .yarn/cache && test -f /opt/belay/yarn/install-state.gz && ls /opt/belay/yarn/cache | grep -c '^is-number-'",
        "1",
    );
    project_tests_pass(&m, "HOME=$(mktemp -d) yarn test 2>&1", "berry tests pass");
}

/// A native addon of the project's own: the plan installs node-gyp's
/// toolchain and Debian's node headers, so that it compiles at install with
/// no way to nodejs.org, and the final image runs its tests.
#[test]
fn a_native_addon_compiles_without_the_network_and_its_tests_pass() {
    let run = run_id("nodegyp");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("node-native-addon", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(
        &m,
        "test -f build/Release/greet.node && echo built",
        "built",
    );
    project_tests_pass(&m, "npm test 2>&1", "# pass 1");
}

/// An npm workspaces monorepo: one install at the root links the
/// workspaces (one requires the other) and fetches their dependencies, and
/// the root's test runs every workspace's tests in the final image.
#[test]
fn an_npm_workspaces_monorepo_builds_and_every_workspaces_tests_pass() {
    let run = run_id("nodews");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("node-workspaces", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(&m, "npm test 2>&1", "cli uses the core workspace");
    project_tests_pass(&m, "npm test 2>&1", "core doubles");
}

/// The same monorepo as a pnpm workspace (`pnpm-workspace.yaml`, the
/// `workspace:` protocol, pnpm pinned by `packageManager`).
#[test]
fn a_pnpm_workspace_builds_and_every_packages_tests_pass() {
    let run = run_id("pnpmws");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("node-pnpm-workspaces", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(&m, "pnpm test 2>&1", "cli uses the core workspace");
    project_tests_pass(&m, "pnpm test 2>&1", "core doubles");
}

/// A pnpm 7 project (lockfile 5.4) that pins no pnpm: the newest pnpm
/// refuses its lockfile ("lockfileVersion of 5.4 is incompatible"), so the
/// build installs the pnpm that writes it, and its tests pass.
#[test]
fn a_pnpm_lockfile_without_a_pin_gets_the_pnpm_that_wrote_it() {
    let run = run_id("pnpmv5");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("node-pnpm-lockfile-v5", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(&m, "pnpm --version 2>&1", "7.");
    project_tests_pass(&m, "pnpm test 2>&1", "# pass 1");
}

#[test]
fn rust_fixture_builds_and_its_tests_pass() {
    let run = run_id("rust");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build("rust-crate", &run, state.path());
    all_blocks_succeeded(&m);
    project_tests_pass(&m, "cargo test --offline 2>&1", "test result: ok. 1 passed");
}

#[test]
fn go_fixture_builds_and_its_tests_pass() {
    let run = run_id("go");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    // The base comes from a Dockerfile, built through the Engine API.
    let df_dir = tempfile::tempdir().unwrap();
    let df = df_dir.path().join("Dockerfile");
    std::fs::write(
        &df,
        format!("FROM {BASE_IMAGE}\nRUN echo custom-base > /etc/belay-test-marker\n"),
    )
    .unwrap();
    let m = build_with(
        "go-module",
        &run,
        state.path(),
        &["--base-dockerfile", df.to_str().unwrap()],
    );
    all_blocks_succeeded(&m);
    assert_eq!(m["base_image"], format!("belay:{run}-base").as_str());
    assert!(m["executions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["phase"] == "docker_build" && e["exit_code"] == 0));
    project_tests_pass(&m, "cat /etc/belay-test-marker", "custom-base");
    project_tests_pass(&m, "go test ./... 2>&1", "ok  \texample.com/calc");
}

/// manifest.json, executions.jsonl, logs and scripts are as FORMATS.md §1 says.
fn check_run_records(state: &Path, run: &str, m: &Value) {
    let dir = state.join("runs").join(run);
    for k in [
        "ok",
        "run_id",
        "state_dir",
        "scripts_dir",
        "manifest_path",
        "llm_usage_path",
        "final_image",
        "error",
        "llm_usage",
        "ablation_mode",
        "progress_control",
        "final_clean_replay_enabled",
        "final_clean_replay_ok",
        "final_clean_replay_image",
        "final_clean_replay_failure_stage",
        "blocks",
        "checkpoints",
        "executions",
    ] {
        assert!(m.get(k).is_some(), "manifest lacks {k}");
    }
    for k in [
        "forward_granularity",
        "recovery_granularity",
        "local_repair",
        "patch_back",
        "checkpoint_rollback",
        "final_clean_replay",
    ] {
        assert!(
            m["progress_control"].get(k).is_some(),
            "progress_control lacks {k}"
        );
    }
    assert_eq!(m["run_id"], run);
    assert_eq!(
        Path::new(m["manifest_path"].as_str().unwrap()),
        dir.join("manifest.json")
    );
    let blocks = m["blocks"].as_array().unwrap();
    let ids: Vec<&str> = blocks.iter().map(|b| b["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "00-preflight",
            "10-system-packages",
            "20-python-runtime",
            "30-python-deps",
            "50-test-tooling"
        ]
    );
    for (i, b) in blocks.iter().enumerate() {
        for k in [
            "id",
            "title",
            "goal",
            "script",
            "order",
            "validation_command",
            "status",
            "last_error",
            "baseline_checkpoint",
            "success_checkpoint",
            "repair_attempts",
        ] {
            assert!(b.get(k).is_some(), "block lacks {k}");
        }
        let id = b["id"].as_str().unwrap();
        let tag = format!("belay:{run}-{:03}-{id}-success", i + 1);
        assert_eq!(b["success_checkpoint"], tag.as_str());
        let (ok, _, _) = docker(&["image", "inspect", &tag]);
        assert!(ok, "checkpoint image {tag} is missing");
        let script = std::fs::read_to_string(dir.join("scripts").join(format!("{id}.sh"))).unwrap();
        assert_eq!(
            script,
            b["script"].as_str().unwrap(),
            "scripts/{id}.sh differs from the manifest"
        );
        let block_file = read_json(&dir.join("blocks").join(format!("{id}.json")));
        assert_eq!(block_file["status"], "succeeded");
    }
    // Each block's baseline is the previous checkpoint.
    assert_eq!(
        blocks[1]["baseline_checkpoint"],
        blocks[0]["success_checkpoint"]
    );
    let cps = m["checkpoints"].as_array().unwrap();
    assert_eq!(
        cps.len(),
        blocks.len() + 1,
        "a workspace checkpoint plus one per block"
    );
    // The toolchain blocks run before the repository copy, which sits on
    // the last of them; the blocks after it start from the workspace.
    let under = m["toolchain"]["blocks"].as_array().unwrap();
    assert_eq!(
        under
            .iter()
            .map(|b| b.as_str().unwrap())
            .collect::<Vec<_>>(),
        ["00-preflight", "10-system-packages", "20-python-runtime"]
    );
    let ws = &cps[under.len()];
    assert_eq!(
        ws["image_ref"],
        format!("belay:{run}-000-workspace-success").as_str()
    );
    assert_eq!(
        ws["parent_image_ref"],
        blocks[under.len() - 1]["success_checkpoint"]
    );
    assert_eq!(blocks[under.len()]["baseline_checkpoint"], ws["image_ref"]);
    for c in cps {
        for k in ["id", "image_ref", "block_id", "parent_image_ref", "kind"] {
            assert!(c.get(k).is_some(), "checkpoint lacks {k}");
        }
    }
    // executions.jsonl: one record per command, each pointing at its full log.
    let text = std::fs::read_to_string(dir.join("executions.jsonl")).unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), m["executions"].as_array().unwrap().len());
    let phases: std::collections::BTreeSet<&str> = records
        .iter()
        .map(|r| r["phase"].as_str().unwrap())
        .collect();
    for p in ["container_preflight", "block", "validation", "finalize"] {
        assert!(phases.contains(p), "no {p} execution recorded");
    }
    for r in &records {
        for k in [
            "block_id",
            "phase",
            "attempt",
            "exit_code",
            "timed_out",
            "stdout_tail",
            "stderr_tail",
            "checkpoint_before",
            "checkpoint_after",
            "repair_command",
            "duration_s",
            "command",
            "log_path",
        ] {
            assert!(r.get(k).is_some(), "execution lacks {k}: {r}");
        }
        if let Some(log) = r["log_path"].as_str() {
            let block_dir = dir.join("logs").join(r["block_id"].as_str().unwrap());
            let expected = block_dir.join(format!(
                "{}-attempt-{}.log",
                r["phase"].as_str().unwrap(),
                r["attempt"]
            ));
            if r["phase"] == "validation" && Path::new(log) != expected {
                // A validation run in its block's exec shares the block's log,
                // after the boundary line.
                let name = Path::new(log).file_name().unwrap().to_str().unwrap();
                assert!(
                    Path::new(log).parent() == Some(block_dir.as_path())
                        && name.starts_with("block-attempt-"),
                    "{log}"
                );
                let text = std::fs::read_to_string(log).unwrap();
                let boundary = format!("[belay] validation: {}", r["command"].as_str().unwrap());
                assert!(
                    text.contains(&boundary),
                    "no boundary line in {log}:\n{text}"
                );
            } else {
                assert_eq!(Path::new(log), expected);
            }
            assert!(Path::new(log).is_file(), "log {log} missing");
        }
    }
    let deps_log =
        std::fs::read_to_string(dir.join("logs/30-python-deps/block-attempt-1.log")).unwrap();
    // The installer's (uv's) whole output, down to each package it installed.
    assert!(
        deps_log.contains("Installed 7 packages") && deps_log.contains(" + six==1.16.0"),
        "full installer output is in the log:\n{deps_log}"
    );
    let ctx = read_json(&dir.join("context.json"));
    assert_eq!(ctx["runtime_notes"]["observed"], true);
    assert_eq!(ctx["runtime_notes"]["os_id"], "debian");
    assert!(dir.join("llm-usage.json").is_file());
}

fn check_shell(run: &str) {
    let a = belay()
        .args([
            "env",
            "shell",
            run,
            "--",
            ".venv/bin/python",
            "-c",
            "import calc; print(calc.add(20, 22))",
        ])
        .assert()
        .success();
    assert_eq!(String::from_utf8_lossy(&a.get_output().stdout).trim(), "42");
    // The exit code of the command is passed through.
    belay()
        .args(["env", "shell", run, "--", "bash", "-c", "exit 7"])
        .assert()
        .code(7);
}

/// The written Dockerfiles rebuild an equivalent image with plain `docker
/// build`: `Dockerfile.legacy` with the legacy builder, `Dockerfile` (its
/// package caches as cache mounts) with BuildKit, and the caches stay out of
/// the image.
fn check_dockerfile_rebuilds(state: &Path, run: &str) {
    let ctx = tempfile::tempdir().unwrap();
    let copy = |from: &Path, to: &Path| {
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    };
    copy(&fixture("py-pyproject").join("."), ctx.path());
    copy(&state.join("runs").join(run), &ctx.path().join("belay-run"));
    let mut legacy = std::process::Command::new("docker");
    legacy.env("DOCKER_BUILDKIT", "0");
    for (mut cmd, file) in [
        (legacy, "belay-run/Dockerfile.legacy"),
        (buildkit_docker(), "belay-run/Dockerfile"),
    ] {
        let tag = format!("belay-test-rebuild:{run}");
        let out = cmd
            .args(["build", "-q", "-t", &tag, "-f", file, "."])
            .current_dir(ctx.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docker build of {file} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (ok, o, e) = docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            &tag,
            "bash",
            "-c",
            ".venv/bin/python -m pytest -q && echo caches: $(find /mnt -type f | wc -l)",
        ]);
        docker(&["rmi", "-f", &tag]);
        assert!(ok && o.contains("2 passed"), "{file}: {o}\n{e}");
        assert!(
            o.contains("caches: 0"),
            "{file}: a cache is in the image: {o}"
        );
    }
}

/// A docker CLI that builds with BuildKit: `docker` with buildx, or the
/// Debian docker.io client (before 23, BuildKit is built in).
fn buildkit_docker() -> std::process::Command {
    let buildx = std::process::Command::new("docker")
        .args(["buildx", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let cli = if buildx { "docker" } else { "/usr/bin/docker" };
    let mut c = std::process::Command::new(cli);
    c.env("DOCKER_BUILDKIT", "1");
    assert!(
        buildx || Path::new(cli).exists(),
        "no docker CLI with BuildKit: install buildx, or Debian's docker.io (scripts/setup-host.sh does)"
    );
    c
}
