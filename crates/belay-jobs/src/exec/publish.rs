//! After the agent: the configured checks in the sandbox, then belay's
//! commit on the host (hooks off, what is never committed left out, a
//! secret refused) and the push; or, where the repository asks for commit
//! approval, the diff held by SHA until the owner decides.

use belay_record::RunHandle;
use belay_vcs::{CommitOutcome, Git};

use super::repos::{RepoWork, Workspace};
use crate::events::{JobEvent, JobRun};
use crate::services::Services;
use crate::JobsError;

/// What became of one repository's change.
#[derive(Debug, Clone)]
pub enum RepoResult {
    Unchanged,
    Committed {
        hash: String,
        files: usize,
        /// Why the push failed, if it did (the commit stays on the job branch).
        push_error: Option<String>,
    },
    Refused(String),
    Held {
        stash: String,
    },
}

/// Run every repository's checks; the report of the first failure.
pub async fn checks(
    svc: &Services,
    run: &JobRun,
    ws: &Workspace,
) -> Result<Option<String>, JobsError> {
    for r in &ws.repos {
        if r.cfg.checks.is_empty() {
            continue;
        }
        let rt = svc.rt.clone().ok_or_else(|| {
            JobsError::Environment(format!(
                "`{}` has checks, which belay runs in a container: start Docker (./scripts/setup-host.sh)",
                r.cfg.name
            ))
        })?;
        let commands: Vec<(String, String)> = r
            .cfg
            .checks
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("check{}", i + 1), c.clone()))
            .collect();
        let ran = belay_agent::checks::run(belay_agent::checks::Checks {
            rt,
            image: &svc.cfg.agent.image,
            run_id: run.id(),
            kind: "jobs-check",
            tree: &r.wt_path,
            git: Some(&r.wt),
            records: run.path("box"),
            commands: &commands,
            timeout: svc.cfg.check_timeout,
            log_prefix: run.path("checks").join(format!("{}-", r.cfg.name)),
            redactor: run.redactor(),
            env: &ws.env.gate,
        })
        .await?;
        let passed = ran.iter().all(|c| c.passed());
        let _ = run.emit(
            "jobs",
            Some("checks"),
            &JobEvent::ChecksRan {
                repo: r.cfg.name.clone(),
                passed,
                commands: ran.clone(),
            },
        );
        if !passed {
            let mut out = String::new();
            if let Some(c) = ran.iter().find(|c| !c.passed()) {
                out.push_str(&format!(
                    "{}: the check `{}` {}; nothing was committed.\n",
                    r.cfg.name,
                    c.command,
                    if c.timed_out {
                        format!(
                            "timed out after {:.0} s",
                            svc.cfg.check_timeout.as_secs_f64()
                        )
                    } else {
                        format!("failed (exit {})", c.exit_code)
                    }
                ));
                if !c.output_tail.trim().is_empty() {
                    out.push_str(&format!(
                        "```\n{}\n```\n",
                        belay_agent::checks::last_chars(c.output_tail.trim_end(), 2000)
                    ));
                }
            }
            return Ok(Some(out));
        }
    }
    Ok(None)
}

/// Commit the worktree's change with belay's author, hooks off.
pub async fn commit(
    svc: &Services,
    run: &JobRun,
    wt: &Git,
    name: &str,
    message: &str,
) -> Result<RepoResult, JobsError> {
    // The message is the agent's text too: a secret in it is refused.
    if run.redactor().redact(message) != message {
        let why =
            "the commit message contains the value of a secret; nothing was committed".to_string();
        let _ = run.emit(
            "jobs",
            Some("commit"),
            &JobEvent::CommitRefused {
                repo: name.to_string(),
                reason: why.clone(),
            },
        );
        return Ok(RepoResult::Refused(why));
    }
    // A link the agent made may not point outside the tree: the commit
    // reaches the remote, a deploy, and a checkout that follows it.
    if let Some(bad) = escaping_links(wt).await? {
        let why = format!("the change holds a link that points outside the repository ({bad}); nothing was committed");
        let _ = run.emit(
            "jobs",
            Some("commit"),
            &JobEvent::CommitRefused {
                repo: name.to_string(),
                reason: why.clone(),
            },
        );
        return Ok(RepoResult::Refused(why));
    }
    let scanner = run.redactor().scanner();
    let submodules = wt.submodule_paths().await?;
    let outcome = wt
        .commit_checked(belay_vcs::CommitRequest {
            message: message.to_string(),
            author: Some(svc.cfg.author.clone()),
            exclude: vec![],
            exclude_globs: belay_vcs::excludes::agent_exclude_globs(),
            allow_empty: false,
            paths: vec![],
            submodules,
            scan: Box::new(move |_, r| scanner.scan(r)),
        })
        .await?;
    if let CommitOutcome::Committed(c) = &outcome {
        wt.record_commit(run, &c.sha).await;
    }
    Ok(match outcome {
        CommitOutcome::Committed(c) => RepoResult::Committed {
            hash: c.sha,
            files: c.files_total,
            push_error: None,
        },
        CommitOutcome::Nothing => RepoResult::Unchanged,
        CommitOutcome::Refused(r) => {
            let _ = run.emit(
                "jobs",
                Some("commit"),
                &JobEvent::CommitRefused {
                    repo: name.to_string(),
                    reason: r.to_string(),
                },
            );
            RepoResult::Refused(r.to_string())
        }
    })
}

/// Commit and push one repository of the workspace.
pub async fn commit_and_push(
    svc: &Services,
    run: &JobRun,
    r: &RepoWork,
    message: &str,
) -> Result<RepoResult, JobsError> {
    let mut res = commit(svc, run, &r.wt, &r.cfg.name, message).await?;
    if let RepoResult::Committed {
        hash,
        files,
        push_error,
    } = &mut res
    {
        let _ = run.emit(
            "jobs",
            Some("commit"),
            &JobEvent::Committed {
                repo: r.cfg.name.clone(),
                branch: r.target.clone(),
                hash: hash.clone(),
                files: *files,
            },
        );
        if r.cfg.push {
            match r
                .wt
                .push(&r.remote, &format!("HEAD:refs/heads/{}", r.target))
                .await
            {
                Ok(()) => {
                    // Saved at once: a belay killed from here on records the
                    // job at its next start instead of running it again.
                    note_published(run, &r.cfg.name, &r.target, hash)?;
                    let _ = run.emit(
                        "jobs",
                        Some("push"),
                        &JobEvent::Pushed {
                            repo: r.cfg.name.clone(),
                            remote: r.remote.clone(),
                            branch: r.target.clone(),
                            hash: hash.clone(),
                        },
                    );
                }
                Err(e) => {
                    let _ = run.emit(
                        "jobs",
                        Some("push"),
                        &JobEvent::PublishFailed {
                            repo: r.cfg.name.clone(),
                            reason: e.to_string(),
                        },
                    );
                    *push_error = Some(e.to_string());
                }
            }
        }
    }
    Ok(res)
}

/// Hold the worktree's change for the owner's approval: a stash by SHA in
/// the repository's stash list.
pub async fn hold(run: &JobRun, r: &RepoWork, job_id: &str) -> Result<RepoResult, JobsError> {
    match r.wt.stash_push(&format!("belay-job-{job_id}-held")).await? {
        None => Ok(RepoResult::Unchanged),
        Some(stash) => {
            let _ = run.emit(
                "jobs",
                Some("commit"),
                &JobEvent::HeldForApproval {
                    repo: r.cfg.name.clone(),
                    stash: stash.clone(),
                },
            );
            Ok(RepoResult::Held { stash })
        }
    }
}

/// What a held stash holds, for the owner: each path with its change
/// (`A` added, `M` modified, `D` deleted; new files included), then the
/// stat.
pub async fn held_summary(main: &Git, stash: &str) -> String {
    let names = main
        .run(&[
            "stash",
            "show",
            "--include-untracked",
            "--name-status",
            stash,
        ])
        .await
        .unwrap_or_default();
    let stat = main
        .run(&["stash", "show", "--include-untracked", "--stat", stash])
        .await
        .unwrap_or_default();
    let stat_last = stat.lines().last().unwrap_or_default().trim();
    format!("{}\n{stat_last}", names.trim_end())
}

/// The file of a job's pushed commits.
pub const PUBLISHED: &str = "published.json";

fn note_published(run: &RunHandle, repo: &str, branch: &str, hash: &str) -> Result<(), JobsError> {
    let p = run.path(PUBLISHED);
    // host-owned: the job's run directory under the queue (no agent mounts it).
    let mut all: Vec<crate::record::CommitRef> = fs_err::read_to_string(&p)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    all.push(crate::record::CommitRef {
        repo: repo.to_string(),
        branch: branch.to_string(),
        hash: hash.to_string(),
    });
    belay_record::write_json_atomic(&p, &all)?;
    Ok(())
}

/// The commits a job pushed before belay was killed, if any.
pub fn published(run_dir: &std::path::Path) -> Vec<crate::record::CommitRef> {
    // host-owned: the job's run directory under the queue (no agent mounts it).
    fs_err::read_to_string(run_dir.join(PUBLISHED))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// The symbolic links git tracks (mode 120000), as relative paths.
async fn tracked_links(wt: &Git) -> Result<Vec<String>, JobsError> {
    let out = wt.run(&["ls-files", "-s", "-z"]).await?;
    Ok(out
        .split('\0')
        .filter_map(|e| {
            let (meta, path) = e.split_once('\t')?;
            meta.starts_with("120000 ").then(|| path.to_string())
        })
        .collect())
}

/// The first link the commit would carry whose target, resolved the way the
/// OS resolves it (every link on the way followed, in the tree's own
/// contents: [`belay_sandbox::hostfs::resolve_in_tree`]), leaves the tree:
/// an absolute link, a `..` above the root, a chain too long to follow. A
/// link is checked when the change made or changed it, or when its
/// resolution looks at a path the change touched (a tracked link through a
/// directory the agent made a link). A tree that changes while it is
/// checked is refused too.
async fn escaping_links(wt: &Git) -> Result<Option<String>, JobsError> {
    use belay_sandbox::hostfs::{self, HostFsError};
    use std::path::Path;
    let dirty: std::collections::BTreeSet<String> = wt.dirty(&[]).await?.into_iter().collect();
    let tracked = tracked_links(wt).await?;
    let root = wt.root();
    let candidates = dirty
        .iter()
        .chain(tracked.iter().filter(|t| !dirty.contains(*t)));
    for rel in candidates {
        let changed = dirty.contains(rel);
        let io = |e: HostFsError| match e {
            HostFsError::Io { op, path, source } => Err(JobsError::io(op, &path, source)),
            e @ HostFsError::Refused { .. } => Ok(e),
        };
        let target = match hostfs::read_link(root, Path::new(rel)) {
            Ok(Some(t)) => t,
            Ok(None) => continue,
            Err(e) => {
                let e = io(e)?;
                return Ok(Some(format!("{rel}: {e}")));
            }
        };
        let mut touches = false;
        let resolved = hostfs::resolve_in_tree_seeing(root, Path::new(rel), &mut |p: &Path| {
            touches = touches || p.to_str().is_some_and(|s| dirty.contains(s));
        });
        let shown = format!("{rel} -> {}", target.display());
        match resolved {
            Ok(r) if r.escapes() && (changed || touches) => return Ok(Some(shown)),
            Ok(_) => {}
            Err(e) => {
                let e = io(e)?;
                return Ok(Some(format!("{shown}: {e}")));
            }
        }
    }
    Ok(None)
}

/// What one repository's result tells the sender, and the commit it leaves
/// (`pushes`: the repository's `push`).
pub fn describe(
    name: &str,
    target: &str,
    job_id: &belay_record::Id,
    pushes: bool,
    r: &RepoResult,
) -> (Option<String>, Option<crate::record::CommitRef>) {
    let branch = super::repos::job_branch(job_id);
    let commit = |branch: &str, hash: &str| crate::record::CommitRef {
        repo: name.to_string(),
        branch: branch.to_string(),
        hash: hash.to_string(),
    };
    match r {
        RepoResult::Committed { hash, push_error: None, .. } if !pushes => (
            Some(format!("{name}: committed on branch {branch} (commit {hash}); not pushed (push = false).")),
            Some(commit(&branch, hash)),
        ),
        RepoResult::Committed { hash, push_error: None, .. } => (
            Some(format!("{name}: committed and pushed to {target} (commit {hash}).")),
            Some(commit(target, hash)),
        ),
        RepoResult::Committed { hash, push_error: Some(e), .. } => (
            Some(format!("{name}: committed ({hash}) but the push to {target} failed; the commit is kept on branch {branch}:\n{e}")),
            Some(commit(&branch, hash)),
        ),
        RepoResult::Refused(why) => (Some(format!("{name}: not committed: {why}")), None),
        RepoResult::Held { .. } => (
            Some(format!("{name}: the change waits for the owner's approval (/approve {job_id} or /discard {job_id}).")),
            None,
        ),
        RepoResult::Unchanged => (None, None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    async fn repo() -> (tempfile::TempDir, Git) {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir_all(ws.join("d/x")).unwrap();
        std::fs::write(ws.join("d/x/keep"), "k\n").unwrap();
        std::fs::write(ws.join("f"), "f\n").unwrap();
        // A tracked link that stays inside while `d/x` is a directory.
        symlink("x/../../f", ws.join("d/l")).unwrap();
        git(&ws, &["init", "-q", "-b", "main"]);
        git(&ws, &["add", "-A"]);
        git(&ws, &["commit", "-q", "-m", "init"]);
        let g = Git::open(&ws, &d.path().join("no-hooks")).await.unwrap();
        (d, g)
    }

    #[tokio::test]
    async fn a_link_chain_out_of_the_tree_is_refused() {
        let (_d, g) = repo().await;
        let root = g.root().to_path_buf();
        assert_eq!(escaping_links(&g).await.unwrap(), None);
        let deep = root.join("a/b/c/d/e/f/g/h/i/j");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("readme"), "r\n").unwrap();
        symlink([".."; 10].join("/"), deep.join("x")).unwrap();
        assert_eq!(
            escaping_links(&g).await.unwrap(),
            None,
            "a link to the root is inside"
        );
        let target = format!("x/{}/etc/passwd", [".."; 11].join("/"));
        symlink(&target, deep.join("passwd")).unwrap();
        assert_eq!(
            escaping_links(&g).await.unwrap(),
            Some(format!("a/b/c/d/e/f/g/h/i/j/passwd -> {target}"))
        );
    }

    #[tokio::test]
    async fn links_inside_the_tree_pass_and_absolute_ones_do_not() {
        let (_d, g) = repo().await;
        let root = g.root().to_path_buf();
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        symlink("../f", root.join("sub/to-f")).unwrap();
        symlink("sub/to-f", root.join("to-link")).unwrap();
        symlink("../../f", root.join("sub/deeper/rel")).unwrap();
        assert_eq!(escaping_links(&g).await.unwrap(), None);
        symlink("/etc/passwd", root.join("abs")).unwrap();
        assert_eq!(
            escaping_links(&g).await.unwrap(),
            Some("abs -> /etc/passwd".to_string())
        );
    }

    /// The tracked `d/l -> x/../../f` is unchanged, but the change makes
    /// `d/x` a link to the root: `d/l` now leaves the tree.
    #[tokio::test]
    async fn a_tracked_link_redirected_out_of_the_tree_is_refused() {
        let (_d, g) = repo().await;
        let root = g.root().to_path_buf();
        std::fs::remove_dir_all(root.join("d/x")).unwrap();
        symlink("..", root.join("d/x")).unwrap();
        assert_eq!(
            escaping_links(&g).await.unwrap(),
            Some("d/l -> x/../../f".to_string())
        );
    }
}
