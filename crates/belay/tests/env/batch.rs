//! `belay env build-projects`: three projects, two at a time, one failing: git
//! checkout of a short commit with `.github` quarantined, local paths, the
//! summary, and failed-projects.log.

use serde_json::Value;

use crate::common::*;
use crate::git_cli::git;

/// `build-projects --jobs 2 --no-cache` of `projects`.
fn build_projects(
    prefix: &str,
    projects: &std::path::Path,
    pdir: &std::path::Path,
    odir: &std::path::Path,
) -> assert_cmd::assert::Assert {
    belay()
        .args([
            "env",
            "build-projects",
            "--jobs",
            "2",
            "--no-cache",
            "--run-id-prefix",
            prefix,
            "--projects-file",
        ])
        .arg(projects)
        .arg("--projects-dir")
        .arg(pdir)
        .arg("--oracles-dir")
        .arg(odir)
        .assert()
}

#[test]
fn three_projects_two_jobs_one_failing() {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let prefix = run_id("batch");
    // A git project, referenced by a short commit, with CI files to quarantine.
    let gp = tmp.path().join("gitproj");
    std::fs::create_dir_all(gp.join(".github/workflows")).unwrap();
    std::fs::write(gp.join("README.md"), "git project\n").unwrap();
    std::fs::write(gp.join(".github/workflows/ci.yml"), "on: push\n").unwrap();
    git(&gp, &["init", "-q"]);
    git(&gp, &["add", "-A"]);
    git(&gp, &["commit", "-q", "-m", "init"]);
    let short = git(&gp, &["rev-parse", "--short=7", "HEAD"]);
    std::fs::write(
        gp.join("later.txt"),
        "a later commit that must not be checked out\n",
    )
    .unwrap();
    git(&gp, &["add", "-A"]);
    git(&gp, &["commit", "-q", "-m", "later"]);
    // A local project that builds, and one whose dependency does not exist.
    std::fs::create_dir_all(tmp.path().join("local-ok")).unwrap();
    std::fs::write(tmp.path().join("local-ok/README.md"), "ok\n").unwrap();
    std::fs::create_dir_all(tmp.path().join("local-bad")).unwrap();
    std::fs::write(
        tmp.path().join("local-bad/requirements.txt"),
        "belay-no-such-package-xyz==1.0.0\n",
    )
    .unwrap();

    let projects = tmp.path().join("projects.txt");
    std::fs::write(
        &projects,
        format!("# three projects\n\nfile://{} {short}\n./local-ok\n./local-bad  # fails: no such package\n", gp.display()),
    )
    .unwrap();
    let pdir = tmp.path().join("projects");
    let odir = tmp.path().join("oracles");
    let runs: Vec<String> = ["gitproj", "local-ok", "local-bad"]
        .iter()
        .map(|n| format!("{prefix}-{n}"))
        .collect();
    let _guards: Vec<RunGuard> = runs.iter().map(|r| RunGuard(r.clone())).collect();

    let a = build_projects(&prefix, &projects, &pdir, &odir).code(1);
    let stdout = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(
        stdout.contains("2 ok, 1 failed, 0 skipped of 3"),
        "{stdout}"
    );

    let s: Value = read_json(&pdir.join("build-projects-summary.json"));
    assert_eq!(
        (s["total"].as_u64(), s["ok"].as_u64(), s["failed"].as_u64()),
        (Some(3), Some(2), Some(1))
    );
    let by_name = |n: &str| {
        s["projects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_name("gitproj")["status"], "ok");
    assert_eq!(by_name("local-ok")["status"], "ok");
    let bad = by_name("local-bad");
    assert_eq!(bad["status"], "failed");
    assert_eq!(bad["stage"], "build_failed");
    assert!(
        bad["error"].as_str().unwrap().contains("30-python-deps"),
        "{}",
        bad["error"]
    );
    // Each project has its own run id and image prefix.
    let ids: std::collections::BTreeSet<&str> = s["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["run_id"].as_str().unwrap())
        .collect();
    let prefixes: std::collections::BTreeSet<&str> = s["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["image_prefix"].as_str().unwrap())
        .collect();
    assert_eq!((ids.len(), prefixes.len()), (3, 3));
    assert!(by_name("gitproj")["final_image"]
        .as_str()
        .unwrap()
        .starts_with("belay-gitproj:"));

    // failed-projects.log: tab-separated source, ref, checkout dir, repo path, stage.
    let log = std::fs::read_to_string(pdir.join("failed-projects.log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 1, "{log}");
    let fields: Vec<&str> = lines[0].split('\t').collect();
    assert_eq!(fields.len(), 5, "{:?}", lines[0]);
    assert!(
        fields[0].ends_with("local-bad") && fields[4] == "build_failed",
        "{fields:?}"
    );

    // The short commit was resolved and checked out; .github went to the oracles dir.
    assert_eq!(
        git(&pdir.join("gitproj"), &["rev-parse", "--short=7", "HEAD"]),
        short
    );
    assert!(!pdir.join("gitproj/later.txt").exists());
    assert!(!pdir.join("gitproj/.github").exists());
    assert!(odir.join("gitproj/.github/workflows/ci.yml").is_file());

    // --skip-existing-success skips what succeeded in the same ablation mode only.
    let a = belay()
        .args([
            "env",
            "build-projects",
            "--no-cache",
            "--skip-existing-success",
            "--only",
            "local-ok",
            "--run-id-prefix",
            &prefix,
            "--projects-file",
        ])
        .arg(&projects)
        .arg("--projects-dir")
        .arg(&pdir)
        .assert()
        .success();
    assert!(
        String::from_utf8_lossy(&a.get_output().stdout).contains("0 ok, 0 failed, 1 skipped of 1")
    );
}

#[test]
fn projects_file_errors_name_the_line() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("projects.txt");
    std::fs::write(&p, "# fine\nowner/repo abc123\nthis line is wrong\n").unwrap();
    let a = belay()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["env", "build-projects", "--projects-file"])
        .arg(&p)
        .arg("--projects-dir")
        .arg(tmp.path().join("d"))
        .assert()
        .code(3);
    // No daemon: the engine error comes first; with a daemon the file is checked.
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("Docker daemon"), "{err}");
    require_engine();
    let a = belay()
        .args(["env", "build-projects", "--projects-file"])
        .arg(&p)
        .arg("--projects-dir")
        .arg(tmp.path().join("d"))
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("projects.txt:3:"), "{err}");
    // owner/repo lines need a base URL.
    std::fs::write(&p, "owner/repo abc123\n").unwrap();
    let a = belay()
        .env_remove("BELAY_GIT_BASE_URL")
        .args(["env", "build-projects", "--projects-file"])
        .arg(&p)
        .arg("--projects-dir")
        .arg(tmp.path().join("d"))
        .assert()
        .code(2);
    assert!(String::from_utf8_lossy(&a.get_output().stderr).contains("--git-base-url"));
}

/// A git URL with credentials in a projects file: the clone gets them, and no
/// output of the batch shows them (failed-projects.log, the summary, the run
/// records, the printed table, the error messages).
#[test]
fn credentials_in_a_project_url_appear_in_no_batch_output() {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("projects.txt");
    // Port 9 on loopback refuses at once: the clone fails, which is what
    // makes the batch write the URL into its failure records.
    std::fs::write(&p, "http://bi-user:bi-pass-5e7a91@127.0.0.1:9/r.git\n").unwrap();
    let pdir = tmp.path().join("d");
    let a = belay()
        .env("BELAY_STATE_HOME", tmp.path().join("registry"))
        .args(["env", "build-projects", "--projects-file"])
        .arg(&p)
        .arg("--projects-dir")
        .arg(&pdir)
        .assert();
    let out = a.get_output();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!printed.contains("bi-pass-5e7a91"), "{printed}");
    assert!(!printed.contains("bi-user:"), "{printed}");
    let failed = std::fs::read_to_string(pdir.join("failed-projects.log")).unwrap();
    assert!(
        failed.starts_with("http://127.0.0.1:9/r.git\t"),
        "the failure names the project without its credentials: {failed}"
    );
    for dir in [pdir.clone(), tmp.path().join("registry")]
        .into_iter()
        .filter(|d| d.exists())
    {
        let hits = files_containing(&dir, "bi-pass-5e7a91");
        assert!(hits.is_empty(), "these hold the password: {hits:?}");
    }
}

/// Two projects on the same base, two at a time, under `--no-cache`: each
/// toolchain block runs once for the batch (the second build waits for the
/// first and takes its checkpoint), both final images run their tests, and a
/// build outside the batch reuses none of it.
#[test]
fn a_batch_builds_each_toolchain_once_even_without_the_cache() {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let prefix = run_id("tcbatch");
    let names = ["py-pyproject", "py-test-plugins"];
    let projects = tmp.path().join("projects.txt");
    let lines: Vec<String> = names
        .iter()
        .map(|n| fixture(n).display().to_string())
        .collect();
    std::fs::write(&projects, lines.join("\n") + "\n").unwrap();
    let pdir = tmp.path().join("projects");
    let runs: Vec<String> = names.iter().map(|n| format!("{prefix}-{n}")).collect();
    let _guards: Vec<RunGuard> = runs.iter().map(|r| RunGuard(r.clone())).collect();
    build_projects(&prefix, &projects, &pdir, &tmp.path().join("oracles")).success();
    let state = pdir.join(".belay-state");
    let ms: Vec<Value> = runs.iter().map(|r| manifest(&state, r)).collect();
    let toolchain = ["00-preflight", "10-system-packages", "20-python-runtime"];
    let ran = |m: &Value| -> Vec<String> {
        phases(m, "block")
            .iter()
            .filter_map(|e| e["block_id"].as_str().map(String::from))
            .filter(|b| toolchain.contains(&b.as_str()))
            .collect()
    };
    // Each toolchain block ran in exactly one of the two builds.
    let mut all: Vec<String> = ms.iter().flat_map(ran).collect();
    all.sort();
    assert_eq!(all, toolchain, "{all:?}");
    for m in &ms {
        assert_eq!(m["cache"]["enabled"], false);
        let under: Vec<&str> = m["toolchain"]["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_str().unwrap())
            .collect();
        assert_eq!(under, toolchain);
        // What it did not run, it shared; what it shared, it did not run.
        let shared: Vec<String> = m["toolchain"]["shared"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_str().unwrap().to_string())
            .collect();
        let mut both: Vec<String> = ran(m).into_iter().chain(shared).collect();
        both.sort();
        assert_eq!(both, toolchain, "{}", m["toolchain"]);
    }
    // The two workspaces sit on one image, and the Dockerfile lays the same
    // toolchain before its COPY.
    let under_id = |m: &Value| -> String {
        let top = m["toolchain"]["image"].as_str().unwrap();
        m["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["image_ref"] == top)
            .map(|c| c["image_id"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(under_id(&ms[0]), under_id(&ms[1]));
    for (m, r) in ms.iter().zip(&runs) {
        let df =
            std::fs::read_to_string(state.join("runs").join(r).join("Dockerfile.legacy")).unwrap();
        let copy = df.find("COPY . /workspace/repo").unwrap();
        let runtime = df
            .find("RUN bash /belay/scripts/20-python-runtime.sh")
            .unwrap();
        let deps = df
            .find("RUN bash /belay/scripts/30-python-deps.sh")
            .unwrap();
        assert!(runtime < copy && copy < deps, "{df}");
        project_tests_pass(
            m,
            ".venv/bin/python -m pytest -q -p no:cacheprovider",
            "2 passed",
        );
    }

    // A build outside the batch, under --no-cache, reuses none of it.
    let run = run_id("tcsolo");
    let _guard = RunGuard(run.clone());
    let solo = tempfile::tempdir().unwrap();
    belay()
        .args(["env", "build", "--planner", "rules", "--no-cache", "--repo"])
        .arg(fixture("py-pyproject"))
        .arg("--state-dir")
        .arg(solo.path())
        .args(["--run-id", &run])
        .assert()
        .success();
    let m = manifest(solo.path(), &run);
    assert_eq!(m["toolchain"]["shared"], serde_json::json!([]));
    assert_eq!(ran(&m), toolchain);
}
