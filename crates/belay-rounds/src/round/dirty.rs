//! A tree a round left dirty: stashed by SHA after any exit (clean, failed,
//! timed out, killed, interrupted), with the round and its outcome in the
//! record. The idempotency window only skips a stash of exactly what the
//! last stash took, so new changes are never left out.

use jiff::Timestamp;
use sha2::Digest;

use crate::config::DirtyAction;
use crate::events::RoundEvent;
use crate::state::{self, Orphan, OrphanState};
use crate::supervisor::Supervisor;

/// What a dirty tree holds: each path with a hash of its content (bounded
/// per file), so two stashes of the same changes are recognised.
async fn fingerprint(root: &std::path::Path, files: &[String]) -> String {
    let root = root.to_path_buf();
    let files = files.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut h = sha2::Sha256::new();
        let mut sorted = files;
        sorted.sort();
        for f in &sorted {
            h.update(f.as_bytes());
            h.update([0]);
            let p = root.join(f);
            match fs_err::symlink_metadata(&p) {
                Ok(m) if m.is_file() => {
                    h.update(m.len().to_le_bytes());
                    // Through real dirs, a regular file only, never waited on.
                    if let Ok(Some(b)) = belay_sandbox::hostfs::read(&root, f, 16 * 1024 * 1024) {
                        h.update(&b);
                    }
                }
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(t) = fs_err::read_link(&p) {
                        h.update(t.as_os_str().as_encoded_bytes());
                    }
                }
                Ok(_) => h.update(b"other"),
                Err(_) => h.update(b"gone"),
            }
        }
        hex::encode(h.finalize())
    })
    .await
    .unwrap_or_default()
}

impl Supervisor {
    /// Deal with the tree after round `round_num` ended with `outcome`.
    /// The stash's SHA, if one was made.
    pub(super) async fn handle_dirty(
        &self,
        round_num: u64,
        phase: Option<&str>,
        outcome: &str,
        step: &str,
    ) -> Option<String> {
        let mut keep = self.own_paths();
        let spec = belay_vcs::keep_pathspec(&keep);
        let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
        let files = match self.git.dirty(&spec).await {
            Ok(f) => f,
            Err(e) => {
                self.emit(
                    Some(step),
                    &RoundEvent::OrphanStashFailed {
                        round_num,
                        error: e.to_string(),
                    },
                );
                return None;
            }
        };
        if files.is_empty() {
            return None;
        }
        self.emit(
            Some(step),
            &RoundEvent::DirtyDetected {
                round_num,
                files: files.iter().take(20).cloned().collect(),
                count: files.len(),
            },
        );
        match self.cfg.dirty_action {
            DirtyAction::Ignore => None,
            DirtyAction::AutoCommit => {
                self.auto_commit(round_num, outcome, step).await;
                None
            }
            DirtyAction::Stash => {
                // Repositories the agent planted inside the tree stay where
                // they are (a stash cannot take a repository without a
                // commit, and would fail whole).
                let nested = self.git.embedded_repositories().await.unwrap_or_default();
                keep.extend(nested.iter().map(|n| n.trim_end_matches('/').to_string()));
                self.stash(round_num, phase, outcome, step, files, &keep)
                    .await
            }
        }
    }

    /// The supervisor's own inputs inside the work tree (the config, the
    /// prompt files, the stop file): never stashed, never the agent's work.
    pub(super) fn own_paths(&self) -> Vec<String> {
        let cfg = &self.cfg;
        let root = &cfg.runtime.work_dir;
        let mut paths: Vec<&std::path::Path> = vec![cfg.path.as_path()];
        paths.extend(cfg.prompt.files.iter().map(|p| p.as_path()));
        for ph in &cfg.phases {
            paths.extend(ph.prompt_files.iter().flatten().map(|p| p.as_path()));
        }
        paths.extend(cfg.runtime.stop_file.as_deref());
        let mut out: Vec<String> = paths
            .into_iter()
            .filter_map(|p| {
                let p = std::path::absolute(p).ok()?;
                let rel = p.strip_prefix(root).ok()?;
                // `a/./b` and `a/../b` as git names them.
                let clean: std::path::PathBuf = rel
                    .components()
                    .filter(|c| !matches!(c, std::path::Component::CurDir))
                    .collect();
                Some(clean.display().to_string())
            })
            .filter(|p| !p.is_empty())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    #[allow(clippy::too_many_arguments)]
    async fn stash(
        &self,
        round_num: u64,
        phase: Option<&str>,
        outcome: &str,
        step: &str,
        files: Vec<String>,
        keep: &[String],
    ) -> Option<String> {
        let log_dir = self.log_dir();
        let mut st: OrphanState = state::read(log_dir, state::ORPHAN_FILE)
            .ok()
            .flatten()
            .unwrap_or_default();
        let fp = fingerprint(self.git.root(), &files).await;
        let now = Timestamp::now();
        if let Some(last) = st.stashes.last() {
            let age = last
                .timestamp
                .parse::<Timestamp>()
                .map(|t| (now.as_millisecond() - t.as_millisecond()) as f64 / 1000.0)
                .unwrap_or(f64::MAX);
            if age < self.cfg.stash_idempotency_s && last.fingerprint == fp {
                self.emit(
                    Some(step),
                    &RoundEvent::OrphanIdempotentSkip {
                        round_num,
                        reason: format!(
                            "the same changes were stashed {age:.1} s ago as {}",
                            last.sha
                        ),
                    },
                );
                return None;
            }
        }
        let message = format!(
            "belay-rounds: R{round_num}{} {outcome} {}",
            phase.map(|p| format!(" [{p}]")).unwrap_or_default(),
            belay_record::now_rfc3339()
        );
        match self.git.stash_push_except(&message, keep).await {
            Ok(Some(sha)) => {
                st.stashes.push(Orphan {
                    sha: sha.clone(),
                    message,
                    files: files.clone(),
                    round_num,
                    outcome: outcome.to_string(),
                    phase: phase.map(str::to_string),
                    timestamp: now.to_string(),
                    fingerprint: fp,
                });
                // Bounded: the oldest records of stashes long gone go first.
                if st.stashes.len() > 200 {
                    let cut = st.stashes.len() - 200;
                    st.stashes.drain(..cut);
                }
                if let Err(e) = state::write(log_dir, state::ORPHAN_FILE, &st, &self.redactor()) {
                    self.warn(format!("the stash {sha} is made but not recorded: {e}"));
                }
                self.emit(
                    Some(step),
                    &RoundEvent::OrphanStashed {
                        round_num,
                        sha: sha.clone(),
                        reason: format!("{outcome}_exit_with_dirty_tree"),
                        files: files.len(),
                    },
                );
                Some(sha)
            }
            Ok(None) => None,
            Err(e) => {
                self.emit(
                    Some(step),
                    &RoundEvent::OrphanStashFailed {
                        round_num,
                        error: e.to_string(),
                    },
                );
                None
            }
        }
    }

    async fn auto_commit(&self, round_num: u64, outcome: &str, step: &str) {
        let scanner = self.redactor().scanner();
        let req = belay_vcs::CommitRequest {
            message: format!("belay-rounds: R{round_num} left these changes ({outcome})"),
            author: None,
            exclude: vec![],
            exclude_globs: vec![],
            allow_empty: false,
            paths: vec![],
            submodules: self.git.submodule_paths().await.unwrap_or_default(),
            scan: Box::new(move |_, r| scanner.scan(r)),
        };
        match self.git.commit_checked(req).await {
            Ok(belay_vcs::CommitOutcome::Committed(c)) => {
                self.emit(
                    Some(step),
                    &RoundEvent::DirtyAutoCommitted {
                        round_num,
                        commit: c.sha,
                    },
                );
            }
            Ok(belay_vcs::CommitOutcome::Nothing) => {}
            Ok(belay_vcs::CommitOutcome::Refused(r)) => {
                self.emit(
                    Some(step),
                    &RoundEvent::DirtyCommitFailed {
                        round_num,
                        error: format!("{r:?}"),
                    },
                );
            }
            Err(e) => {
                self.emit(
                    Some(step),
                    &RoundEvent::DirtyCommitFailed {
                        round_num,
                        error: e.to_string(),
                    },
                );
            }
        }
    }
}
