//! `--registry`: checkpoints pushed to a real OCI registry (Debian's
//! docker-registry on loopback, started by scripts/setup-host.sh --tests), a build on
//! an engine that lacks every image of the first one hitting the cache through
//! the registry, a resume from pulled checkpoints, and a registry that is down.

use serde_json::Value;

use crate::common::*;
use crate::custom::*;

/// The loopback registry of the tests.
pub fn registry() -> String {
    let reg = std::env::var("BELAY_TEST_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".into());
    let out = std::process::Command::new("curl")
        .args(["-sf", &format!("http://{reg}/v2/")])
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "no registry answers on {reg}: start it with scripts/setup-host.sh --tests (Debian's docker-registry)"
    );
    reg
}

/// The tags of `repo` in the registry.
fn tags(reg: &str, repo: &str) -> Vec<String> {
    let out = std::process::Command::new("curl")
        .args(["-sf", &format!("http://{reg}/v2/{repo}/tags/list")])
        .output()
        .expect("curl");
    if !out.status.success() {
        return Vec::new();
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["tags"]
        .as_array()
        .map(|a| a.iter().map(|t| t.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn ran(m: &Value) -> Vec<String> {
    phases(m, "block")
        .iter()
        .map(|e| e["block_id"].as_str().unwrap().to_string())
        .collect()
}

/// Local images with a name in `repo` (`<none>` excluded).
fn local_refs(repo: &str) -> Vec<String> {
    let (_, out, _) = docker(&["images", "--format", "{{.Repository}}:{{.Tag}}", repo]);
    out.lines()
        .filter(|l| !l.contains("<none>"))
        .map(String::from)
        .collect()
}

const BLOCKS: &[(&str, &str, &str)] = &[
    ("00-a", "echo a > /opt/state", "test -f /opt/state"),
    ("10-b", "echo b >> /opt/state", "grep -q b /opt/state"),
    (
        "20-c",
        "head -c 3000000 /dev/urandom > /opt/blob",
        "test -s /opt/blob",
    ),
];

#[test]
fn a_fresh_image_store_builds_from_the_registry_cache() {
    let reg = registry();
    let c = Custom::new();
    let runs = [run_id("reg1"), run_id("reg2"), run_id("reg3")];
    let _guards: Vec<RunGuard> = runs.iter().map(|r| RunGuard(r.clone())).collect();
    // A base of this test's own name (the same image as the default base), so
    // that it can be removed from the engine without touching other tests.
    let base = format!("belay-regtest-base:p{}", std::process::id());
    assert!(docker(&["tag", "belay-base:bookworm", &base]).0);
    let remote_base = format!("{reg}/{base}");

    c.blocks(&runs[0], BLOCKS);
    let (code, m1) = c.build(&runs[0], &["--registry", &reg, "--base-image", &base]);
    assert_eq!(code, 0, "{}", m1["error"]);
    assert_eq!(ran(&m1), ["00-a", "10-b", "20-c"]);
    let r = &m1["registry"];
    assert_eq!(r["registry"], reg.as_str());
    let pushes = r["pushes"].as_array().unwrap();
    assert!(
        pushes.iter().all(|p| p["error"].is_null()),
        "a push failed: {pushes:?}"
    );
    let pushed: Vec<&str> = pushes
        .iter()
        .map(|p| p["image_ref"].as_str().unwrap())
        .collect();
    // Every checkpoint under its own name, the base, and the final image.
    for cp in m1["checkpoints"].as_array().unwrap() {
        let name = cp["image_ref"].as_str().unwrap();
        assert!(name.starts_with(&format!("{reg}/belay:")), "{name}");
        assert!(pushed.contains(&name), "{name} not pushed: {pushed:?}");
    }
    assert!(pushed.contains(&remote_base.as_str()), "{pushed:?}");
    let final_image = m1["final_image"].as_str().unwrap().to_string();
    assert!(pushed.contains(&final_image.as_str()));
    // The registry has them: the run's tags, and a key tag per checkpoint.
    let run_tags = tags(&reg, "belay");
    for cp in m1["checkpoints"].as_array().unwrap() {
        let tag = cp["image_ref"]
            .as_str()
            .unwrap()
            .rsplit_once(':')
            .unwrap()
            .1;
        assert!(
            run_tags.iter().any(|t| t == tag),
            "{tag} not in the registry"
        );
    }
    let key_tags = tags(&reg, "belay-cache");
    let (_, labels, _) = docker(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"belay.cache.key\"}}",
        m1["checkpoints"][1]["image_ref"].as_str().unwrap(),
    ]);
    assert!(
        key_tags.contains(&format!("key-{}", labels.trim())),
        "the key tag of {} is not in the registry",
        m1["checkpoints"][1]["image_ref"]
    );
    // The key names were only for the push: no local image keeps one.
    assert!(
        local_refs(&format!("{reg}/belay-cache")).is_empty(),
        "{:?}",
        local_refs(&format!("{reg}/belay-cache"))
    );

    // An engine without any of it: the run's images and the base are removed.
    cleanup_run(&runs[0]);
    docker(&["rmi", &base, &remote_base]);
    assert!(!docker(&["image", "inspect", &final_image]).0);
    assert!(!docker(&["image", "inspect", &base]).0);

    c.copy_blocks(&runs[0], &runs[1]);
    let (code, m2) = c.build(&runs[1], &["--registry", &reg, "--base-image", &base]);
    assert_eq!(code, 0, "{}", m2["error"]);
    assert!(
        ran(&m2).is_empty(),
        "blocks ran despite the registry cache: {:?}",
        ran(&m2)
    );
    assert_eq!(m2["cache"]["hits"], 4, "{}", m2["cache"]);
    assert_eq!(m2["cache"]["misses"], 0);
    let r2 = &m2["registry"];
    assert_eq!(r2["hits"], 4, "{r2}");
    let reasons: Vec<&str> = r2["pulls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["reason"].as_str().unwrap())
        .collect();
    // The hits are read in the registry: the only layers pulled are the
    // base's and the last checkpoint's, for the final image on this engine.
    assert_eq!(reasons, ["base", "cache"], "{r2}");
    assert!(r2["direct_off"].is_null(), "{r2}");
    assert_eq!(
        r2["remote_tags"], 4,
        "the run's names given in the registry"
    );
    // The last checkpoint, pulled by the digest that was read under its key.
    let pulled = r2["pulls"][1]["image_ref"].as_str().unwrap();
    assert!(
        pulled.starts_with(&format!("{reg}/belay-cache@sha256:")),
        "{r2}"
    );
    for cp in m2["checkpoints"].as_array().unwrap() {
        let from = cp["cached_from"].as_str().unwrap();
        assert!(
            from.starts_with(&format!("{reg}/belay-cache:key-")),
            "{from}"
        );
    }
    let (ok, out, err) = docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        m2["final_image"].as_str().unwrap(),
        "sh",
        "-c",
        "cat /opt/state; wc -c < /opt/blob",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "a\nb\n3000000\n");

    // --no-pull-final on an engine without the runs' images: no layer moves,
    // the final image is named in the registry and is what the others are.
    // What run 2 pulled keeps run 1's labels: remove it by its names.
    cleanup_run(&runs[1]);
    let (_, names, _) = docker(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    for n in names.lines().filter(|n| n.contains(&runs[1])) {
        docker(&["rmi", n]);
    }
    c.copy_blocks(&runs[0], &runs[2]);
    let (code, m3) = c.build(
        &runs[2],
        &["--registry", &reg, "--base-image", &base, "--no-pull-final"],
    );
    assert_eq!(code, 0, "{}", m3["error"]);
    assert!(ran(&m3).is_empty(), "{:?}", ran(&m3));
    let r3 = &m3["registry"];
    assert_eq!(r3["pulls"].as_array().unwrap().len(), 0, "{r3}");
    assert_eq!(r3["remote_tags"], 5, "four checkpoints and the final: {r3}");
    let final3 = m3["final_image"].as_str().unwrap();
    assert!(final3.starts_with(&format!("{reg}/belay:")), "{final3}");
    assert!(
        !docker(&["image", "inspect", final3]).0,
        "the final image was pulled"
    );
    assert!(
        tags(&reg, "belay").contains(&format!("{}-final", runs[2])),
        "the final image is not named in the registry"
    );
    let (ok, out, err) = docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        final3,
        "sh",
        "-c",
        "cat /opt/state; wc -c < /opt/blob",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "a\nb\n3000000\n");
    docker(&["rmi", &base, &remote_base, final3]);

    // gc: the second run's names share the first run's manifests (cache
    // hits), so removing only the first run removes nothing they need: only
    // its own final image (the last checkpoint with its ENV layer, a
    // manifest of its own).
    let gc = |extra: &[&str]| -> String {
        let mut args = vec!["env", "gc", "--registry", reg.as_str()];
        args.extend(extra);
        let a = belay().args(&args).assert().success();
        String::from_utf8_lossy(&a.get_output().stdout).to_string()
    };
    let out = gc(&["--run", &runs[0], "--include-final"]);
    assert!(out.contains("removed 1 manifest(s)"), "{out}");
    let both = [
        "--run",
        &runs[0],
        "--run",
        &runs[1],
        "--run",
        &runs[2],
        "--include-final",
    ];
    let mut dry = both.to_vec();
    dry.push("--dry-run");
    let out = gc(&dry);
    // The workspace and three blocks, in the runs' repository and as cache
    // keys, and the final image of its own (the last run's; an earlier
    // one that is the same image shares its manifest).
    assert!(out.contains("would remove 9 manifest(s)"), "{out}");
    assert_eq!(
        tags(&reg, "belay")
            .iter()
            .filter(|t| t.starts_with(&format!("{}-", runs[1])))
            .count(),
        5,
        "four checkpoints and the final image"
    );
    let out = gc(&both);
    assert!(out.contains("removed 9 manifest(s)"), "{out}");
    let left: Vec<String> = tags(&reg, "belay")
        .into_iter()
        .filter(|t| runs.iter().any(|r| t.starts_with(&format!("{r}-"))))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(
        !tags(&reg, "belay-cache").contains(&format!("key-{}", labels.trim())),
        "the cache key of a removed checkpoint is still in the registry"
    );
}

#[test]
fn a_build_resumes_from_checkpoints_that_are_only_in_the_registry() {
    let reg = registry();
    let c = Custom::new();
    let run = run_id("reg-resume");
    let _guard = RunGuard(run.clone());
    c.blocks(
        &run,
        &[
            ("00-a", "echo a > /opt/state", "test -f /opt/state"),
            ("10-b", "test -f /opt/go-on", "true"),
        ],
    );
    let (code, m1) = c.build(&run, &["--registry", &reg, "--max-repair-attempts", "0"]);
    assert_eq!(code, 1, "10-b fails");
    assert_eq!(ran(&m1), ["00-a", "10-b"]);
    assert!(m1["registry"]["pushes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["error"].is_null()));
    // Another engine: none of the run's images are here.
    cleanup_run(&run);
    // The block is fixed, and the same command runs again.
    let p = c.run_dir(&run).join("blocks/10-b.json");
    let mut b: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    b["script"] = serde_json::json!(b["script"]
        .as_str()
        .unwrap()
        .replace("test -f /opt/go-on", "cat /opt/state"));
    std::fs::write(&p, b.to_string()).unwrap();
    let (code, m2) = c.build(&run, &["--registry", &reg, "--no-cache"]);
    assert_eq!(code, 0, "{}", m2["error"]);
    let resumes: Vec<&Value> = m2["registry"]["pulls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["reason"] == "resume")
        .collect();
    assert_eq!(resumes.len(), 1, "{}", m2["registry"]);
    assert!(resumes[0]["image_ref"]
        .as_str()
        .unwrap()
        .ends_with("-001-00-a-success"));
    // 00-a ran once, in the first start; nothing past its checkpoint twice.
    assert_eq!(ran(&m2), ["00-a", "10-b", "10-b"]);
    assert_eq!(m2["starts"], 2);
}

#[test]
fn a_registry_that_is_down_fails_the_build_as_infra() {
    let c = Custom::new();
    let run = run_id("reg-down");
    let _guard = RunGuard(run.clone());
    c.blocks(&run, &[("00-a", "true", "true")]);
    // Nothing listens on port 9 of loopback.
    let a = belay()
        .args(["env", "build", "--repo"])
        .arg(c.repo.path())
        .arg("--state-dir")
        .arg(c.state.path())
        .args(["--run-id", &run, "--registry", "127.0.0.1:9"])
        .assert()
        .code(3);
    let err = String::from_utf8_lossy(&a.get_output().stderr).to_string();
    assert!(err.contains("error[BELAY-E305]"), "{err}");
    assert!(err.contains("127.0.0.1:9"), "{err}");
    let m = read_json(&c.run_dir(&run).join("manifest.json"));
    assert_eq!(m["ok"], false);

    // A registry given with a scheme is a usage error, before anything runs.
    let a = belay()
        .args(["env", "build", "--repo"])
        .arg(c.repo.path())
        .args(["--registry", "http://127.0.0.1:5000"])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).to_string();
    assert!(err.contains("host[:port]"), "{err}");
}
