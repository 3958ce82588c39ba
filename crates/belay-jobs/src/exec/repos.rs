//! A job's repositories: the per-repository locks (sorted), the foreign
//! changes of each main checkout stashed by SHA, a worktree per repository
//! on `builder-job-<id>` from its upstream branch, and afterwards (on every
//! path, a failure too) the worktrees gone and the foreign changes back.
//!
//! What was done is saved in the run's state before the next step, so that
//! a `kill -9` anywhere is undone by the next start ([`undo`]).

use std::path::{Path, PathBuf};

use belay_record::{Id, RunHandle};
use belay_vcs::{Git, RepoLock};
use serde::{Deserialize, Serialize};

use crate::config::RepoConfig;
use crate::events::{JobEvent, JobRun};
use crate::queue::Queue;
use crate::JobsError;

/// What a job changed in a repository, as saved (to be undone).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Touched {
    pub repo: PathBuf,
    pub name: String,
    /// The foreign changes of the main checkout.
    pub stash: Option<String>,
    pub worktree: Option<PathBuf>,
    pub branch: Option<String>,
}

/// A job's saved state (the run's `state.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobState {
    pub job_id: String,
    pub touched: Vec<Touched>,
    /// Commits made and not yet pushed or recorded.
    #[serde(default)]
    pub commits: Vec<crate::record::CommitRef>,
}

/// One repository of a running job.
pub struct RepoWork {
    pub cfg: RepoConfig,
    pub main: Git,
    pub wt: Git,
    pub wt_path: PathBuf,
    /// `builder-job-<id>`.
    pub branch: String,
    pub remote: String,
    /// The branch pushed to.
    pub target: String,
    /// The commit the worktree started at.
    pub base: String,
    pub stash: Option<String>,
}

pub struct Workspace {
    pub repos: Vec<RepoWork>,
    pub state: JobState,
    /// The image's environment over the worktrees (an env build's image):
    /// the agent's writable set, the checks' read-only one.
    pub env: belay_sandbox::envimage::RunEnv,
    _locks: Vec<RepoLock>,
}

pub fn hooks_dir() -> PathBuf {
    belay_record::no_hooks_dir()
}

pub fn job_branch(id: &Id) -> String {
    format!("builder-job-{id}")
}

fn save(run: &RunHandle, st: &JobState) -> Result<(), JobsError> {
    run.save_state(st)?;
    Ok(())
}

/// The remote and branch a checkout pushes to: the configured branch, else
/// its upstream.
async fn target(main: &Git, cfg: &RepoConfig) -> Result<(String, String), JobsError> {
    if let Some(b) = &cfg.branch {
        return Ok((cfg.remote.clone(), b.clone()));
    }
    let up = main
        .run(&[
            "rev-parse",
            "--abbrev-ref",
            "--symbolic-full-name",
            "@{upstream}",
        ])
        .await
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    match up.as_deref().and_then(|u| u.split_once('/')) {
        Some((r, b)) => Ok((r.to_string(), b.to_string())),
        None => Err(JobsError::Refused(format!(
            "the repository {} has no upstream branch to build from and push to: set one (git branch -u origin/main) or give `branch` in its [[repo]] table",
            cfg.path.display()
        ))),
    }
}

impl Workspace {
    /// Lock, stash and add the worktrees.
    pub async fn prepare(
        q: &Queue,
        run: &JobRun,
        job_id: &Id,
        repos: &[RepoConfig],
        lock_wait: std::time::Duration,
    ) -> Result<Workspace, JobsError> {
        let hooks = hooks_dir();
        let mut mains = Vec::new();
        for r in repos {
            let g = Git::open(&r.path, &hooks).await.map_err(|e| {
                JobsError::Refused(format!(
                    "repository `{}` ({}): {e}",
                    r.name,
                    r.path.display()
                ))
            })?;
            mains.push((r.clone(), g));
        }
        let commons: Vec<PathBuf> = mains
            .iter()
            .map(|(_, g)| g.common_dir().to_path_buf())
            .collect();
        let locks = RepoLock::acquire_sorted(&commons, &format!("job {job_id}"), lock_wait).await?;
        let mut ws = Workspace {
            repos: Vec::new(),
            state: JobState {
                job_id: job_id.to_string(),
                ..Default::default()
            },
            env: Default::default(),
            _locks: locks,
        };
        match ws.add(q, run, job_id, mains).await {
            Ok(()) => Ok(ws),
            Err(e) => {
                // Undo the part done, from the saved state, once the locks
                // are free again.
                let _ = save(run, &ws.state);
                drop(ws);
                if let Err(u) = undo(q, job_id, lock_wait).await {
                    tracing::warn!("job {job_id}: undoing the prepared worktrees: {u}");
                }
                Err(e)
            }
        }
    }

    async fn add(
        &mut self,
        q: &Queue,
        run: &JobRun,
        job_id: &Id,
        mains: Vec<(RepoConfig, Git)>,
    ) -> Result<(), JobsError> {
        let ws = self;
        let branch = job_branch(job_id);
        for (cfg, main) in mains {
            let (remote, target) = target(&main, &cfg).await?;
            main.fetch(
                &remote,
                &[&format!(
                    "+refs/heads/{target}:refs/remotes/{remote}/{target}"
                )],
            )
            .await
            .map_err(|e| {
                JobsError::Environment(format!(
                    "cannot fetch {remote}/{target} for `{}`: {e}",
                    cfg.name
                ))
            })?;
            let base = main
                .resolve_commit(&format!("refs/remotes/{remote}/{target}"))
                .await?
                .ok_or_else(|| {
                    JobsError::Refused(format!("`{}`: {remote} has no branch {target}", cfg.name))
                })?;
            ws.state.touched.push(Touched {
                repo: cfg.path.clone(),
                name: cfg.name.clone(),
                ..Default::default()
            });
            let i = ws.state.touched.len() - 1;
            let stash = main
                .stash_push(&format!("belay-job-{job_id}-foreign"))
                .await?;
            if let Some(s) = &stash {
                ws.state.touched[i].stash = Some(s.clone());
                save(run, &ws.state)?;
                let _ = run.emit(
                    "jobs",
                    None,
                    &JobEvent::ForeignChangesStashed {
                        repo: cfg.name.clone(),
                        stash: s.clone(),
                    },
                );
            }
            let wt_path = q.worktrees_of(job_id).join(&cfg.name);
            if main.branch_exists(&branch).await? {
                // A stale branch of an earlier try of this job.
                main.run(&["branch", "-D", "--", &branch]).await?;
            }
            if wt_path.exists() {
                let _ = main.worktree_remove(&wt_path, true).await;
                let _ = fs_err::remove_dir_all(&wt_path);
                main.worktree_prune().await?;
            }
            ws.state.touched[i].worktree = Some(wt_path.clone());
            ws.state.touched[i].branch = Some(branch.clone());
            save(run, &ws.state)?;
            let wt = main.worktree_add(&wt_path, Some(&branch), &base).await?;
            let _ = run.emit(
                "jobs",
                None,
                &JobEvent::WorktreeAdded {
                    repo: cfg.name.clone(),
                    path: wt_path.display().to_string(),
                    branch: branch.clone(),
                    base: base.clone(),
                },
            );
            ws.repos.push(RepoWork {
                cfg,
                main,
                wt,
                wt_path,
                branch: branch.clone(),
                remote,
                target,
                base,
                stash,
            });
        }
        Ok(())
    }

    /// Remove the worktrees (and the job branches but `keep`), bring the
    /// main checkouts forward to what was pushed where they are on that
    /// branch, and restore the foreign changes. Problems are returned as
    /// notes for the reply: the job's result stands.
    pub async fn finish(
        mut self,
        run: &JobRun,
        keep_branches: &[String],
        pushed: &[(String, String)],
    ) -> Vec<String> {
        let mut notes = Vec::new();
        for r in &self.repos {
            if let Err(e) = r.main.worktree_remove(&r.wt_path, true).await {
                let _ = fs_err::remove_dir_all(&r.wt_path);
                tracing::warn!("worktree {}: {e}", r.wt_path.display());
            }
            let _ = r.main.worktree_prune().await;
            if !keep_branches.contains(&r.cfg.name) {
                let _ = r.main.run(&["branch", "-D", "--", &r.branch]).await;
            }
            if let Some((_, hash)) = pushed.iter().find(|(n, _)| n == &r.cfg.name) {
                if r.cfg.update_checkout {
                    fast_forward(&r.main, &r.target, hash).await;
                }
            }
            if let Some(sha) = &r.stash {
                match restore(&r.main, sha).await {
                    Ok(()) => {
                        let _ = run.emit(
                            "jobs",
                            None,
                            &JobEvent::ForeignChangesRestored {
                                repo: r.cfg.name.clone(),
                                stash: sha.clone(),
                            },
                        );
                    }
                    Err(e) => {
                        let _ = run.emit(
                            "jobs",
                            None,
                            &JobEvent::ForeignChangesKept {
                                repo: r.cfg.name.clone(),
                                stash: sha.clone(),
                                reason: e.to_string(),
                            },
                        );
                        // The reply may go to a third party: the checkout is
                        // named by its repository, not by its path.
                        notes.push(format!(
                            "Warning: the uncommitted changes in the checkout of {} could not be put back ({}); they are kept as stash {sha}: `git stash apply {sha}` there",
                            r.cfg.name,
                            e.reply()
                        ));
                    }
                }
            }
        }
        if let Some(first) = self.repos.first() {
            if let Some(d) = first.wt_path.parent() {
                let _ = fs_err::remove_dir(d);
            }
        }
        self.state.touched.clear();
        let _ = save(run, &self.state);
        notes
    }
}

/// Apply the stash back, then drop it from the list.
async fn restore(main: &Git, sha: &str) -> Result<(), JobsError> {
    main.stash_apply(sha).await?;
    main.stash_drop(sha).await?;
    Ok(())
}

/// Where the main checkout is on the pushed branch and behind it, move it
/// forward (so that a hook deploying from the checkout sees the commit).
async fn fast_forward(main: &Git, target: &str, hash: &str) {
    if main.current_branch().await.ok().flatten().as_deref() != Some(target) {
        return;
    }
    if main
        .succeeds(&["merge-base", "--is-ancestor", "HEAD", hash])
        .await
        .unwrap_or(false)
    {
        let _ = main.run(&["merge", "--ff-only", "--quiet", hash]).await;
    }
}

/// Undo what a killed job left (its saved state): worktrees, branches,
/// stashes, under the repositories' locks.
pub async fn undo(
    q: &Queue,
    job_id: &Id,
    lock_wait: std::time::Duration,
) -> Result<Vec<String>, JobsError> {
    let dir = q.run_dir(job_id);
    let Some(mut st) = RunHandle::load_state::<JobState>(&dir)? else {
        return Ok(vec![]);
    };
    let mut notes = Vec::new();
    let hooks = hooks_dir();
    for t in std::mem::take(&mut st.touched) {
        let Ok(main) = Git::open(&t.repo, &hooks).await else {
            notes.push(format!(
                "{}: no longer a repository; nothing undone there",
                t.name
            ));
            continue;
        };
        let _lock = RepoLock::acquire(
            main.common_dir(),
            &format!("recovery of job {job_id}"),
            lock_wait,
        )
        .await?;
        if let Some(wt) = &t.worktree {
            if wt.exists() {
                let _ = main.worktree_remove(wt, true).await;
                let _ = fs_err::remove_dir_all(wt);
            }
            let _ = main.worktree_prune().await;
        }
        if let Some(b) = &t.branch {
            let _ = main.run(&["branch", "-D", "--", b]).await;
        }
        // The foreign changes: by the saved SHA, or (killed between the
        // stash and the save) by the job's message in the stash list.
        let sha = match &t.stash {
            Some(s) => Some(s.clone()),
            None => main
                .stash_list()
                .await
                .ok()
                .and_then(|l| {
                    l.into_iter()
                        .find(|s| s.message.ends_with(&format!("belay-job-{job_id}-foreign")))
                })
                .map(|s| s.sha),
        };
        if let Some(sha) = sha {
            match restore(&main, &sha).await {
                Ok(()) => notes.push(format!("{}: the uncommitted changes are back", t.name)),
                Err(e) => notes.push(format!(
                    "{}: the uncommitted changes could not be put back ({}); they are kept as stash {sha}",
                    t.name,
                    e.reply()
                )),
            }
        }
    }
    let parent = q.worktrees_of(job_id);
    let _ = fs_err::remove_dir_all(&parent);
    belay_record::write_json_atomic(&dir.join(belay_record::STATE_FILE), &st)?;
    Ok(notes)
}

/// The worktree paths as an agent in a container sees them: the first
/// repository is the working directory, the others beside it.
pub fn container_path(i: usize, name: &str) -> String {
    if i == 0 {
        belay_agent::sandbox::WORKDIR.to_string()
    } else {
        format!("{}/{name}", belay_sandbox::layout::MORE)
    }
}

/// Whether `p` is inside `dir`.
pub fn inside(p: &Path, dir: &Path) -> bool {
    p.starts_with(dir)
}
