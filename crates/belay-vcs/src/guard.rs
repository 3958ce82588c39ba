//! [`GitDirGuard`]: the git dir after a sandbox that could write it.
//!
//! A mode that lets an agent commit (the round supervisor) mounts the git dir
//! read-write. Whatever the agent left there is read by the host's next git
//! call, and by the user's own git later. So before the agent, the guard
//! records what must not change: the hooks, the files that redirect git
//! (`commondir`, `config.worktree`, alternates, each linked worktree's
//! `commondir` and `gitdir`), `info/attributes`, `info/exclude`, the replace
//! refs, and every symbolic link already there (the user's own). After the
//! agent (its processes gone), it puts them back and removes:
//!
//! - every *new* symbolic link in the git dir's own places (its top level,
//!   `refs/`, `logs/`, `hooks/`, `info/`, `worktrees/`, `objects/` with its
//!   fan-out, `pack/` and `info/`), at any depth: git appends to a reflog and
//!   creates refs and objects through them, so a link is a write anywhere the
//!   host's user can write. A dir git needs (`objects/pack`, `refs/heads`, …)
//!   is made again where a link stood;
//! - a `HEAD` that is no longer a regular file (put back as it was);
//! - linked worktrees and replace refs the agent added;
//! - set-id and world-writable bits anywhere in the git dir;
//! - lock files whose inode changed since the guard was taken (ctime, which a
//!   process cannot set back).
//!
//! The walk has a hard cap: a git dir with more entries than that is not
//! checked half-way, it is refused ([`GuardError`]), and the caller must not
//! run git on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::Git;

/// The files whose content is put back (relative to the git dir).
const GUARDED_FILES: &[&str] = &[
    "commondir",
    "config.worktree",
    "objects/info/alternates",
    "objects/info/http-alternates",
    "info/attributes",
    "info/exclude",
    "info/grafts",
    "shallow",
];

/// The places whose links are checked: (place, how deep; 0 is unbounded).
const LINK_PLACES: &[(&str, usize)] = &[
    ("", 1),
    ("refs", 0),
    ("logs", 0),
    ("hooks", 1),
    ("info", 1),
    ("worktrees", 0),
    ("objects", 1),
    ("objects/pack", 1),
    ("objects/info", 1),
];

/// Dirs git needs: made again where a link stood.
const NEEDED_DIRS: &[&str] = &[
    "objects",
    "objects/pack",
    "objects/info",
    "refs",
    "refs/heads",
    "refs/tags",
    "logs",
    "logs/refs",
    "hooks",
    "info",
];

/// More entries than this in the git dir, and it is refused, not half-checked.
pub const MAX_ENTRIES: usize = 2_000_000;

/// The git dir could not be checked: the caller must not run git on it.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("the git dir {dir} holds more than {max} entries: belay does not run git on a git dir it cannot check; look at what the agent left there")]
    TooBig { dir: PathBuf, max: usize },
    #[error("cannot read {path} in the git dir ({source}): belay does not run git on a git dir it cannot check; look at what the agent left there")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn unreadable(p: &Path, source: std::io::Error) -> GuardError {
    GuardError::Unreadable {
        path: p.to_path_buf(),
        source,
    }
}

/// A record of the git dir, serialisable so that the next start can put it
/// back when belay was killed while the sandbox ran (contents as hex).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GitDirGuard {
    git_dir: PathBuf,
    #[serde(with = "hex_map_opt")]
    files: BTreeMap<String, Option<Vec<u8>>>,
    #[serde(with = "hex_map")]
    hooks: BTreeMap<String, Vec<u8>>,
    #[serde(with = "hex_opt")]
    head: Option<Vec<u8>>,
    /// The links already there (the user's): relative path → target, both
    /// as hex of their bytes (names need not be UTF-8).
    links: BTreeMap<String, String>,
    /// Worktree names, as hex of their bytes.
    worktrees: Vec<String>,
    replace_refs: Vec<String>,
    /// Unix seconds when the guard was taken (locks changed since are stale).
    taken_s: i64,
}

mod hex_opt {
    pub fn serialize<S: serde::Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        use serde::Serialize;
        v.as_ref().map(hex::encode).serialize(s)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        use serde::Deserialize;
        Option::<String>::deserialize(d)?
            .map(|h| hex::decode(h).map_err(serde::de::Error::custom))
            .transpose()
    }
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
    /// Guarded files, hooks, worktrees and replace refs put back or removed,
    /// by path relative to the git dir.
    pub restored: Vec<String>,
    pub links_removed: Vec<String>,
    pub modes_cleared: Vec<String>,
    pub locks_removed: Vec<String>,
    /// FIFOs, sockets and devices (git makes none; a FIFO hangs git).
    pub specials_removed: Vec<String>,
}

impl GitDirRepair {
    pub fn is_empty(&self) -> bool {
        self.restored.is_empty()
            && self.links_removed.is_empty()
            && self.modes_cleared.is_empty()
            && self.locks_removed.is_empty()
            && self.specials_removed.is_empty()
    }
}

fn read_regular(p: &Path) -> Option<Vec<u8>> {
    let m = fs_err::symlink_metadata(p).ok()?;
    if !m.is_file() || m.len() > 16 * 1024 * 1024 {
        return None;
    }
    fs_err::read(p).ok()
}

fn key(p: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    hex::encode(p.as_os_str().as_bytes())
}

fn from_key(g: &Path, k: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let b = hex::decode(k).ok()?;
    Some(g.join(std::ffi::OsStr::from_bytes(&b)))
}

fn names_in(dir: &Path) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = fs_err::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Every file below `dir` (relative to `base`), bounded.
fn files_below(base: &Path, dir: &Path, out: &mut Vec<String>, budget: &mut usize) {
    let Ok(rd) = fs_err::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => files_below(base, &p, out, budget),
            Ok(_) => out.push(rel(base, &p)),
            Err(_) => {}
        }
    }
}

/// Replace whatever is at `p` (a link, a dir, a file) with `bytes`.
fn put_back(p: &Path, bytes: &[u8], mode: u32) -> bool {
    use std::os::unix::fs::PermissionsExt;
    if fs_err::symlink_metadata(p).is_ok() && !remove_any(p) {
        return false;
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

/// The links under the link places: key of the relative path → key of the
/// target. A dir that cannot be read fails the walk.
fn links_of(g: &Path, seen: &mut usize) -> Result<BTreeMap<String, String>, GuardError> {
    let mut out = BTreeMap::new();
    for (place, depth) in LINK_PLACES {
        let root = if place.is_empty() {
            g.to_path_buf()
        } else {
            g.join(place)
        };
        // A place that is itself a link is found from its parent's walk.
        match fs_err::symlink_metadata(&root) {
            Ok(m) if m.is_dir() => {}
            _ => continue,
        }
        let mut stack = vec![(root, 1usize)];
        while let Some((dir, d)) = stack.pop() {
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(unreadable(&dir, e)),
            };
            for e in rd {
                let e = e.map_err(|x| unreadable(&dir, x))?;
                *seen += 1;
                if *seen > MAX_ENTRIES {
                    return Err(GuardError::TooBig {
                        dir: g.to_path_buf(),
                        max: MAX_ENTRIES,
                    });
                }
                let ft = e.file_type().map_err(|x| unreadable(&e.path(), x))?;
                let p = e.path();
                if ft.is_symlink() {
                    let t = fs_err::read_link(&p).unwrap_or_default();
                    out.insert(key(p.strip_prefix(g).unwrap_or(&p)), key(&t));
                } else if ft.is_dir() && (*depth == 0 || d < *depth) && !place.is_empty() {
                    stack.push((p, d + 1));
                }
            }
        }
    }
    Ok(out)
}

impl Git {
    /// The submodule paths (gitlinks) that the commits since `before` added
    /// (`None`: every gitlink of HEAD), relative to the root. Only
    /// when HEAD moved: a step or round without commits costs nothing. A
    /// repository a sandbox planted at such a path runs its config on the
    /// user's next `git status` in the outer tree; callers move it aside
    /// (`belay_sandbox::hostfs::quarantine_git`).
    pub async fn gitlinks_added(
        &self,
        before: Option<&str>,
    ) -> Result<Vec<String>, crate::VcsError> {
        let after = self.head().await?;
        if before == Some(after.as_str()) {
            return Ok(Vec::new());
        }
        // The trees' own gitlinks: `git diff` would leave submodules out
        // (belay's git ignores them).
        let was = match before {
            Some(b) => gitlinks_in(&self.run(&["ls-tree", "-r", "-z", b]).await?),
            None => Vec::new(),
        };
        let now = gitlinks_in(&self.run(&["ls-tree", "-r", "-z", &after]).await?);
        Ok(now.into_iter().filter(|l| !was.contains(l)).collect())
    }

    /// Record the git dir before a sandbox that can write it.
    pub fn guard_git_dir(&self) -> GitDirGuard {
        let g = &self.git_dir;
        let worktrees = names_in(&g.join("worktrees"));
        let mut files: BTreeMap<String, Option<Vec<u8>>> = GUARDED_FILES
            .iter()
            .map(|f| (f.to_string(), read_regular(&g.join(f))))
            .collect();
        for w in &worktrees {
            for f in ["commondir", "gitdir", "config.worktree"] {
                let p = Path::new("worktrees").join(w).join(f);
                files.insert(key(&p), read_regular(&g.join(&p)));
            }
        }
        let mut replace_refs = Vec::new();
        let mut budget = 100_000;
        files_below(g, &g.join("refs/replace"), &mut replace_refs, &mut budget);
        let hooks_dir = g.join("hooks");
        // A hooks dir that is a link (the user's, into the tree) is not read.
        let hooks = if fs_err::symlink_metadata(&hooks_dir).is_ok_and(|m| m.is_dir()) {
            names_in(&hooks_dir)
                .into_iter()
                .filter_map(|n| {
                    read_regular(&hooks_dir.join(&n)).map(|b| (n.to_string_lossy().into_owned(), b))
                })
                .collect()
        } else {
            BTreeMap::new()
        };
        let mut seen = 0;
        GitDirGuard {
            git_dir: g.clone(),
            files,
            hooks,
            head: read_regular(&g.join("HEAD")),
            links: links_of(g, &mut seen).unwrap_or_default(),
            worktrees: worktrees.iter().map(|w| key(Path::new(w))).collect(),
            replace_refs,
            taken_s: unix_s(SystemTime::now()),
        }
    }
}

impl GitDirGuard {
    /// Put the git dir back (see the module docs). Call it once the
    /// sandbox's processes are gone.
    pub fn restore(&self) -> Result<GitDirRepair, GuardError> {
        let mut r = GitDirRepair::default();
        self.restore_links(&mut r)?;
        self.restore_files(&mut r);
        self.restore_hooks(&mut r);
        self.sweep(&mut r)?;
        for v in [
            &mut r.restored,
            &mut r.links_removed,
            &mut r.modes_cleared,
            &mut r.locks_removed,
            &mut r.specials_removed,
        ] {
            v.sort();
            v.dedup();
        }
        Ok(r)
    }

    /// Remove the links the sandbox added; put back the user's own.
    fn restore_links(&self, r: &mut GitDirRepair) -> Result<(), GuardError> {
        let g = &self.git_dir;
        // Links first: nothing below is written through one. Repeat until
        // none is new: a removed link may uncover a place to walk.
        for _ in 0..4 {
            let mut seen = 0;
            let now = links_of(g, &mut seen)?;
            let new: Vec<String> = now
                .into_iter()
                .filter(|(k, t)| self.links.get(k) != Some(t))
                .map(|(k, _)| k)
                .collect();
            if new.is_empty() {
                break;
            }
            for k in new {
                let Some(p) = from_key(g, &k) else { continue };
                if fs_err::remove_file(&p).is_ok() {
                    let name = shown_key(&k);
                    if NEEDED_DIRS.contains(&name.as_str()) {
                        let _ = fs_err::create_dir_all(&p);
                    }
                    r.links_removed.push(name);
                }
            }
        }
        // The user's own links stay theirs: one replaced is put back.
        for (k, t) in &self.links {
            let (Some(p), Some(target)) = (from_key(g, k), from_key(Path::new(""), t)) else {
                continue;
            };
            let same = fs_err::read_link(&p).is_ok_and(|now| now == target);
            let parent_real = p
                .parent()
                .is_some_and(|d| fs_err::symlink_metadata(d).is_ok_and(|m| m.is_dir()));
            if !same
                && parent_real
                && remove_any(&p)
                && std::os::unix::fs::symlink(&target, &p).is_ok()
            {
                r.restored.push(shown_key(k));
            }
        }
        Ok(())
    }

    /// HEAD, the guarded files, the worktrees and the replace refs.
    fn restore_files(&self, r: &mut GitDirRepair) {
        let g = &self.git_dir;
        if fs_err::symlink_metadata(g.join("HEAD")).map_or(true, |m| !m.is_file()) {
            if let Some(h) = &self.head {
                if put_back(&g.join("HEAD"), h, 0o644) {
                    r.restored.push("HEAD".into());
                }
            }
        }
        for (name, was) in &self.files {
            // Plain names, or keys of worktree files.
            let p = if GUARDED_FILES.contains(&name.as_str()) {
                g.join(name)
            } else {
                match from_key(g, name) {
                    Some(p) => p,
                    None => continue,
                }
            };
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
                r.restored
                    .push(p.strip_prefix(g).unwrap_or(&p).display().to_string());
            }
        }
        for w in names_in(&g.join("worktrees")) {
            if !self.worktrees.contains(&key(Path::new(&w)))
                && remove_any(&g.join("worktrees").join(&w))
            {
                r.restored
                    .push(format!("worktrees/{}", w.to_string_lossy()));
            }
        }
        let mut refs = Vec::new();
        let mut budget = 100_000;
        files_below(g, &g.join("refs/replace"), &mut refs, &mut budget);
        for f in refs {
            if !self.replace_refs.contains(&f) && fs_err::remove_file(g.join(&f)).is_ok() {
                r.restored.push(f);
            }
        }
    }

    /// The hooks of a real hooks dir, as they were.
    fn restore_hooks(&self, r: &mut GitDirRepair) {
        let g = &self.git_dir;
        let hooks_dir = g.join("hooks");
        // Only a real hooks dir is put back (a linked one is the user's).
        if fs_err::symlink_metadata(&hooks_dir).is_ok_and(|m| m.is_dir()) {
            for name in names_in(&hooks_dir) {
                let p = hooks_dir.join(&name);
                let shown = name.to_string_lossy().into_owned();
                if self
                    .links
                    .contains_key(&key(&Path::new("hooks").join(&name)))
                {
                    continue; // the user's linked hook, checked above
                }
                let changed = match (self.hooks.get(&shown), read_regular(&p)) {
                    (Some(a), Some(b)) => *a != b,
                    _ => true,
                };
                if changed {
                    let ok = match self.hooks.get(&shown) {
                        Some(bytes) => put_back(&p, bytes, 0o755),
                        None => remove_any(&p),
                    };
                    if ok {
                        r.restored.push(format!("hooks/{shown}"));
                    }
                }
            }
            for (name, bytes) in &self.hooks {
                let p = hooks_dir.join(name);
                if fs_err::symlink_metadata(&p).is_err() && put_back(&p, bytes, 0o755) {
                    r.restored.push(format!("hooks/{name}"));
                }
            }
        }
    }

    /// Modes, special files and stale locks over the whole git dir.
    fn sweep(&self, r: &mut GitDirRepair) -> Result<(), GuardError> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
        let g = &self.git_dir;
        // Modes, special files and stale locks, over the whole git dir; a dir
        // that cannot be read fails closed.
        let mut stack = vec![g.clone()];
        let mut seen = 0usize;
        while let Some(dir) = stack.pop() {
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(unreadable(&dir, e)),
            };
            for e in rd {
                let e = e.map_err(|x| unreadable(&dir, x))?;
                seen += 1;
                if seen > MAX_ENTRIES {
                    return Err(GuardError::TooBig {
                        dir: g.clone(),
                        max: MAX_ENTRIES,
                    });
                }
                let p = e.path();
                let m = fs_err::symlink_metadata(&p).map_err(|x| unreadable(&p, x))?;
                let ft = m.file_type();
                if ft.is_symlink() {
                    continue;
                }
                if ft.is_fifo() || ft.is_socket() || ft.is_block_device() || ft.is_char_device() {
                    if fs_err::remove_file(&p).is_ok() {
                        r.specials_removed.push(rel(g, &p));
                    }
                    continue;
                }
                let mode = m.permissions().mode();
                if mode & 0o6002 != 0 {
                    let clean = mode & !0o6002 & 0o7777;
                    if fs_err::set_permissions(&p, std::fs::Permissions::from_mode(clean)).is_ok() {
                        r.modes_cleared.push(rel(g, &p));
                    }
                }
                let is_lock = p.extension().is_some_and(|x| x == "lock");
                if is_lock && m.ctime() >= self.taken_s && remove_any(&p) {
                    r.locks_removed.push(rel(g, &p));
                } else if ft.is_dir() {
                    stack.push(p);
                }
            }
        }
        Ok(())
    }
}

/// A key shown as the path it names (relative to the git dir).
fn shown_key(k: &str) -> String {
    from_key(Path::new(""), k)
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn unix_s(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn rel(base: &Path, p: &Path) -> String {
    p.strip_prefix(base).unwrap_or(p).display().to_string()
}
/// The gitlink paths (mode 160000) of `git ls-tree -r -z`.
fn gitlinks_in(out: &str) -> Vec<String> {
    out.split('\0')
        .filter_map(|e| {
            let (meta, path) = e.split_once('\t')?;
            meta.starts_with("160000 ").then(|| path.to_string())
        })
        .collect()
}

/// A git dir belay cannot check is the run's to refuse (exit 1): what an
/// agent left there is the cause, and nothing of it is trusted.
impl belay_record::Classify for GuardError {
    fn exit_class(&self) -> belay_record::ExitClass {
        match self {
            GuardError::TooBig { .. } | GuardError::Unreadable { .. } => {
                belay_record::ExitClass::Failed
            }
        }
    }
}

#[cfg(test)]
mod gitlink_tests {
    use super::gitlinks_in;

    #[test]
    fn gitlinks_from_ls_tree() {
        let tree = "100644 blob 1111111\tREADME\x00160000 commit abcdef1\tvendor/x\0";
        assert_eq!(gitlinks_in(tree), ["vendor/x"]);
    }
}
