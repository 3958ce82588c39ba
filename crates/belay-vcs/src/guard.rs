//! [`GitDirGuard`]: the git dir after a sandbox that could write it.
//!
//! A mode that lets an agent commit (the round supervisor) mounts the git dir
//! read-write. Whatever the agent left there is read by the host's next git
//! call, and by the user's own git later. So before the agent, the guard
//! records what must not change: the hooks, the files that redirect git
//! (`commondir`, `config.worktree`, alternates) and `info/attributes`. After
//! the agent (its processes gone), it puts them back byte for byte and
//! removes:
//!
//! - every symbolic link in the git dir's own places (its top level,
//!   `refs/`, `logs/`, `hooks/`, `info/`, `objects/` and the object fan-out
//!   dirs): git follows them when it writes a ref, a reflog or an object, so a
//!   link is a write anywhere the host's user can write;
//! - set-id and world-writable bits anywhere in the git dir;
//! - lock files made since the guard was taken (the agent is gone, so they
//!   are stale, and they would block the next stash).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::Git;

/// The files and dirs whose content is put back (relative to the git dir).
const GUARDED_FILES: &[&str] = &[
    "commondir",
    "config.worktree",
    "objects/info/alternates",
    "objects/info/http-alternates",
    "info/attributes",
    "info/grafts",
];

/// The places whose symbolic links are removed, walked to this depth.
const LINK_PLACES: &[(&str, usize)] = &[
    ("", 1),
    ("refs", 16),
    ("logs", 16),
    ("hooks", 4),
    ("info", 2),
    ("objects", 2),
    ("worktrees", 3),
];

/// At most this many entries are looked at (a bounded walk).
const MAX_ENTRIES: usize = 200_000;

/// A record of the git dir, serialisable so that the next start can put it
/// back when belay was killed while the sandbox ran (contents as hex).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GitDirGuard {
    git_dir: PathBuf,
    #[serde(with = "hex_map_opt")]
    files: BTreeMap<String, Option<Vec<u8>>>,
    #[serde(with = "hex_map")]
    hooks: BTreeMap<String, Vec<u8>>,
    /// Unix seconds when the guard was taken (locks newer than it are stale).
    taken_s: u64,
}

mod hex_map {
    use std::collections::BTreeMap;
    pub fn serialize<S: serde::Serializer>(
        m: &BTreeMap<String, Vec<u8>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        use serde::Serialize;
        m.iter()
            .map(|(k, v)| (k.clone(), hex::encode(v)))
            .collect::<BTreeMap<_, _>>()
            .serialize(s)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, Vec<u8>>, D::Error> {
        use serde::Deserialize;
        BTreeMap::<String, String>::deserialize(d)?
            .into_iter()
            .map(|(k, v)| {
                hex::decode(v)
                    .map(|b| (k, b))
                    .map_err(serde::de::Error::custom)
            })
            .collect()
    }
}

mod hex_map_opt {
    use std::collections::BTreeMap;
    type M = BTreeMap<String, Option<Vec<u8>>>;
    pub fn serialize<S: serde::Serializer>(m: &M, s: S) -> Result<S::Ok, S::Error> {
        use serde::Serialize;
        m.iter()
            .map(|(k, v)| (k.clone(), v.as_ref().map(hex::encode)))
            .collect::<BTreeMap<_, _>>()
            .serialize(s)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<M, D::Error> {
        use serde::Deserialize;
        BTreeMap::<String, Option<String>>::deserialize(d)?
            .into_iter()
            .map(|(k, v)| match v {
                Some(h) => hex::decode(h)
                    .map(|b| (k, Some(b)))
                    .map_err(serde::de::Error::custom),
                None => Ok((k, None)),
            })
            .collect()
    }
}

/// What the guard repaired.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GitDirRepair {
    /// Guarded files (and hooks) put back, by path relative to the git dir.
    pub restored: Vec<String>,
    pub links_removed: Vec<String>,
    pub modes_cleared: Vec<String>,
    pub locks_removed: Vec<String>,
}

impl GitDirRepair {
    pub fn is_empty(&self) -> bool {
        self.restored.is_empty()
            && self.links_removed.is_empty()
            && self.modes_cleared.is_empty()
            && self.locks_removed.is_empty()
    }
}

fn read_regular(p: &Path) -> Option<Vec<u8>> {
    let m = fs_err::symlink_metadata(p).ok()?;
    if !m.is_file() || m.len() > 16 * 1024 * 1024 {
        return None;
    }
    fs_err::read(p).ok()
}

fn hooks_of(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    if let Ok(rd) = fs_err::read_dir(dir) {
        for e in rd.flatten() {
            if let Some(b) = read_regular(&e.path()) {
                out.insert(e.file_name().to_string_lossy().into_owned(), b);
            }
        }
    }
    out
}

/// Replace whatever is at `p` (a link, a dir, a file) with `bytes`.
fn put_back(p: &Path, bytes: &[u8], mode: u32) -> bool {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = fs_err::symlink_metadata(p) {
        let gone = if m.is_dir() {
            fs_err::remove_dir_all(p)
        } else {
            fs_err::remove_file(p)
        };
        if gone.is_err() {
            return false;
        }
    }
    if let Some(parent) = p.parent() {
        let _ = fs_err::create_dir_all(parent);
    }
    fs_err::write(p, bytes).is_ok()
        && fs_err::set_permissions(p, std::fs::Permissions::from_mode(mode)).is_ok()
}

fn remove_any(p: &Path) -> bool {
    match fs_err::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs_err::remove_dir_all(p).is_ok(),
        Ok(_) => fs_err::remove_file(p).is_ok(),
        Err(_) => true,
    }
}

impl Git {
    /// Record the git dir before a sandbox that can write it.
    pub fn guard_git_dir(&self) -> GitDirGuard {
        let files = GUARDED_FILES
            .iter()
            .map(|f| (f.to_string(), read_regular(&self.git_dir.join(f))))
            .collect();
        GitDirGuard {
            git_dir: self.git_dir.clone(),
            files,
            hooks: hooks_of(&self.git_dir.join("hooks")),
            taken_s: unix_s(SystemTime::now()),
        }
    }
}

impl GitDirGuard {
    /// Put the git dir back (see the module docs). Call it once the
    /// sandbox's processes are gone.
    pub fn restore(&self) -> GitDirRepair {
        use std::os::unix::fs::PermissionsExt;
        let mut r = GitDirRepair::default();
        let g = &self.git_dir;
        // Links first: nothing below is written through one.
        let mut seen = 0usize;
        for (place, depth) in LINK_PLACES {
            let root = if place.is_empty() {
                g.clone()
            } else {
                g.join(place)
            };
            let mut stack = vec![(root, 0usize)];
            while let Some((dir, d)) = stack.pop() {
                if d >= *depth {
                    continue;
                }
                let Ok(rd) = fs_err::read_dir(&dir) else {
                    continue;
                };
                for e in rd.flatten() {
                    seen += 1;
                    if seen > MAX_ENTRIES {
                        break;
                    }
                    let Ok(ft) = e.file_type() else { continue };
                    let p = e.path();
                    if ft.is_symlink() {
                        if fs_err::remove_file(&p).is_ok() {
                            r.links_removed.push(rel(g, &p));
                        }
                    } else if ft.is_dir() && !place.is_empty() {
                        stack.push((p, d + 1));
                    }
                }
            }
        }
        for (name, was) in &self.files {
            let p = g.join(name);
            let now = read_regular(&p);
            let present = fs_err::symlink_metadata(&p).is_ok();
            let fixed = match was {
                Some(bytes) if now.as_deref() != Some(bytes.as_slice()) => {
                    put_back(&p, bytes, 0o644)
                }
                None if present => remove_any(&p),
                _ => false,
            };
            if fixed {
                r.restored.push(name.clone());
            }
        }
        let hooks_dir = g.join("hooks");
        let now = hooks_of(&hooks_dir);
        if let Ok(rd) = fs_err::read_dir(&hooks_dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let changed = match (self.hooks.get(&name), now.get(&name)) {
                    (Some(a), Some(b)) => a != b,
                    (Some(_), None) => true,
                    (None, _) => true,
                };
                if changed {
                    let p = e.path();
                    let ok = match self.hooks.get(&name) {
                        Some(bytes) => put_back(&p, bytes, 0o755),
                        None => remove_any(&p),
                    };
                    if ok {
                        r.restored.push(format!("hooks/{name}"));
                    }
                }
            }
        }
        for (name, bytes) in &self.hooks {
            let p = hooks_dir.join(name);
            if fs_err::symlink_metadata(&p).is_err() && put_back(&p, bytes, 0o755) {
                r.restored.push(format!("hooks/{name}"));
            }
        }
        // Modes and stale locks, over the whole git dir (bounded).
        let mut stack = vec![g.clone()];
        let mut seen = 0usize;
        while let Some(dir) = stack.pop() {
            let Ok(rd) = fs_err::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                seen += 1;
                if seen > MAX_ENTRIES {
                    return r;
                }
                let p = e.path();
                let Ok(m) = fs_err::symlink_metadata(&p) else {
                    continue;
                };
                if m.file_type().is_symlink() {
                    continue;
                }
                let mode = m.permissions().mode();
                if mode & 0o6002 != 0 {
                    let clean = mode & !0o6002 & 0o7777;
                    if fs_err::set_permissions(&p, std::fs::Permissions::from_mode(clean)).is_ok() {
                        r.modes_cleared.push(rel(g, &p));
                    }
                }
                if m.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "lock")
                    && m.modified().is_ok_and(|t| unix_s(t) >= self.taken_s)
                    && fs_err::remove_file(&p).is_ok()
                {
                    r.locks_removed.push(rel(g, &p));
                }
            }
        }
        r.restored.sort();
        r.links_removed.sort();
        r.modes_cleared.sort();
        r.locks_removed.sort();
        r
    }
}

fn unix_s(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn rel(base: &Path, p: &Path) -> String {
    p.strip_prefix(base).unwrap_or(p).display().to_string()
}
