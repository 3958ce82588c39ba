//! agentic-dev-loop's pipeline files, from its README: each loads, or fails
//! with `file:line:col` and the mapping to use; `--explain-compat` explains each key.

use std::path::{Path, PathBuf};

use belay_pipeline::schema::{EgressClass, OpenNet};

fn peer(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/peer-compat")
        .join(rel)
}

#[test]
fn the_readme_example_is_refused_at_its_extensions_line_with_the_mapping() {
    let e = belay_pipeline::load(&peer("readme.pipeline.yaml"))
        .unwrap_err()
        .to_string();
    // `extensions:` is on line 4; its value starts on line 5.
    assert!(e.contains("readme.pipeline.yaml:5:"), "{e}");
    assert!(
        e.contains("additional_files") && e.contains("params: {script"),
        "{e}"
    );
}

#[test]
fn the_consumer_shape_loads_as_it_is_and_maps_each_peer_form() {
    let p = belay_pipeline::load(&peer("consumer/agentic-dev-loop/pipeline.yaml")).unwrap();
    // caches as strings: workspace caches, never committed.
    let c: Vec<Option<&str>> = p.caches.iter().map(|c| c.in_workspace()).collect();
    assert_eq!(
        c,
        [
            Some(".nuget-packages"),
            Some("qa/node_modules"),
            Some("qa/.browsers"),
            Some("frontend-editor/node_modules")
        ]
    );
    // Egress per step, and the browser class.
    assert_eq!(
        p.step("restore").unwrap().egress.kind(),
        OpenNet::Registries
    );
    assert_eq!(
        p.step("qa").unwrap().egress.class,
        Some(EgressClass::Browser)
    );
    assert_eq!(p.step("qa").unwrap().egress.kind(), OpenNet::Browser);
    assert_eq!(p.step("test").unwrap().egress.kind(), OpenNet::Bridge);
    // The provider prefix chose the dialect and is not sent.
    let llm = p.llm.as_ref().unwrap();
    assert_eq!(llm.model, "deepseek-v4-pro");
    assert_eq!(llm.api, Some(belay_model::Api::ChatCompletions));
    assert_eq!(p.llm_provider.as_deref(), Some("openai"));
    // The dev step is uncapped, as the peer; qa keeps its 60.
    assert_eq!(p.step("dev").unwrap().max_iterations, None);
    assert_eq!(p.step("qa").unwrap().max_iterations, Some(60));
    let plan = belay_pipeline::dryrun::plan(&p, Some(Path::new("/state")));
    assert!(
        plan.contains("limits: max_iterations uncapped, timeout none"),
        "{plan}"
    );
    assert!(plan.contains("limits: max_iterations 60"), "{plan}");
    assert!(plan.contains("any public host on 80/443"), "{plan}");
    assert!(
        plan.contains("sync_excludes **/bin/**, **/obj/**"),
        "{plan}"
    );
    assert!(
        plan.contains("from the provider prefix `openai/`"),
        "{plan}"
    );
}

fn with(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let e = belay_pipeline::parse(text, &dir.path().join("pipeline.yaml"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    e
}

#[test]
fn a_bad_seccomp_profile_fails_at_load_so_the_dry_run_catches_it() {
    let e = with("name: x\nisolation:\n  seccomp_profile: bundled:nope\nsteps:\n  - name: t\n    command: 'true'\n");
    assert!(
        e.contains("pipeline.yaml:3:3") && e.contains("bundled:chromium-userns"),
        "{e}"
    );
    let e = with("name: x\nisolation:\n  seccomp_profile: missing.json\nsteps:\n  - name: t\n    command: 'true'\n");
    assert!(
        e.contains("pipeline.yaml:3:3") && e.contains("is not a file"),
        "{e}"
    );
    assert_eq!(with("name: x\nisolation:\n  seccomp_profile: bundled:chromium-userns\nsteps:\n  - name: t\n    command: 'true'\n"), "");
}

#[test]
fn step_egress_needs_the_network_and_a_provider_without_endpoint_needs_base_url() {
    let e = with("name: x\nsteps:\n  - name: t\n    command: 'true'\n    egress: {presets: [package-registries]}\n");
    assert!(
        e.contains("pipeline.yaml:5:") && e.contains("network: true"),
        "{e}"
    );
    let e = with("name: x\nsteps:\n  - name: t\n    command: 'true'\n    network: true\n    egress: {presets: [pypi]}\n");
    assert!(e.contains("unknown egress preset `pypi`"), "{e}");
    let e = with("name: x\nllm:\n  model: deepseek/deepseek-chat\nsteps:\n  - name: t\n    command: 'true'\n");
    assert!(
        e.contains("pipeline.yaml:3:3") && e.contains("llm.base_url"),
        "{e}"
    );
    let e = with("name: x\ncaches: [../outside]\nsteps:\n  - name: t\n    command: 'true'\n");
    assert!(
        e.contains("pipeline.yaml:2:") && e.contains("no `..`"),
        "{e}"
    );
}

#[test]
fn explain_compat_maps_every_key_and_names_the_refused_one() {
    let path = peer("readme.pipeline.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let out = belay_pipeline::compat::explain(&text, Path::new("readme.pipeline.yaml")).unwrap();
    assert!(
        out.contains("readme.pipeline.yaml:4:1  extensions"),
        "{out}"
    );
    assert!(out.contains("REFUSED"), "{out}");
    assert!(
        out.contains("llm.model")
            && out
                .contains("provider `openai` -> dialect chat-completions, model `deepseek-v4-pro`"),
        "{out}"
    );
    assert!(
        out.contains("steps[dev].max_iterations") && out.contains("uncapped"),
        "{out}"
    );
    assert!(
        out.contains("steps[review].artifact") && out.contains("/workspace/artifacts"),
        "{out}"
    );
    assert!(
        out.trim_end()
            .ends_with("change those lines, then `belay run --dry-run`"),
        "{out}"
    );
    let consumer = peer("consumer/agentic-dev-loop/pipeline.yaml");
    let out =
        belay_pipeline::compat::explain(&std::fs::read_to_string(&consumer).unwrap(), &consumer)
            .unwrap();
    assert!(out.contains("0 refused, 0 unknown"), "{out}");
    assert!(
        out.contains("steps[qa].egress") && out.contains("caches") && out.contains("mapped:"),
        "{out}"
    );
}
