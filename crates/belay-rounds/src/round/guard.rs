//! What the agent must not leave changed: the git dir (see
//! [`belay_vcs::GitDirGuard`]) and the supervisor's own inputs in the work
//! tree (the config and the prompt files, which the agent can write: an
//! edited config would run its command, or `placement = "host"`, at the next
//! start). Taken before the agent, recorded in the log dir (so that the next
//! start can apply it when belay was killed mid-round), applied once the
//! agent's processes are gone.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::events::RoundEvent;
use crate::supervisor::Supervisor;
use crate::RoundsError;

pub const GUARD_FILE: &str = "round-guard.json";

/// The largest own file kept (a config or a prompt).
const MAX_OWN: u64 = 4 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
pub struct RoundGuard {
    git: belay_vcs::GitDirGuard,
    /// Relative path in the work tree → content, as hex.
    own: BTreeMap<String, String>,
}

/// Make every dir from `root` down to `rel`'s parent a real dir: a link the
/// agent put in place of one (`prompts -> /host/dir`) is removed, never
/// followed. Whether the parent is a real dir now.
fn real_parents(root: &Path, rel: &Path) -> bool {
    let Some(parent) = rel.parent() else {
        return true;
    };
    let mut at = root.to_path_buf();
    for c in parent.components() {
        let std::path::Component::Normal(c) = c else {
            return false;
        };
        at.push(c);
        match fs_err::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                if fs_err::remove_file(&at).is_err() || fs_err::create_dir(&at).is_err() {
                    return false;
                }
            }
            Err(_) => {
                if fs_err::create_dir(&at).is_err() {
                    return false;
                }
            }
        }
    }
    true
}

/// Read `root/rel` only through real dirs and only as a regular file.
fn read_own(root: &Path, rel: &Path) -> Option<Vec<u8>> {
    let mut at = root.to_path_buf();
    for c in rel.parent()?.components() {
        at.push(c);
        if !fs_err::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
            return None;
        }
    }
    let p = root.join(rel);
    let m = fs_err::symlink_metadata(&p).ok()?;
    (m.is_file() && m.len() <= MAX_OWN)
        .then(|| fs_err::read(&p).ok())
        .flatten()
}

impl Supervisor {
    pub(super) fn take_guard(&self) -> Result<RoundGuard, RoundsError> {
        let root = &self.cfg.runtime.work_dir;
        let config_rel = self
            .cfg
            .path
            .strip_prefix(root)
            .ok()
            .map(|r| r.display().to_string());
        let mut own = BTreeMap::new();
        for rel in self.own_paths() {
            // The config as belay loaded it, never as it is on disk now.
            let bytes = if config_rel.as_deref() == Some(rel.as_str()) {
                Some(self.cfg.source.as_bytes().to_vec())
            } else {
                read_own(root, Path::new(&rel))
            };
            if let Some(b) = bytes {
                own.insert(rel, hex::encode(b));
            }
        }
        let g = RoundGuard {
            git: self.git.guard_git_dir(),
            own,
        };
        let text = serde_json::to_vec(&g).map_err(|e| {
            RoundsError::io("cannot encode", self.log_dir(), std::io::Error::other(e))
        })?;
        belay_record::atomic_write(&self.log_dir().join(GUARD_FILE), &text)?;
        Ok(g)
    }

    pub(super) fn load_guard(&self) -> Option<RoundGuard> {
        let b = fs_err::read(self.log_dir().join(GUARD_FILE)).ok()?;
        serde_json::from_slice(&b).ok()
    }

    /// Put back what the agent changed; record what that was. A git dir that
    /// cannot be checked stops the loop: no host git runs on it.
    pub(super) fn apply_guard(
        &self,
        g: &RoundGuard,
        round_num: u64,
        step: &str,
    ) -> Result<(), RoundsError> {
        let r = g.git.restore().map_err(|e| {
            self.emit(
                Some(step),
                &RoundEvent::GitDirUnchecked {
                    round_num,
                    error: e.to_string(),
                },
            );
            RoundsError::Breaker(e.to_string())
        })?;
        if !r.is_empty() {
            (self.progress)(&format!(
                "undid what the agent left in the git dir: restored {:?}, links {:?}, modes {:?}, locks {:?}, special files {:?}",
                r.restored, r.links_removed, r.modes_cleared, r.locks_removed, r.specials_removed
            ));
            self.emit(
                Some(step),
                &RoundEvent::GitDirRepaired {
                    round_num,
                    restored: r.restored,
                    links_removed: r.links_removed,
                    modes_cleared: r.modes_cleared,
                    locks_removed: r.locks_removed,
                    specials_removed: r.specials_removed,
                },
            );
        }
        let root = &self.cfg.runtime.work_dir;
        let mut restored = Vec::new();
        for (rel, hexed) in &g.own {
            let Ok(want) = hex::decode(hexed) else {
                continue;
            };
            let relp = Path::new(rel);
            if read_own(root, relp).as_deref() == Some(want.as_slice()) {
                continue;
            }
            if !real_parents(root, relp) {
                continue;
            }
            let p = root.join(relp);
            if let Ok(m) = fs_err::symlink_metadata(&p) {
                let _ = if m.is_dir() {
                    fs_err::remove_dir_all(&p)
                } else {
                    fs_err::remove_file(&p)
                };
            }
            if belay_record::atomic_write(&p, &want).is_ok() {
                restored.push(rel.clone());
            }
        }
        if !restored.is_empty() {
            (self.progress)(&format!(
                "the agent changed belay's own inputs; put back: {}",
                restored.join(", ")
            ));
            self.emit(
                Some(step),
                &RoundEvent::ControlFileRestored {
                    round_num,
                    paths: restored,
                },
            );
        }
        let _ = fs_err::remove_file(self.log_dir().join(GUARD_FILE));
        Ok(())
    }
}
