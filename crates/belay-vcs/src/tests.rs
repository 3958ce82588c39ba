#![allow(clippy::unwrap_used)]
use super::*;
use std::process::Command;

fn sh(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

fn repo() -> (tempfile::TempDir, Git) {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    sh(&ws, &["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("a.txt"), "a\n").unwrap();
    sh(&ws, &["add", "-A"]);
    sh(&ws, &["commit", "-q", "-m", "init"]);
    let git = Git::open(&ws, &d.path().join("no-hooks")).unwrap();
    (d, git)
}

fn no_scan() -> impl FnMut(&str, &mut dyn std::io::Read) -> std::io::Result<Option<String>> {
    |_, r| {
        std::io::copy(r, &mut std::io::sink())?;
        Ok(None)
    }
}

fn commit(git: &Git, exclude: &[String]) -> CommitOutcome {
    let mut scan = no_scan();
    git.commit_checked(CommitRequest {
        message: "m",
        author: Some(("t", "t@t")),
        exclude,
        submodules: &[],
        scan: &mut scan,
    })
    .unwrap()
}

#[test]
fn dirty_lists_changes_and_untracked_files() {
    let (_d, git) = repo();
    let root = git.root().to_path_buf();
    assert!(git.dirty(&[]).unwrap().is_empty());
    std::fs::write(root.join("a.txt"), "b\n").unwrap();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/new.txt"), "n\n").unwrap();
    let mut all = git.dirty(&[]).unwrap();
    all.sort();
    assert_eq!(all, vec!["a.txt", "sub/new.txt"]);
    assert_eq!(git.dirty(&["sub"]).unwrap(), vec!["sub/new.txt"]);
}

/// Hooks, fsmonitor, filters and textconv planted in the repository's own
/// config never run in belay's git, which a marker file proves.
#[test]
fn planted_hooks_fsmonitor_filters_and_textconv_never_run() {
    let (d, git) = repo();
    let root = git.root().to_path_buf();
    let marker = d.path().join("MARKER");
    let m = marker.display().to_string();
    let hook = root.join(".git/hooks/pre-commit");
    std::fs::write(&hook, format!("#!/bin/sh\ntouch {m}-hook\nexit 1\n")).unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cfg = std::fs::OpenOptions::new()
        .append(true)
        .open(root.join(".git/config"))
        .unwrap();
    use std::io::Write as _;
    write!(
        cfg,
        "[core]\n\tfsmonitor = touch {m}-fsmonitor\n[filter \"Evil.x\"]\n\tclean = touch {m}-clean; cat\n\tsmudge = touch {m}-smudge; cat\n\tprocess = touch {m}-process\n[diff \"tc\"]\n\ttextconv = touch {m}-textconv; cat\n"
    )
    .unwrap();
    std::fs::write(root.join(".gitattributes"), "*.txt filter=Evil.x diff=tc\n").unwrap();
    std::fs::write(root.join("a.txt"), "changed\n").unwrap();
    std::fs::write(root.join("b.txt"), "new\n").unwrap();
    assert_eq!(git.dirty(&[]).unwrap().len(), 3);
    git.run(&["diff", "HEAD"]).unwrap();
    let c = match commit(&git, &[]) {
        CommitOutcome::Committed(c) => c,
        other => panic!("{other:?}"),
    };
    assert_eq!(c.files.len(), 3);
    git.run(&["log", "-p", "-1"]).unwrap();
    git.run(&["checkout", "HEAD~1", "--", "a.txt"]).unwrap();
    let ran: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("MARKER"))
        .collect();
    assert!(ran.is_empty(), "ran on the host: {ran:?}");
    // The committed blob is the file itself, not a filter's output.
    assert_eq!(git.run(&["show", "HEAD:b.txt"]).unwrap(), "new\n");
}

/// A nested repository (the fsmonitor attack) is refused before anything is
/// staged; a gitlink that is not a submodule is refused too.
#[test]
fn embedded_repositories_and_gitlinks_are_refused() {
    let (_d, git) = repo();
    let root = git.root().to_path_buf();
    let nested = root.join("vendor/lib");
    std::fs::create_dir_all(&nested).unwrap();
    sh(&nested, &["init", "-q"]);
    std::fs::write(nested.join("z"), "z").unwrap();
    sh(&nested, &["add", "z"]);
    sh(&nested, &["commit", "-q", "-m", "z"]);
    std::fs::write(root.join("ok.txt"), "ok").unwrap();
    let head = git.head().unwrap();
    match commit(&git, &[]) {
        CommitOutcome::Refused(Refusal::EmbeddedRepository(p)) => assert_eq!(p, ["vendor/lib"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(git.head().unwrap(), head);
    // A gitlink staged by other means (a gitfile, which ls-files does not show
    // as a directory) is caught in the staged tree.
    std::fs::remove_dir_all(root.join("vendor")).unwrap();
    std::fs::create_dir_all(root.join("link")).unwrap();
    let sha = git.head().unwrap();
    git.run(&[
        "update-index",
        "--add",
        "--cacheinfo",
        &format!("160000,{sha},link"),
    ])
    .unwrap();
    match commit(&git, &[]) {
        CommitOutcome::Refused(Refusal::Gitlink(p)) => assert_eq!(p, ["link"]),
        other => panic!("{other:?}"),
    }
}

/// A staged secret (a multi-line one, in a new file) refuses the commit, and
/// no object holding it reaches the repository.
#[test]
fn a_secret_refuses_the_commit_and_leaves_no_blob() {
    let (_d, git) = repo();
    let root = git.root().to_path_buf();
    let key = "-----BEGIN TEST KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END TEST KEY-----\n";
    std::fs::write(root.join("key.pem"), key).unwrap();
    std::fs::write(root.join("big.txt"), "x".repeat(3 << 20)).unwrap();
    let head = git.head().unwrap();
    let mut scan = |path: &str, r: &mut dyn std::io::Read| -> std::io::Result<Option<String>> {
        let mut s = Vec::new();
        r.read_to_end(&mut s)?;
        let hit = String::from_utf8_lossy(&s)
            .contains("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7");
        Ok(hit.then(|| format!("key via {path}")))
    };
    let out = git
        .commit_checked(CommitRequest {
            message: "m",
            author: None,
            exclude: &[],
            submodules: &[],
            scan: &mut scan,
        })
        .unwrap();
    match out {
        CommitOutcome::Refused(Refusal::Secret { path, .. }) => assert_eq!(path, "key.pem"),
        other => panic!("{other:?}"),
    }
    assert_eq!(git.head().unwrap(), head);
    let all = git
        .run(&["cat-file", "--batch-all-objects", "--batch-check"])
        .unwrap();
    let out = git.run(&["cat-file", "--batch-all-objects", "--batch"]);
    assert!(
        !out.unwrap().contains("MIIEvQ"),
        "a blob holds the key ({all})"
    );
    assert!(git.dirty(&[]).unwrap().contains(&"key.pem".to_string()));
    // Nothing staged remains, and no temporary directory.
    assert!(git
        .run(&["diff", "--cached", "--name-only"])
        .unwrap()
        .is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(git.git_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("belay-stage"))
        .collect();
    assert!(leftovers.is_empty());
    // Without the key, the rest commits; excludes stay out.
    std::fs::remove_file(root.join("key.pem")).unwrap();
    std::fs::write(root.join("pipeline.yaml"), "x").unwrap();
    match commit(&git, &["pipeline.yaml".into()]) {
        CommitOutcome::Committed(c) => assert_eq!(c.files, ["big.txt"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(git.dirty(&[]).unwrap(), ["pipeline.yaml"]);
    assert!(matches!(
        commit(&git, &["pipeline.yaml".into()]),
        CommitOutcome::Nothing
    ));
}

#[test]
fn the_sandbox_config_has_no_credentials() {
    let (d, git) = repo();
    let root = git.root().to_path_buf();
    sh(
        &root,
        &[
            "remote",
            "add",
            "origin",
            "https://bob:hunter2-x@example.invalid/r.git",
        ],
    );
    sh(
        &root,
        &[
            "config",
            "http.https://example.invalid/.extraHeader",
            "Authorization: Bearer tok-123456",
        ],
    );
    sh(&root, &["config", "credential.helper", "store"]);
    let dest = d.path().join("sanitized");
    git.write_sanitized_config(&dest).unwrap();
    let text = std::fs::read_to_string(&dest).unwrap();
    assert!(
        !text.contains("hunter2-x") && !text.contains("bob@"),
        "{text}"
    );
    assert!(
        !text.contains("tok-123456") && !text.contains("store"),
        "{text}"
    );
    assert!(text.contains("https://example.invalid/r.git"), "{text}");
}

#[test]
fn userinfo_is_stripped() {
    assert_eq!(
        sanitize::strip_userinfo("https://u:p@h:1/x?y@z").as_deref(),
        Some("https://h:1/x?y@z")
    );
    assert_eq!(sanitize::strip_userinfo("https://h/x"), None);
}
