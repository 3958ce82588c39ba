//! The loader on bad input: located errors, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proptest::prelude::*;

mod compat;

const DEMO: &str = include_str!("../../../../examples/pipeline-demo/repo/pipeline.yaml");

fn demo_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/pipeline-demo/repo")
}

#[test]
fn the_demo_loads_with_its_agents() {
    let p = belay_pipeline::load(&demo_dir().join("pipeline.yaml")).unwrap();
    assert_eq!(p.steps.len(), 4);
    assert_eq!(p.agents["dev"].tools.len(), 6);
    assert!(p.agents["review"]
        .prompt
        .starts_with("You are the reviewer"));
    assert_eq!(
        p.step("test").unwrap().on_fail,
        belay_pipeline::Route::Step {
            step: "dev".into(),
            retry: true
        }
    );
    assert_eq!(
        p.step("dev").unwrap().on_fail,
        belay_pipeline::Route::Failure
    );
}

#[test]
fn agent_file_errors_are_located_at_the_step() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("agents")).unwrap();
    std::fs::write(dir.path().join("agents/dev.agent.md"), "no front matter\n").unwrap();
    let text =
        "name: x\nagents_dir: agents\ndeps_policy: open\nsteps:\n  - name: dev\n    agent: dev\n";
    let e = belay_pipeline::parse(text, &dir.path().join("pipeline.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pipeline.yaml:5:") && e.contains("front matter"),
        "{e}"
    );
    let text = "name: x\nagents_dir: agents\ndeps_policy: open\nsteps:\n  - name: dev\n    agent: missing\n";
    let e = belay_pipeline::parse(text, &dir.path().join("pipeline.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pipeline.yaml:5:") && e.contains("missing.agent.md"),
        "{e}"
    );
}

proptest! {
    /// Arbitrary text never panics the loader.
    #[test]
    fn random_text_never_panics(s in "\\PC{0,400}") {
        let _ = belay_pipeline::parse(&s, &demo_dir().join("pipeline.yaml"));
    }

    /// The demo with a line dropped, duplicated or cut: a pipeline or a
    /// located error, never a panic.
    #[test]
    fn mutated_pipelines_never_panic(line in 0usize..60, op in 0u8..3, cut in 0usize..40) {
        let mut lines: Vec<String> = DEMO.lines().map(String::from).collect();
        let i = line % lines.len();
        match op {
            0 => { lines.remove(i); }
            1 => { let l = lines[i].clone(); lines.insert(i, l); }
            _ => { let l = &lines[i]; let c = cut.min(l.len()); let mut k = c; while !l.is_char_boundary(k) { k -= 1; } lines[i] = l[..k].to_string(); }
        }
        let text = lines.join("\n");
        if let Err(e) = belay_pipeline::parse(&text, &demo_dir().join("pipeline.yaml")) {
            prop_assert!(e.to_string().contains("pipeline.yaml:"), "{}", e);
        }
    }
}
