#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Snapshot tests of the rules planner: for every fixture repository, the
//! analysed context and the planned blocks (ids, validations, full scripts).

use std::path::PathBuf;

use belay_env::analyze::analyze;
use belay_env::plan::plan_rules;
use belay_env::preflight::RuntimeNotes;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn render(name: &str) -> String {
    let ctx = analyze(&fixtures().join(name)).unwrap();
    let blocks = plan_rules(&ctx, &RuntimeNotes::assumed_debian()).unwrap();
    let mut ctx_json = serde_json::to_value(&ctx).unwrap();
    ctx_json["repo_path"] = serde_json::Value::String("<repo>".into());
    let suite = belay_env::base_suite::choose(ctx.python.as_ref()).unwrap();
    let mut out = format!(
        "context:\n{}\nbase: {} (Python {}): {}\n",
        serde_json::to_string_pretty(&ctx_json).unwrap(),
        suite.image(),
        suite.python,
        suite.reason
    );
    for b in &blocks {
        out.push_str(&format!(
            "\n=== {} (order {}{}) — {}\nvalidation: {}\n{}",
            b.id,
            b.order,
            if b.before_workspace {
                ", before the repository copy"
            } else {
                ""
            },
            b.title,
            b.validation_command,
            b.script
        ));
    }
    out
}

macro_rules! plan_snapshot {
    ($test:ident, $fixture:literal) => {
        #[test]
        fn $test() {
            insta::assert_snapshot!($fixture, render($fixture));
        }
    };
}

plan_snapshot!(python_pyproject, "py-pyproject");
plan_snapshot!(python_poetry, "py-poetry");
plan_snapshot!(python_requirements_native, "py-requirements-native");
plan_snapshot!(node_npm, "node-npm");
plan_snapshot!(node_yarn_jest, "node-yarn-jest");
plan_snapshot!(node_yarn_berry, "node-yarn-berry");
plan_snapshot!(node_yarn_pnp, "node-yarn-pnp");
plan_snapshot!(node_pnpm_pinned, "node-pnpm-pinned");
plan_snapshot!(node_native_addon, "node-native-addon");
plan_snapshot!(node_workspaces, "node-workspaces");
plan_snapshot!(node_pnpm_workspaces, "node-pnpm-workspaces");
plan_snapshot!(node_pnpm_lockfile_v5, "node-pnpm-lockfile-v5");
plan_snapshot!(node_script_download, "node-script-download");
plan_snapshot!(rust_crate, "rust-crate");
plan_snapshot!(go_module, "go-module");
plan_snapshot!(java_maven, "java-maven");
plan_snapshot!(cmake_c, "cmake-c");
plan_snapshot!(two_languages, "multi-py-node");
plan_snapshot!(three_languages, "polyglot");
plan_snapshot!(no_manifest, "empty-repo");
plan_snapshot!(python_vendored_native_dependency, "py-native-ffi");
plan_snapshot!(python_broken_tests, "py-broken-tests");
plan_snapshot!(python_test_plugins, "py-test-plugins");
plan_snapshot!(python_import_names, "py-import-names");
plan_snapshot!(python_shared_library, "py-shared-lib");
plan_snapshot!(python_monorepo, "py-monorepo");
plan_snapshot!(python_network_at_collection, "py-network-collect");
plan_snapshot!(python_pbr, "py-pbr");
plan_snapshot!(python_resolver, "py-resolver");
plan_snapshot!(python_312, "py-python312");
plan_snapshot!(python_conflicting_pins, "py-conflicting-pins");
plan_snapshot!(python_dependency_groups, "py-dependency-groups");

#[test]
fn every_fixture_has_a_snapshot_test() {
    let src = include_str!("main.rs");
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            src.contains(&format!("\"{name}\")")),
            "fixture {name} has no plan snapshot test"
        );
    }
}

#[test]
fn block_ids_follow_the_seed_numbering() {
    let ctx = analyze(&fixtures().join("multi-py-node")).unwrap();
    let ids: Vec<String> = plan_rules(&ctx, &RuntimeNotes::assumed_debian())
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(
        ids,
        [
            "00-preflight",
            "10-system-packages",
            "20-python-runtime",
            "21-node-runtime",
            "30-python-deps",
            "31-node-deps",
            "50-test-tooling"
        ]
    );
    let ctx = analyze(&fixtures().join("polyglot")).unwrap();
    let ids: Vec<String> = plan_rules(&ctx, &RuntimeNotes::assumed_debian())
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert!(
        ids.contains(&"20-runtime-toolchain".to_string())
            && ids.contains(&"30-project-dependencies".to_string()),
        "{ids:?}"
    );
}

#[test]
fn a_rust_build_backend_gets_cargo() {
    // bcrypt 4.1.3's build-system: its Rust lives in src/_bcrypt, not at the root.
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("pyproject.toml"),
        "[build-system]\nrequires = [\"setuptools>=42.0.0\", \"wheel\", \"setuptools-rust\"]\nbuild-backend = \"setuptools.build_meta\"\n\n[project]\nname = \"bcrypt\"\nversion = \"4.1.3\"\n",
    )
    .unwrap();
    let ctx = analyze(d.path()).unwrap();
    assert!(ctx.python.as_ref().unwrap().needs_rust);
    assert!(ctx.rust.is_none());
    let blocks = plan_rules(&ctx, &RuntimeNotes::assumed_debian()).unwrap();
    let runtime = blocks.iter().find(|b| b.id == "20-python-runtime").unwrap();
    assert!(runtime.script.contains("cargo-web"), "{}", runtime.script);
    // Without a Rust backend, no toolchain.
    std::fs::write(
        d.path().join("pyproject.toml"),
        "[build-system]\nrequires = [\"setuptools\"]\n\n[project]\nname = \"x\"\nversion = \"1\"\n",
    )
    .unwrap();
    let ctx = analyze(d.path()).unwrap();
    let blocks = plan_rules(&ctx, &RuntimeNotes::assumed_debian()).unwrap();
    assert!(blocks.iter().all(|b| !b.script.contains("cargo")));
}

#[test]
fn runtime_notes_change_the_plan() {
    // An image that already has python3 with venv support needs no apt install for it.
    let ctx = analyze(&fixtures().join("py-pyproject")).unwrap();
    let mut notes = RuntimeNotes::assumed_debian();
    notes
        .tools
        .insert("python3".into(), "/usr/bin/python3".into());
    notes.python_venv = true;
    let blocks = plan_rules(&ctx, &notes).unwrap();
    let runtime = blocks.iter().find(|b| b.id == "20-python-runtime").unwrap();
    assert!(
        !runtime.script.contains("apt-get install"),
        "{}",
        runtime.script
    );
    // A non-apt image is refused with a clear reason.
    notes.package_manager = Some("apk".into());
    notes.os_pretty = "Alpine Linux v3.20".into();
    let err = plan_rules(&ctx, &notes).unwrap_err().to_string();
    assert!(err.contains("Alpine") && err.contains("Debian"), "{err}");
}
