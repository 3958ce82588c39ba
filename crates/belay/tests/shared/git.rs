//! git for the integration tests, with a fixed identity for commits.

use std::path::Path;
use std::process::Command;

/// Run git in `dir`; its trimmed stdout. Fails the test with git's stderr.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=belay-test",
            "-c",
            "user.email=test@example.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Make `dir` a repository whose first commit holds everything in it.
#[allow(dead_code)]
pub fn init_repo(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "initial"]);
}

/// A repository `<dir>/site` of `files` (name, text), first commit pushed to a
/// bare `<dir>/remote.git` as `origin/main`: (the repository, the remote).
#[allow(dead_code)]
pub fn site_with_remote(
    dir: &Path,
    files: &[(&str, &str)],
) -> (std::path::PathBuf, std::path::PathBuf) {
    let remote = dir.join("remote.git");
    git(
        dir,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            remote.to_str().unwrap(),
        ],
    );
    let site = dir.join("site");
    std::fs::create_dir_all(&site).unwrap();
    for (name, text) in files {
        std::fs::write(site.join(name), text).unwrap();
    }
    init_repo(&site);
    git(
        &site,
        &["remote", "add", "origin", remote.to_str().unwrap()],
    );
    git(&site, &["push", "-q", "-u", "origin", "main"]);
    (site, remote)
}
