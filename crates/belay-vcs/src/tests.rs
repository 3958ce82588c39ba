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

/// The marker files a planted command would have made in `dir`.
fn markers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("MARKER"))
        .collect()
}

async fn repo() -> (tempfile::TempDir, Git) {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    sh(&ws, &["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("a.txt"), "a\n").unwrap();
    sh(&ws, &["add", "-A"]);
    sh(&ws, &["commit", "-q", "-m", "init"]);
    let git = Git::open(&ws, &d.path().join("no-hooks")).await.unwrap();
    (d, git)
}

fn no_scan() -> Box<BlobScan> {
    Box::new(|_, r| {
        std::io::copy(r, &mut std::io::sink())?;
        Ok(None)
    })
}

async fn commit(git: &Git, exclude: &[String]) -> CommitOutcome {
    git.commit_checked(CommitRequest {
        exclude_globs: vec![],
        allow_empty: false,
        paths: vec![],
        message: "m".into(),
        author: Some(("t".into(), "t@t".into())),
        exclude: exclude.to_vec(),
        submodules: Vec::new(),
        scan: no_scan(),
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn dirty_lists_changes_and_untracked_files() {
    let (_d, git) = repo().await;
    let root = git.root().to_path_buf();
    assert!(git.dirty(&[]).await.unwrap().is_empty());
    std::fs::write(root.join("a.txt"), "b\n").unwrap();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/new.txt"), "n\n").unwrap();
    let mut all = git.dirty(&[]).await.unwrap();
    all.sort();
    assert_eq!(all, vec!["a.txt", "sub/new.txt"]);
    assert_eq!(git.dirty(&["sub"]).await.unwrap(), vec!["sub/new.txt"]);
}

/// Hooks, fsmonitor, filters and textconv planted in the repository's own
/// config never run in belay's git, which a marker file proves.
#[tokio::test]
async fn planted_hooks_fsmonitor_filters_and_textconv_never_run() {
    let (d, git) = repo().await;
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
    assert_eq!(git.dirty(&[]).await.unwrap().len(), 3);
    git.run(&["diff", "HEAD"]).await.unwrap();
    let c = match commit(&git, &[]).await {
        CommitOutcome::Committed(c) => c,
        other => panic!("{other:?}"),
    };
    assert_eq!(c.files.len(), 3);
    git.run(&["log", "-p", "-1"]).await.unwrap();
    // The run's record of the commit runs no driver either.
    let patch = git.commit_patch(&c.sha, 1 << 20).await.unwrap();
    assert!(patch.contains("+new") && patch.contains("b.txt"), "{patch}");
    git.run(&["checkout", "HEAD~1", "--", "a.txt"])
        .await
        .unwrap();
    let ran = markers(d.path());
    assert!(ran.is_empty(), "ran on the host: {ran:?}");
    // The committed blob is the file itself, not a filter's output.
    assert_eq!(git.run(&["show", "HEAD:b.txt"]).await.unwrap(), "new\n");
}

/// A nested repository (the fsmonitor attack) is refused before anything is
/// staged; a gitlink that is not a submodule is refused too.
#[tokio::test]
async fn embedded_repositories_and_gitlinks_are_refused() {
    let (_d, git) = repo().await;
    let root = git.root().to_path_buf();
    let nested = root.join("vendor/lib");
    std::fs::create_dir_all(&nested).unwrap();
    sh(&nested, &["init", "-q"]);
    std::fs::write(nested.join("z"), "z").unwrap();
    sh(&nested, &["add", "z"]);
    sh(&nested, &["commit", "-q", "-m", "z"]);
    std::fs::write(root.join("ok.txt"), "ok").unwrap();
    let head = git.head().await.unwrap();
    match commit(&git, &[]).await {
        CommitOutcome::Refused(Refusal::EmbeddedRepository(p)) => assert_eq!(p, ["vendor/lib"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(git.head().await.unwrap(), head);
    // A gitlink staged by other means (a gitfile, which ls-files does not show
    // as a directory) is caught in the staged tree.
    std::fs::remove_dir_all(root.join("vendor")).unwrap();
    std::fs::create_dir_all(root.join("link")).unwrap();
    let sha = git.head().await.unwrap();
    git.run(&[
        "update-index",
        "--add",
        "--cacheinfo",
        &format!("160000,{sha},link"),
    ])
    .await
    .unwrap();
    match commit(&git, &[]).await {
        CommitOutcome::Refused(Refusal::Gitlink(p)) => assert_eq!(p, ["link"]),
        other => panic!("{other:?}"),
    }
}

/// A staged secret (a multi-line one, in a new file) refuses the commit, and
/// no object holding it reaches the repository.
#[tokio::test]
async fn a_secret_refuses_the_commit_and_leaves_no_blob() {
    let (_d, git) = repo().await;
    let root = git.root().to_path_buf();
    let key = "-----BEGIN TEST KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END TEST KEY-----\n";
    std::fs::write(root.join("key.pem"), key).unwrap();
    std::fs::write(root.join("big.txt"), "x".repeat(3 << 20)).unwrap();
    let head = git.head().await.unwrap();
    let scan = |path: &str, r: &mut dyn std::io::Read| -> std::io::Result<Option<String>> {
        let mut s = Vec::new();
        r.read_to_end(&mut s)?;
        let hit = String::from_utf8_lossy(&s)
            .contains("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7");
        Ok(hit.then(|| format!("key via {path}")))
    };
    let out = git
        .commit_checked(CommitRequest {
            exclude_globs: vec![],
            allow_empty: false,
            paths: vec![],
            message: "m".into(),
            author: None,
            exclude: Vec::new(),
            submodules: Vec::new(),
            scan: Box::new(scan),
        })
        .await
        .unwrap();
    match out {
        CommitOutcome::Refused(Refusal::Secret { path, .. }) => assert_eq!(path, "key.pem"),
        other => panic!("{other:?}"),
    }
    assert_eq!(git.head().await.unwrap(), head);
    let all = git
        .run(&["cat-file", "--batch-all-objects", "--batch-check"])
        .await
        .unwrap();
    let out = git
        .run(&["cat-file", "--batch-all-objects", "--batch"])
        .await;
    assert!(
        !out.unwrap().contains("MIIEvQ"),
        "a blob holds the key ({all})"
    );
    assert!(git
        .dirty(&[])
        .await
        .unwrap()
        .contains(&"key.pem".to_string()));
    // Nothing staged remains, and no temporary directory.
    assert!(git
        .run(&["diff", "--cached", "--name-only"])
        .await
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
    match commit(&git, &["pipeline.yaml".into()]).await {
        CommitOutcome::Committed(c) => assert_eq!(c.files, ["big.txt"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(git.dirty(&[]).await.unwrap(), ["pipeline.yaml"]);
    assert!(matches!(
        commit(&git, &["pipeline.yaml".into()]).await,
        CommitOutcome::Nothing
    ));
}

#[tokio::test]
async fn the_sandbox_config_has_no_credentials() {
    let (d, git) = repo().await;
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
    sh(
        &root,
        &[
            "config",
            "http.proxy",
            "http://bob:Pr0xyPassw0rd1@proxy.invalid:3128",
        ],
    );
    sh(&root, &["config", "sendemail.smtpPass", "SmtpS3cretValue9"]);
    let dest = d.path().join("sanitized");
    git.write_sanitized_config(&dest).await.unwrap();
    let text = std::fs::read_to_string(&dest).unwrap();
    assert!(
        !text.contains("hunter2-x") && !text.contains("bob@"),
        "{text}"
    );
    assert!(
        !text.contains("tok-123456") && !text.contains("store"),
        "{text}"
    );
    assert!(
        !text.contains("Pr0xyPassw0rd1") && !text.contains("SmtpS3cretValue9"),
        "{text}"
    );
    assert!(text.contains("https://example.invalid/r.git"), "{text}");
    // What a git in the sandbox needs is there: it reads the repository.
    let out = std::process::Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(["config", "--file"])
        .arg(&dest)
        .args(["--get", "core.repositoryformatversion"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
}

#[test]
fn userinfo_is_stripped() {
    assert_eq!(
        sanitize::strip_userinfo("https://u:p@h:1/x?y@z").as_deref(),
        Some("https://h:1/x?y@z")
    );
    assert_eq!(sanitize::strip_userinfo("https://h/x"), None);
}

/// Branches, a worktree on a new branch, a diff between refs, and a hard
/// reset: what the plan loop and the jobs do between turns.
#[tokio::test]
async fn branches_worktrees_diffs_and_resets() {
    let (d, git) = repo().await;
    let base = git.head().await.unwrap();
    assert!(matches!(
        git.branch_create("bad..name", "HEAD").await,
        Err(VcsError::BadName(_))
    ));
    let wt_path = d.path().join("wt");
    let wt = git
        .worktree_add(&wt_path, Some("feature/x"), "HEAD")
        .await
        .unwrap();
    assert_eq!(
        wt.current_branch().await.unwrap().as_deref(),
        Some("feature/x")
    );
    std::fs::write(wt_path.join("f.txt"), "feature\n").unwrap();
    let c = match commit(&wt, &[]).await {
        CommitOutcome::Committed(c) => c,
        other => panic!("{other:?}"),
    };
    // The main tree is untouched; the diff between the refs shows the change.
    assert!(git.dirty(&[]).await.unwrap().is_empty());
    assert_eq!(git.diff_names(&base, &c.sha).await.unwrap(), ["f.txt"]);
    assert!(git
        .diff(&base, Some("feature/x"))
        .await
        .unwrap()
        .contains("+feature"));
    assert_eq!(git.worktrees().await.unwrap().len(), 2);
    git.worktree_remove(&wt_path, false).await.unwrap();
    assert!(!wt_path.exists());
    git.worktree_prune().await.unwrap();
    assert!(git.branch_exists("feature/x").await.unwrap());
    git.switch("feature/x").await.unwrap();
    assert!(git.root().join("f.txt").exists());
    git.reset(Reset::Hard, &base).await.unwrap();
    assert!(!git.root().join("f.txt").exists());
    assert_eq!(git.head().await.unwrap(), base);
}

/// A stash is named by its SHA: another stash made later does not shift it,
/// and untracked files go into it too.
#[tokio::test]
async fn stashes_are_addressed_by_sha() {
    let (_d, git) = repo().await;
    let root = git.root().to_path_buf();
    assert_eq!(git.stash_push("clean").await.unwrap(), None);
    std::fs::write(root.join("a.txt"), "first\n").unwrap();
    std::fs::write(root.join("new.txt"), "untracked\n").unwrap();
    let first = git.stash_push("round 1").await.unwrap().unwrap();
    assert!(git.dirty(&[]).await.unwrap().is_empty());
    std::fs::write(root.join("a.txt"), "second\n").unwrap();
    let second = git.stash_push("round 2").await.unwrap().unwrap();
    let list = git.stash_list().await.unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].sha, second);
    assert!(list[1].message.contains("round 1"), "{list:?}");
    git.stash_apply(&first).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "first\n"
    );
    assert!(root.join("new.txt").exists());
    git.stash_drop(&first).await.unwrap();
    let list = git.stash_list().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].sha, second);
    assert!(matches!(
        git.stash_drop(&first).await,
        Err(VcsError::NoSuchStash(_))
    ));
    // create + store: a stash made without touching the tree, kept by SHA.
    git.reset(Reset::Hard, "HEAD").await.unwrap();
    std::fs::remove_file(root.join("new.txt")).unwrap();
    std::fs::write(root.join("a.txt"), "third\n").unwrap();
    let made = git.stash_create("made").await.unwrap().unwrap();
    assert_eq!(git.dirty(&[]).await.unwrap(), ["a.txt"]);
    git.stash_store(&made, "stored").await.unwrap();
    assert_eq!(git.stash_list().await.unwrap()[0].sha, made);
}

/// A checkout of a remote at a short commit, a push back, and credentials:
/// the checkout's origin and every error are free of them.
#[tokio::test]
async fn remote_checkout_push_and_credentials() {
    let (d, git) = repo().await;
    let root = git.root().to_path_buf();
    std::fs::write(root.join("b.txt"), "b\n").unwrap();
    let second = match commit(&git, &[]).await {
        CommitOutcome::Committed(c) => c.sha,
        other => panic!("{other:?}"),
    };
    let bare = d.path().join("remote.git");
    sh(
        d.path(),
        &[
            "clone",
            "-q",
            "--bare",
            root.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let url = format!("file://{}", bare.display());
    let hooks = d.path().join("no-hooks");
    let co = Git::checkout_remote(
        &d.path().join("co"),
        &hooks,
        &url,
        Some(&second[..9]),
        std::time::Duration::from_secs(60),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(co.head().await.unwrap(), second);
    std::fs::write(co.root().join("c.txt"), "c\n").unwrap();
    let third = match commit(&co, &[]).await {
        CommitOutcome::Committed(c) => c.sha,
        other => panic!("{other:?}"),
    };
    co.push("origin", "HEAD:refs/heads/pushed").await.unwrap();
    let pushed = Command::new("git")
        .args(["rev-parse", "refs/heads/pushed"])
        .current_dir(&bare)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&pushed.stdout).trim(), third);
    // Credentials: a failed checkout names the URL without them, and the
    // origin it leaves behind has none.
    let secret = "https://bob:hunter2-x@127.0.0.1:9/none.git";
    let dir = d.path().join("fail");
    let e = Git::checkout_remote(
        &dir,
        &hooks,
        secret,
        Some("main"),
        std::time::Duration::from_secs(30),
        Vec::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(!e.contains("hunter2-x"), "{e}");
    let cfg = std::fs::read_to_string(dir.join(".git/config")).unwrap();
    assert!(
        !cfg.contains("hunter2-x") && cfg.contains("127.0.0.1:9"),
        "{cfg}"
    );
}

/// A merge driver and a remote's upload-pack planted in the config run
/// neither during a stash apply that merges nor during a fetch.
#[tokio::test]
async fn planted_merge_drivers_and_remote_helpers_never_run() {
    let (d, git) = repo().await;
    let root = git.root().to_path_buf();
    let m = d.path().join("MARKER").display().to_string();
    let bare = d.path().join("remote.git");
    sh(
        d.path(),
        &[
            "clone",
            "-q",
            "--bare",
            root.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let mut cfg = std::fs::OpenOptions::new()
        .append(true)
        .open(root.join(".git/config"))
        .unwrap();
    use std::io::Write as _;
    write!(
        cfg,
        "[merge \"m\"]\n\tdriver = touch {m}-merge; false\n[remote \"planted\"]\n\turl = {}\n\tuploadpack = touch {m}-upload; git-upload-pack\n\tfetch = +refs/heads/*:refs/remotes/planted/*\n",
        bare.display()
    )
    .unwrap();
    std::fs::write(root.join(".gitattributes"), "*.txt merge=m\n").unwrap();
    sh(&root, &["add", ".gitattributes"]);
    sh(&root, &["commit", "-q", "-m", "attrs"]);
    std::fs::write(root.join("a.txt"), "stashed\n").unwrap();
    let sha = git.stash_push("mine").await.unwrap().unwrap();
    std::fs::write(root.join("a.txt"), "committed\n").unwrap();
    sh(&root, &["commit", "-q", "-am", "diverge"]);
    // The driver is `false`: the merge conflicts instead of running a program.
    assert!(git.stash_apply(&sha).await.is_err());
    git.fetch("planted", &[]).await.unwrap();
    let ran = markers(d.path());
    assert!(ran.is_empty(), "ran on the host: {ran:?}");
}

/// The paths kept out of a stash stay in the tree as they were, untracked
/// or changed; everything else goes into the stash.
#[tokio::test]
async fn a_stash_can_leave_named_paths_alone() {
    let (_d, git) = repo().await;
    let root = git.root().to_path_buf();
    std::fs::create_dir_all(root.join("prompts")).unwrap();
    std::fs::write(root.join("prompts/main.md"), "the prompt\n").unwrap();
    let keep = vec!["prompts/main.md".to_string()];
    assert_eq!(
        git.stash_push_except("only kept", &keep).await.unwrap(),
        None
    );
    std::fs::write(root.join("a.txt"), "changed\n").unwrap();
    std::fs::write(root.join("work.txt"), "new\n").unwrap();
    let sha = git
        .stash_push_except("round", &keep)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(git.dirty(&[]).await.unwrap(), ["prompts/main.md"]);
    assert_eq!(
        std::fs::read_to_string(root.join("prompts/main.md")).unwrap(),
        "the prompt\n"
    );
    assert!(!root.join("work.txt").exists());
    git.stash_apply(&sha).await.unwrap();
    assert!(root.join("work.txt").exists());
}

/// A filter driver named with `=` in it (`a=b`) is neutralised too: git
/// splits `-c` at the first `=`, so belay's overrides travel in
/// GIT_CONFIG_KEY_n / GIT_CONFIG_VALUE_n.
#[tokio::test]
async fn a_filter_named_with_an_equals_sign_never_runs() {
    let (d, git) = repo().await;
    let root = git.root().to_path_buf();
    let m = d.path().join("MARKER").display().to_string();
    let mut cfg = std::fs::OpenOptions::new()
        .append(true)
        .open(root.join(".git/config"))
        .unwrap();
    use std::io::Write as _;
    write!(
        cfg,
        "[filter \"a=b\"]\n\tclean = sh -c 'touch {m}-eq; cat'\n"
    )
    .unwrap();
    std::fs::write(root.join(".gitattributes"), "* filter=a=b\n").unwrap();
    std::fs::write(root.join("a.txt"), "changed\n").unwrap();
    git.dirty(&[]).await.unwrap();
    git.stash_push("s").await.unwrap();
    assert!(
        markers(d.path()).is_empty(),
        "ran on the host: {:?}",
        markers(d.path())
    );
}

/// A `commondir` written after the repository was opened (a sandbox that can
/// write the git dir) does not move belay's git to another config.
#[tokio::test]
async fn a_commondir_planted_later_is_ignored() {
    let (d, git) = repo().await;
    let root = git.root().to_path_buf();
    let m = d.path().join("MARKER").display().to_string();
    let evil = root.join(".git/c");
    std::fs::create_dir_all(&evil).unwrap();
    let cp = |what: &str| {
        let ok = std::process::Command::new("cp")
            .arg("-r")
            .arg(root.join(".git").join(what))
            .arg(evil.join(what))
            .status()
            .unwrap()
            .success();
        assert!(ok);
    };
    cp("objects");
    cp("refs");
    cp("HEAD");
    std::fs::write(
        evil.join("config"),
        format!("[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch {m}-fsmonitor\n"),
    )
    .unwrap();
    std::fs::write(root.join(".git/commondir"), "c\n").unwrap();
    std::fs::write(root.join("a.txt"), "changed\n").unwrap();
    git.dirty(&[]).await.unwrap();
    git.stash_push("s").await.unwrap();
    assert!(
        markers(d.path()).is_empty(),
        "ran on the host: {:?}",
        markers(d.path())
    );
    assert_eq!(git.common_dir(), root.join(".git"));
}

/// The guard puts the git dir back after a sandbox wrote it: hooks, the
/// redirecting files, links (a reflog linked to a host file), set-id bits,
/// and the locks it left.
#[tokio::test]
async fn the_git_dir_guard_undoes_what_a_sandbox_planted() {
    use std::os::unix::fs::PermissionsExt;
    let (d, git) = repo().await;
    let root = git.root().to_path_buf();
    let g = root.join(".git");
    std::fs::write(g.join("hooks/pre-commit.sample"), "#!/bin/sh\n").unwrap();
    let guard = git.guard_git_dir();
    // What an agent leaves.
    std::fs::write(g.join("hooks/pre-commit"), "#!/bin/sh\ntouch /tmp/x\n").unwrap();
    std::fs::write(g.join("hooks/pre-commit.sample"), "changed\n").unwrap();
    std::fs::write(g.join("commondir"), "c\n").unwrap();
    std::fs::write(g.join("info/attributes"), "* filter=x\n").unwrap();
    let target = d.path().join("host-file");
    std::fs::write(&target, "host\n").unwrap();
    std::fs::create_dir_all(g.join("logs/refs")).unwrap();
    std::os::unix::fs::symlink(&target, g.join("logs/refs/stash")).unwrap();
    std::fs::write(g.join("suid"), "x").unwrap();
    std::fs::set_permissions(g.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::write(g.join("index.lock"), "").unwrap();
    let r = guard.restore().unwrap();
    assert_eq!(r.links_removed, ["logs/refs/stash"]);
    assert_eq!(r.locks_removed, ["index.lock"]);
    assert_eq!(r.modes_cleared, ["suid"]);
    assert_eq!(
        r.restored,
        [
            "commondir",
            "hooks/pre-commit",
            "hooks/pre-commit.sample",
            "info/attributes"
        ]
    );
    assert!(!g.join("hooks/pre-commit").exists());
    assert_eq!(
        std::fs::read_to_string(g.join("hooks/pre-commit.sample")).unwrap(),
        "#!/bin/sh\n"
    );
    assert!(!g.join("commondir").exists());
    assert_eq!(
        std::fs::metadata(g.join("suid"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    // The stash now writes its reflog in the git dir, never through the link.
    std::fs::write(root.join("a.txt"), "changed\n").unwrap();
    git.stash_push("after").await.unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "host\n");
    assert!(
        guard.restore().unwrap().is_empty(),
        "a second pass finds nothing"
    );
}

/// The guard's second round of attacks: a link deep in `logs/`, a lock
/// backdated with `touch -d`, a `HEAD` made a link, a linked
/// `objects/pack`, a planted worktree and replace ref; and the user's own
/// linked hook is kept.
#[tokio::test]
async fn the_guard_sees_deep_links_backdated_locks_and_keeps_the_users_links() {
    let (d, git) = repo().await;
    let root = git.root().to_path_buf();
    let g = root.join(".git");
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    std::fs::write(root.join("scripts/pre-commit"), "#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("../../scripts/pre-commit", g.join("hooks/pre-commit")).unwrap();
    let head = std::fs::read(g.join("HEAD")).unwrap();
    let guard = git.guard_git_dir();
    let target = d.path().join("host-file");
    std::fs::write(&target, "host\n").unwrap();
    let deep = g.join("logs/refs/heads/c1/c2/c3/c4/c5/c6/c7/c8/c9/c10/c11/c12/c13/c14/c15/c16/c17");
    std::fs::create_dir_all(&deep).unwrap();
    std::os::unix::fs::symlink(&target, deep.join("leaf")).unwrap();
    std::fs::write(g.join("index.lock"), "").unwrap();
    let old = std::process::Command::new("touch")
        .args(["-d", "2001-01-01"])
        .arg(g.join("index.lock"))
        .status()
        .unwrap();
    assert!(old.success());
    std::fs::remove_file(g.join("HEAD")).unwrap();
    std::os::unix::fs::symlink(&target, g.join("HEAD")).unwrap();
    std::fs::remove_dir_all(g.join("objects/pack")).unwrap();
    std::os::unix::fs::symlink(d.path(), g.join("objects/pack")).unwrap();
    std::fs::create_dir_all(g.join("worktrees/wt")).unwrap();
    std::fs::write(g.join("worktrees/wt/commondir"), "../../evil\n").unwrap();
    std::fs::create_dir_all(g.join("refs/replace")).unwrap();
    std::fs::write(g.join("refs/replace/abc"), "0000\n").unwrap();
    // The user's linked hook swapped for the agent's own file; a FIFO where
    // git reads its index; a lock that is a dir; a link with a name that is
    // not UTF-8.
    std::fs::remove_file(g.join("hooks/pre-commit")).unwrap();
    std::fs::write(g.join("hooks/pre-commit"), "#!/bin/sh\ntouch /tmp/pwned\n").unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(g.join("FETCH_HEAD"))
        .status()
        .unwrap();
    assert!(fifo.success());
    std::fs::create_dir_all(g.join("refs/stash.lock")).unwrap();
    {
        use std::os::unix::ffi::OsStrExt;
        let odd = g
            .join("logs/refs/heads")
            .join(std::ffi::OsStr::from_bytes(b"b\xff"));
        std::os::unix::fs::symlink(&target, odd).unwrap();
    }
    let r = guard.restore().unwrap();
    assert!(
        r.links_removed
            .iter()
            .any(|l| l.starts_with("logs/refs/heads/b")),
        "{r:?}"
    );
    assert_eq!(r.specials_removed, ["FETCH_HEAD"]);
    assert!(
        r.locks_removed.contains(&"refs/stash.lock".to_string()),
        "{r:?}"
    );
    assert_eq!(
        std::fs::read_link(g.join("hooks/pre-commit")).unwrap(),
        std::path::Path::new("../../scripts/pre-commit")
    );
    assert!(r.links_removed.contains(&"HEAD".to_string()), "{r:?}");
    assert!(
        r.links_removed.contains(&"objects/pack".to_string()),
        "{r:?}"
    );
    assert!(
        r.links_removed.iter().any(|l| l.ends_with("c17/leaf")),
        "{r:?}"
    );
    assert_eq!(r.locks_removed, ["index.lock", "refs/stash.lock"]);
    assert!(
        r.restored.contains(&"HEAD".to_string())
            && r.restored.contains(&"worktrees/wt".to_string())
            && r.restored.contains(&"refs/replace/abc".to_string()),
        "{r:?}"
    );
    assert_eq!(std::fs::read(g.join("HEAD")).unwrap(), head);
    assert!(g.join("objects/pack").is_dir());
    assert!(
        std::fs::symlink_metadata(g.join("hooks/pre-commit"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the user's linked hook stays"
    );
    std::fs::write(root.join("a.txt"), "changed\n").unwrap();
    git.stash_push("after").await.unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "host\n");
}

/// A commit's patch is recorded up to a bound: git is stopped there, and the
/// record says it was cut.
#[tokio::test]
async fn a_big_commits_patch_is_cut_at_its_bound() {
    let (_d, git) = repo().await;
    let big: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(git.root().join("big.txt"), &big).unwrap();
    let c = match commit(&git, &[]).await {
        CommitOutcome::Committed(c) => c,
        other => panic!("{other:?}"),
    };
    let patch = git.commit_patch(&c.sha, 10_000).await.unwrap();
    assert!(patch.len() < 10_200, "{}", patch.len());
    assert!(
        patch.contains("+line 0\n") && patch.contains("cut at 10000 bytes"),
        "{patch:.300}"
    );
    let whole = git.commit_patch(&c.sha, 1 << 20).await.unwrap();
    assert!(whole.contains("+line 19999") && !whole.contains("cut at"));
}
