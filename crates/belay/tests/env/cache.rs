//! The checkpoint cache: an unchanged rebuild reuses every checkpoint; a
//! changed block reruns itself and everything after it; --no-cache runs all.

use crate::common::*;
use crate::custom::*;

const BLOCKS: &[(&str, &str, &str)] = &[
    ("00-a", "echo a > /tmp/state", "test -f /tmp/state"),
    ("10-b", "echo b >> /tmp/state", "grep -q b /tmp/state"),
    ("20-c", "cat /tmp/state", "true"),
];

fn ran(m: &serde_json::Value) -> Vec<String> {
    phases(m, "block")
        .iter()
        .map(|e| e["block_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn unchanged_rebuild_hits_every_checkpoint_and_a_change_reruns_from_there() {
    let c = Custom::new();
    let runs: Vec<String> = (1..=4).map(|i| run_id(&format!("cache{i}"))).collect();
    let _guards: Vec<RunGuard> = runs.iter().map(|r| RunGuard(r.clone())).collect();

    c.blocks(&runs[0], BLOCKS);
    let (code, m1) = c.build(&runs[0], &[]);
    assert_eq!(code, 0, "{}", m1["error"]);
    assert_eq!(m1["cache"]["hits"], 0);
    assert_eq!(ran(&m1), ["00-a", "10-b", "20-c"]);

    // Same plan, new run: every checkpoint (the workspace too) comes from the cache.
    c.copy_blocks(&runs[0], &runs[1]);
    let (code, m2) = c.build(&runs[1], &[]);
    assert_eq!(code, 0, "{}", m2["error"]);
    assert_eq!(m2["cache"]["hits"], 4, "{}", m2["cache"]);
    assert_eq!(m2["cache"]["misses"], 0);
    assert!(
        ran(&m2).is_empty(),
        "blocks ran despite the cache: {:?}",
        ran(&m2)
    );
    for id in ["00-a", "10-b", "20-c"] {
        assert_eq!(block(&m2, id)["cached"], true);
        assert_eq!(block(&m2, id)["status"], "succeeded");
    }
    assert!(m2["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .all(|cp| cp["cached_from"].is_string()));
    let (ok, out, _) = docker(&[
        "run",
        "--rm",
        m2["final_image"].as_str().unwrap(),
        "cat",
        "/tmp/state",
    ]);
    assert!(ok && out == "a\nb\n", "{out:?}");

    // A changed block reruns itself and everything after it.
    c.copy_blocks(&runs[0], &runs[2]);
    let p = c.run_dir(&runs[2]).join("blocks/10-b.json");
    let mut b: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    b["script"] = serde_json::json!(b["script"]
        .as_str()
        .unwrap()
        .replace("echo b >> /tmp/state", "echo b >> /tmp/state\necho changed"));
    std::fs::write(&p, b.to_string()).unwrap();
    let (code, m3) = c.build(&runs[2], &[]);
    assert_eq!(code, 0, "{}", m3["error"]);
    assert_eq!(ran(&m3), ["10-b", "20-c"]);
    assert_eq!(block(&m3, "00-a")["cached"], true);
    assert_eq!(block(&m3, "10-b")["cached"], false);
    assert_eq!(m3["cache"]["hits"], 2);

    // --no-cache runs everything.
    c.copy_blocks(&runs[0], &runs[3]);
    let (code, m4) = c.build(&runs[3], &["--no-cache"]);
    assert_eq!(code, 0);
    assert_eq!(m4["cache"]["enabled"], false);
    assert_eq!(ran(&m4), ["00-a", "10-b", "20-c"]);
}

#[test]
fn keep_container_keeps_the_final_state_and_the_reaper_leaves_it() {
    let c = Custom::new();
    let run = run_id("keep");
    let _guard = RunGuard(run.clone());
    c.blocks(&run, &[("00-a", "echo kept-state > /tmp/kept", "true")]);
    let (code, m) = c.build(&run, &["--no-cache", "--keep-container"]);
    assert_eq!(code, 0, "{}", m["error"]);
    let kept = run_containers(&run);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let (ok, out, _) = docker(&["exec", &kept[0], "cat", "/tmp/kept"]);
    assert!(ok && out.trim() == "kept-state", "{out}");
    // Another build starts (and reaps): the kept container is the user's, not an orphan.
    let other = Custom::new();
    let run2 = run_id("keep2");
    let _guard2 = RunGuard(run2.clone());
    other.blocks(&run2, &[("00-a", "true", "true")]);
    let (code, _) = other.build(&run2, &["--no-cache"]);
    assert_eq!(code, 0);
    assert!(
        docker(&["inspect", &kept[0]]).0,
        "the reaper removed a kept container"
    );
}

/// A rebuild that hits a repaired chain adopts the patched script for the
/// repaired block, keeps every other block's script, and its clean replay of
/// those scripts passes.
#[test]
fn cached_repaired_chain_keeps_every_script_and_replays() {
    let c = Custom::new();
    let runs = [run_id("cache-rep1"), run_id("cache-rep2")];
    let _guards: Vec<RunGuard> = runs.iter().map(|r| RunGuard(r.clone())).collect();
    let plan: &[(&str, &str, &str)] = &[
        ("00-a", "echo a > /tmp/a", "test -f /tmp/a"),
        ("10-tool", "tree --version", "command -v tree"),
        ("20-c", "cat /tmp/a", "true"),
    ];
    c.blocks(&runs[0], plan);
    let (code, m1) = c.build(&runs[0], &[]);
    assert_eq!(code, 0, "{}", m1["error"]);
    assert_eq!(block(&m1, "10-tool")["status"], "repaired");
    // The same original plan, as a new run would make it.
    c.blocks(&runs[1], plan);
    let (code, m2) = c.build(&runs[1], &[]);
    assert_eq!(code, 0, "{}", m2["error"]);
    assert!(
        phases(&m2, "block").is_empty(),
        "every block should come from the cache"
    );
    for id in ["00-a", "10-tool", "20-c"] {
        assert_eq!(block(&m2, id)["cached"], true, "{id}");
        assert_eq!(
            block(&m2, id)["script"],
            block(&m1, id)["script"],
            "{id}'s script changed on a cache hit"
        );
    }
    assert_eq!(block(&m2, "10-tool")["status"], "repaired");
    assert_eq!(m2["final_clean_replay_ok"], true, "{}", m2["error"]);
    // The identical replay is reused, not run again.
    assert!(
        phases(&m2, "clean_replay").is_empty(),
        "the clean replay ran again"
    );
    assert!(m2["final_clean_replay_note"]
        .as_str()
        .unwrap()
        .contains("reused"));
}
