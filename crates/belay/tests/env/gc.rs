//! `belay env gc` removes a run's checkpoints, keeps its final image unless
//! asked, and never touches images belay did not make.

use crate::common::*;
use crate::custom::*;

#[test]
fn gc_removes_checkpoints_keeps_finals_and_foreign_images() {
    let c = Custom::new();
    let run = run_id("gc");
    let _guard = RunGuard(run.clone());
    c.blocks(
        &run,
        &[
            ("00-a", "echo a > /tmp/a", "true"),
            ("10-b", "echo b", "true"),
        ],
    );
    let (code, m) = c.build(&run, &["--no-cache"]);
    assert_eq!(code, 0, "{}", m["error"]);
    let final_ref = m["final_image"].as_str().unwrap().to_string();
    let cp = format!("belay:{run}-001-00-a-success");
    // Images belay did not make, named like this run's: one without belay's
    // label, and a tag on the bootstrap base image (which belongs to no run).
    let foreign = format!("belay-foreign-test:{run}-002-10-b-success");
    let (ok, cid, e) = docker(&["create", "belay-base:bookworm", "true"]);
    assert!(ok, "{e}");
    let (ok, _, e) = docker(&["commit", "-c", "LABEL belay=false", cid.trim(), &foreign]);
    docker(&["rm", cid.trim()]);
    assert!(ok, "{e}");
    let base_alias = format!("belay-foreign-test:{run}-003-20-c-success");
    assert!(docker(&["tag", "belay-base:bookworm", &base_alias]).0);
    let exists = |r: &str| docker(&["image", "inspect", r]).0;

    let a = belay()
        .args(["env", "gc", "--dry-run", "--run", &run])
        .assert()
        .success();
    let out = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(out.contains(&format!("would remove image {cp}")), "{out}");
    assert!(exists(&cp), "a dry run removed something");

    belay()
        .args(["env", "gc", "--run", &run])
        .assert()
        .success();
    assert!(!exists(&cp), "checkpoint survived gc");
    assert!(
        exists(&final_ref),
        "gc removed the final image without --include-final"
    );
    assert!(exists("belay-base:bookworm"), "gc removed the base image");
    // The base image carries belay=true, but it and its tag belong to no belay run.
    belay()
        .args(["env", "gc", "--run", &run, "--include-final"])
        .assert()
        .success();
    assert!(!exists(&final_ref));
    assert!(exists("belay-base:bookworm"));
    assert!(
        exists(&foreign) && exists(&base_alias),
        "gc touched an image belay did not make"
    );
    docker(&["rmi", &foreign, &base_alias]);
}
