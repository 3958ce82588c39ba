//! The supervisor's control files where an agent can write them: the config
//! and the prompt files in the work tree.
//!
//! belay keeps the trusted copy of each in its own state (never in the work
//! tree), from the moment a run starts ([`belay_record::ControlStore`]):
//!
//! * **Recovery first.** A round that a killed belay left (its guard is still
//!   in the log dir) had an agent that could write these files. Before
//!   anything is read from them, every one that differs from its trusted
//!   copy is put back, and the start is refused: the message says what the
//!   agent changed. The config that finds the log dir is the trusted copy,
//!   never the file on disk.
//! * **The config** decides what runs on the host. An in-tree config that
//!   differs from its trusted copy (or now leads elsewhere) is refused until
//!   the user accepts it with `belay rounds trust`: an agent can also commit
//!   an edited config for a later checkout to bring back.
//! * **A prompt file** only goes to the agent. One changed while no agent
//!   could write it (before a round of a live belay) is the user's and is
//!   trusted again (`control_file_trusted`).
//! * **The round's guard** puts back the trusted copies, never what it found
//!   on disk at the round's start.
//! * **The stop file** has no trusted copy: it only asks the loop to stop
//!   (the agent can end its own loop anyway, with `.agent-done`). It is read
//!   like any file of the tree ([`read_prefix`]).
//!
//! Every read of a path an agent can write goes through
//! [`belay_sandbox::hostfs`]: inside the work tree no link is followed at
//! any level, only a regular file is read, never waited on, and at most a
//! bounded size. The user's own links outside the tree are followed.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};

use belay_record::control::describe_change;
use belay_record::{ControlChanged, ControlStore, RunLock};
use belay_sandbox::hostfs::{self, HostFsError};
use serde::{Deserialize, Serialize};

use crate::config::{Config, MAX_CONFIG_BYTES};
use crate::prompt::MAX_PROMPT_FILE;
use crate::RoundsError;

/// Links followed (outside the work tree) before a path is refused.
const MAX_HOPS: u32 = 40;

/// Where a path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Into the work tree: the path there, reached without following any
    /// link inside the tree.
    Tree(String),
    /// Outside it (the user's own links followed; the last name is not a link).
    Outside(PathBuf),
}

/// The names of a path: `..` kept as a name, `.` and the root dropped.
fn names(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Where `path` (absolute, or relative to `root`) leads. Outside `root` links
/// are resolved one name at a time (they are the user's); once the walk
/// enters `root` (canonical), nothing more is resolved: the rest is a path
/// in the tree, which [`hostfs::read`] opens without following any link.
pub fn locate(root: &Path, path: &Path) -> Result<Place, HostFsError> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    };
    let shown = abs.display().to_string();
    let dotdot = OsStr::new("..");
    let mut todo = names(&abs);
    let mut cur = PathBuf::from("/");
    let mut inside: Option<PathBuf> = (cur.as_path() == root).then(PathBuf::new);
    let mut hops = 0u32;
    while let Some(n) = todo.pop_front() {
        if let Some(rel) = inside.as_mut() {
            if n.as_os_str() != dotdot {
                rel.push(&n);
            } else if !rel.pop() {
                inside = None;
                cur = root.parent().unwrap_or(Path::new("/")).to_path_buf();
            }
            continue;
        }
        if n.as_os_str() == dotdot {
            cur.pop();
            continue;
        }
        let next = cur.join(&n);
        if next.as_path() == root {
            inside = Some(PathBuf::new());
            continue;
        }
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_HOPS {
                    return Err(HostFsError::Refused {
                        rel: shown,
                        why: "it goes through too many links".into(),
                    });
                }
                let target = std::fs::read_link(&next).map_err(|source| HostFsError::Io {
                    op: "read the link",
                    path: next.clone(),
                    source,
                })?;
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                for t in names(&target).into_iter().rev() {
                    todo.push_front(t);
                }
            }
            _ => cur = next,
        }
    }
    match inside {
        Some(rel) => rel
            .into_os_string()
            .into_string()
            .map(Place::Tree)
            .map_err(|_| HostFsError::Refused {
                rel: shown,
                why: "the name is not UTF-8".into(),
            }),
        None => Ok(Place::Outside(cur)),
    }
}

/// At most `max` bytes of the file `path` leads to: a regular file only,
/// opened without waiting (a FIFO or a device is refused at once), inside
/// `root` through real dirs only. `Ok(None)` when it is absent.
pub fn read_prefix(
    root: &Path,
    path: &Path,
    max: u64,
) -> Result<Option<(Place, Vec<u8>)>, HostFsError> {
    let place = locate(root, path)?;
    let got = match &place {
        Place::Tree(rel) => hostfs::read(root, rel, max)?,
        Place::Outside(p) => hostfs::read_under(root, p, max)?,
    };
    Ok(got.map(|b| (place, b)))
}

/// The whole file, as [`read_prefix`] reads it; refused when larger than `max`.
pub fn read_file(
    root: &Path,
    path: &Path,
    max: u64,
) -> Result<Option<(Place, Vec<u8>)>, HostFsError> {
    match read_prefix(root, path, max.saturating_add(1))? {
        Some((_, b)) if b.len() as u64 > max => Err(HostFsError::Refused {
            rel: path.display().to_string(),
            why: format!("it is larger than {max} bytes"),
        }),
        r => Ok(r),
    }
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
        let Component::Normal(c) = c else {
            return false;
        };
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                if std::fs::remove_file(&at).is_err() || std::fs::create_dir(&at).is_err() {
                    return false;
                }
            }
            Err(_) => {
                if std::fs::create_dir(&at).is_err() {
                    return false;
                }
            }
        }
    }
    true
}

/// Write `bytes` at `root/rel` through real dirs only; whatever else stands
/// at the name (a link, a FIFO, a dir) is removed first, never followed.
fn restore(root: &Path, rel: &str, bytes: &[u8]) -> Result<(), HostFsError> {
    if !real_parents(root, Path::new(rel)) {
        return Err(HostFsError::Refused {
            rel: rel.to_string(),
            why: "a parent dir could not be made a real dir".into(),
        });
    }
    let p = root.join(rel);
    match std::fs::symlink_metadata(&p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p).map_err(|source| HostFsError::Io {
            op: "remove",
            path: p.clone(),
            source,
        })?,
        Ok(m) if !m.is_file() => {
            hostfs::remove(root, rel)?;
        }
        _ => {}
    }
    hostfs::write(root, rel, bytes)
}

/// Where belay keeps the trusted copies: its own state, never a work tree.
pub fn store_dir() -> PathBuf {
    belay_record::state_home().join("rounds").join("trusted")
}

fn file_key(root: &Path, rel: &str) -> String {
    format!("rounds file\0{}\0{rel}", root.display())
}

fn where_key(config: &Path) -> String {
    format!("rounds config\0{}", config.display())
}

fn tree_key(root: &Path) -> String {
    format!("rounds tree\0{}", root.display())
}

/// A control file in a work tree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Where {
    root: PathBuf,
    rel: String,
}

/// A control file found changed (and put back).
#[derive(Debug, Clone)]
pub struct Change {
    /// Its path in the work tree.
    pub rel: String,
    pub path: PathBuf,
    /// The first differing lines, or what it became.
    pub what: String,
}

/// The trusted copies of one config's control files.
pub struct Trust {
    store: ControlStore,
    /// The config as the user named it (in messages).
    shown: PathBuf,
    /// Where the config is, when it is in a work tree.
    config_at: Option<Where>,
}

/// The prompt files of every phase.
fn prompt_paths(cfg: &Config) -> Vec<&Path> {
    let mut v: Vec<&Path> = cfg.prompt.files.iter().map(PathBuf::as_path).collect();
    for ph in &cfg.phases {
        v.extend(ph.prompt_files.iter().flatten().map(PathBuf::as_path));
    }
    v
}

impl Trust {
    /// The command that accepts the files as they are.
    pub fn accept_command(&self) -> String {
        format!("belay rounds --config {} trust", self.shown.display())
    }

    fn trust_file(&self, root: &Path, rel: &str, bytes: &[u8]) -> Result<(), RoundsError> {
        self.store.trust(&file_key(root, rel), bytes)?;
        self.store
            .trust(&tree_key(root), root.as_os_str().as_encoded_bytes())?;
        Ok(())
    }

    /// A work tree belay trusted files in, at or above one of `paths`' dirs.
    fn trusted_tree_above(&self, paths: &[&Path]) -> Result<Option<PathBuf>, RoundsError> {
        for p in paths {
            for a in p.ancestors().skip(1) {
                if self.store.trusted(&tree_key(a))?.is_some() {
                    return Ok(Some(a.to_path_buf()));
                }
            }
        }
        Ok(None)
    }

    /// Where the (canonical) config of `cfg` is in a work tree: its own, or
    /// another that belay trusted files in.
    fn place_of(&self, cfg: &Config) -> Result<Option<Where>, RoundsError> {
        let root = if cfg.path.starts_with(&cfg.runtime.work_dir) {
            Some(cfg.runtime.work_dir.clone())
        } else {
            self.trusted_tree_above(&[&cfg.path])?
        };
        Ok(root.and_then(|root| {
            let rel = cfg.path.strip_prefix(&root).ok()?.to_str()?.to_string();
            (!rel.is_empty()).then_some(Where { root, rel })
        }))
    }

    /// The control files of `cfg` in a work tree: the config (where it was
    /// trusted) and every prompt file in the work dir.
    fn in_tree(&self, cfg: &Config) -> Vec<Where> {
        let root = &cfg.runtime.work_dir;
        let mut out: Vec<Where> = self.config_at.iter().cloned().collect();
        for f in prompt_paths(cfg) {
            if let Ok(Place::Tree(rel)) = locate(root, f) {
                out.push(Where {
                    root: root.clone(),
                    rel,
                });
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Read-only views of the control files in the tree for the agent's
    /// container: the trusted copy of each, written under `view_dir`, with
    /// its path relative to `repo_root` (where the container mounts the
    /// tree). Mounted over the file, it cannot be written, and a rename over
    /// it fails (EBUSY): the agent need not write these, so it cannot.
    pub fn readonly_views(
        &self,
        cfg: &Config,
        repo_root: &Path,
        view_dir: &Path,
    ) -> Result<Vec<(PathBuf, String)>, RoundsError> {
        let mut out = Vec::new();
        for (i, w) in self.in_tree(cfg).into_iter().enumerate() {
            let Some(bytes) = self.store.trusted(&file_key(&w.root, &w.rel))? else {
                continue;
            };
            let path = w.root.join(&w.rel);
            let Some(rel) = path
                .strip_prefix(repo_root)
                .ok()
                .and_then(|r| r.to_str())
                .filter(|r| !r.is_empty())
            else {
                continue;
            };
            fs_err::create_dir_all(view_dir)
                .map_err(|e| RoundsError::io("cannot create", view_dir, e))?;
            let view = view_dir.join(format!("{i}"));
            belay_record::atomic_write(&view, &bytes)?;
            out.push((view, rel.to_string()));
        }
        Ok(out)
    }

    /// Put back every control file of `cfg` that differs from its trusted
    /// copy, never reading more of it than the copy's size (the agent's
    /// processes are gone). What changed, in path order.
    pub fn put_back(&self, cfg: &Config) -> Result<Vec<Change>, RoundsError> {
        let mut out = Vec::new();
        for w in self.in_tree(cfg) {
            let Some(want) = self.store.trusted(&file_key(&w.root, &w.rel))? else {
                continue;
            };
            let now = hostfs::read(&w.root, &w.rel, want.len() as u64 + 1);
            let what = match &now {
                Ok(Some(b)) if *b == want => continue,
                Ok(Some(b)) => describe_change(&want, b),
                Ok(None) => "the file was removed".to_string(),
                Err(e) => format!("it was replaced by something belay does not read ({e})"),
            };
            let path = w.root.join(&w.rel);
            restore(&w.root, &w.rel, &want).map_err(|source| RoundsError::ControlRestore {
                path: path.clone(),
                source,
            })?;
            out.push(Change {
                rel: w.rel,
                path,
                what,
            });
        }
        Ok(out)
    }

    /// Trust the prompt files of `cfg` as they are now. Only while no agent
    /// can write them: before a round, once the last round's agent is gone
    /// and its guard applied; a change then is the user's. The paths trusted
    /// anew or forgotten (a first copy is not listed). One belay will not read
    /// (a link, a FIFO, too large) keeps its trusted copy: the battery names it.
    pub fn refresh(&self, cfg: &Config) -> Result<Vec<String>, RoundsError> {
        let root = &cfg.runtime.work_dir;
        let mut changed = Vec::new();
        for f in prompt_paths(cfg) {
            let Ok(Place::Tree(rel)) = locate(root, f) else {
                continue;
            };
            let key = file_key(root, &rel);
            match hostfs::read(root, &rel, MAX_PROMPT_FILE + 1) {
                Ok(Some(bytes)) if bytes.len() as u64 <= MAX_PROMPT_FILE => {
                    match self.store.trusted(&key)? {
                        Some(t) if t == bytes => {}
                        had => {
                            self.trust_file(root, &rel, &bytes)?;
                            if had.is_some() {
                                changed.push(rel);
                            }
                        }
                    }
                }
                Ok(None) if self.store.trusted(&key)?.is_some() => {
                    self.store.forget(&key)?;
                    changed.push(rel);
                }
                _ => {}
            }
        }
        changed.sort();
        changed.dedup();
        Ok(changed)
    }

    /// Record the config's text as trusted, under both names it is opened by.
    fn record_config(&self, cfg: &Config, text: &str, p1: &Path) -> Result<(), RoundsError> {
        let Some(at) = &self.config_at else {
            return Ok(());
        };
        self.trust_file(&at.root, &at.rel, text.as_bytes())?;
        let rec = serde_json::to_vec(at)
            .map_err(|e| RoundsError::io("cannot encode", &cfg.path, std::io::Error::other(e)))?;
        for p in [p1, cfg.path.as_path()] {
            self.store.trust(&where_key(p), &rec)?;
        }
        Ok(())
    }

    /// The config on disk against its trusted copy: where `given` leads, then
    /// its bytes (read only as a regular file in the tree).
    fn verify_config(&self, given: &Path) -> Result<(), ControlChanged> {
        let Some(at) = &self.config_at else {
            return Ok(());
        };
        let trusted_path = at.root.join(&at.rel);
        let accept = format!("run `{}`", self.accept_command());
        let changed = |what: String| ControlChanged {
            path: self.shown.clone(),
            what,
            accept: accept.clone(),
        };
        match std::fs::canonicalize(given) {
            Ok(p) if p == trusted_path => {}
            Ok(p) => {
                return Err(changed(format!(
                    "it now leads to {} (belay trusted {})",
                    p.display(),
                    trusted_path.display()
                )))
            }
            Err(_) => return Err(changed("the file was removed".into())),
        }
        let current = hostfs::read(&at.root, &at.rel, MAX_CONFIG_BYTES + 1)
            .map_err(|e| changed(format!("it cannot be read as a regular file ({e})")))?;
        self.store.verify(
            &file_key(&at.root, &at.rel),
            &self.shown,
            current.as_deref(),
            &accept,
        )
    }

    /// The refusal for `changes`; `put_back`: found by the recovery.
    fn refusal(&self, changes: &[Change], put_back: bool) -> ControlChanged {
        let cmd = self.accept_command();
        let (path, mut what) = match changes.split_first() {
            Some((c, rest)) => {
                let mut w = c.what.clone();
                if !rest.is_empty() {
                    let others: Vec<&str> = rest.iter().map(|c| c.rel.as_str()).collect();
                    w.push_str(&format!("; also changed: {}", others.join(", ")));
                }
                (c.path.clone(), w)
            }
            None => (self.shown.clone(), String::new()),
        };
        let accept = if put_back {
            what.push_str(
                ". belay was stopped during a round whose agent could write it; the copy belay trusted is back in place",
            );
            format!("make the change again, then run `{cmd}`")
        } else {
            format!("run `{cmd}`")
        };
        ControlChanged { path, what, accept }
    }

    /// A config belay has not trusted, inside a work tree it trusted files in.
    fn untrusted(&self, root: &Path) -> ControlChanged {
        ControlChanged {
            path: self.shown.clone(),
            what: format!(
                "nothing: belay has not trusted this config (it is new), and it is inside the work tree {}, which an agent could write",
                root.display()
            ),
            accept: format!("run `{}`", self.accept_command()),
        }
    }
}

/// What the config is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Reading the project (status, stop, install, the monitor): the trusted
    /// copy when there is one, never a file an agent may be writing.
    Observe,
    /// Running rounds: recovery first, then a changed config is refused.
    Run,
    /// `belay rounds trust`: recovery first, then the files as they are now
    /// are trusted.
    Accept,
}

/// The config, and the trusted copies that go with it.
pub struct Gated {
    pub cfg: Config,
    pub trust: Trust,
    /// What `Accept` did, a line each.
    pub notes: Vec<String>,
}

/// The trusted config of a known path.
struct Known {
    at: Where,
    bytes: Vec<u8>,
    cfg: Config,
}

/// The config cannot be found or read.
fn missing(given: &Path, e: impl std::fmt::Display) -> RoundsError {
    RoundsError::Config(format!(
        "cannot read the config {}: {e} (run `belay rounds init`, or pass --config)",
        given.display()
    ))
}

/// The two names a config is known by: its dir resolved with its own name
/// (a link the agent puts at the name does not change it), and the file
/// resolved (`None` when it is gone).
fn names_of(given: &Path) -> Result<(PathBuf, Option<PathBuf>), RoundsError> {
    let abs = std::path::absolute(given).map_err(|e| missing(given, e))?;
    let Some(name) = abs.file_name() else {
        return Err(RoundsError::Config(format!(
            "{} names no file: pass --config with the config's path",
            given.display()
        )));
    };
    let dir = abs.parent().unwrap_or(Path::new("/"));
    let p1 = std::fs::canonicalize(dir)
        .map_err(|e| missing(given, e))?
        .join(name);
    Ok((p1, std::fs::canonicalize(&abs).ok()))
}

fn lookup(
    store: &ControlStore,
    p1: &Path,
    p2: Option<&Path>,
) -> Result<Option<Where>, RoundsError> {
    for p in std::iter::once(p1).chain(p2) {
        if let Some(b) = store.trusted(&where_key(p))? {
            if let Ok(w) = serde_json::from_slice::<Where>(&b) {
                return Ok(Some(w));
            }
        }
    }
    Ok(None)
}

fn load_known(store: &ControlStore, at: Where) -> Result<Option<Known>, RoundsError> {
    let Some(bytes) = store.trusted(&file_key(&at.root, &at.rel))? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let cfg = Config::parse(&at.root.join(&at.rel), &text)?;
    Ok(Some(Known { at, bytes, cfg }))
}

/// The config on disk, for the first time: resolved, then read as a regular
/// file of its dir, never through a link, at most 1 MiB.
pub(crate) fn load_fresh(given: &Path) -> Result<(Config, String), RoundsError> {
    let canon = std::fs::canonicalize(given).map_err(|e| missing(given, e))?;
    let dir = canon.parent().unwrap_or(Path::new("/"));
    let bytes = match read_file(dir, &canon, MAX_CONFIG_BYTES) {
        Ok(Some((_, b))) => b,
        Ok(None) => return Err(missing(given, "it does not exist")),
        Err(source) => {
            return Err(RoundsError::ControlRead {
                path: canon,
                source,
            })
        }
    };
    let text = String::from_utf8(bytes)
        .map_err(|_| RoundsError::Config(format!("{} is not UTF-8 text", canon.display())))?;
    let cfg = Config::parse(&canon, &text)?;
    Ok((cfg, text))
}

/// Hold the log dir's lock while the files are checked: no round of this
/// config may run meanwhile.
fn lock_log_dir(dir: &Path) -> Result<Option<RunLock>, RoundsError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    match RunLock::acquire(&dir.join(belay_record::LOCK_FILE)) {
        Ok(l) => Ok(Some(l)),
        Err(belay_record::RecordError::Locked { .. }) => Err(RoundsError::Environment(format!(
            "another belay rounds holds the log dir {} (a serve or a round of this config is running): `belay rounds status` shows it",
            dir.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// A round's guard is still in the log dir: belay was killed during it.
fn guard_pending(cfg: &Config) -> bool {
    std::fs::symlink_metadata(cfg.runtime.log_dir.join(crate::round::GUARD_FILE)).is_ok()
}

/// Open the config at `given` for `how`, with the trusted copies in belay's
/// state home.
pub fn open(given: &Path, how: Use) -> Result<Gated, RoundsError> {
    open_in(ControlStore::new(store_dir()), given, how)
}

/// [`open`], with the trusted copies kept in `store`.
pub fn open_in(store: ControlStore, given: &Path, how: Use) -> Result<Gated, RoundsError> {
    let (p1, p2) = names_of(given)?;
    let at = lookup(&store, &p1, p2.as_deref())?;
    let trust = Trust {
        store,
        shown: std::path::absolute(given).unwrap_or_else(|_| given.to_path_buf()),
        config_at: None,
    };
    let known = match at {
        None => None,
        // A trusted copy belay cannot load any more is replaced on accept.
        Some(at) => match load_known(&trust.store, at) {
            Err(_) if how == Use::Accept => None,
            r => r?,
        },
    };
    match how {
        Use::Observe => {
            let cfg = match known {
                Some(k) => k.cfg,
                None => load_fresh(given)?.0,
            };
            Ok(Gated {
                cfg,
                trust,
                notes: Vec::new(),
            })
        }
        Use::Run => run(trust, given, &p1, known),
        Use::Accept => accept(trust, given, &p1, known),
    }
}

fn run(
    mut trust: Trust,
    given: &Path,
    p1: &Path,
    known: Option<Known>,
) -> Result<Gated, RoundsError> {
    let (cfg, fresh) = match known {
        Some(k) => {
            trust.config_at = Some(k.at);
            (k.cfg, None)
        }
        None => {
            let canon = std::fs::canonicalize(given).ok();
            let paths: Vec<&Path> = std::iter::once(p1).chain(canon.as_deref()).collect();
            if let Some(root) = trust.trusted_tree_above(&paths)? {
                return Err(trust.untrusted(&root).into());
            }
            let (cfg, text) = load_fresh(given)?;
            trust.config_at = trust.place_of(&cfg)?;
            (cfg, Some(text))
        }
    };
    let _lock = lock_log_dir(&cfg.runtime.log_dir)?;
    // Recovery, before anything is read from a file the agent could write.
    if guard_pending(&cfg) {
        let changes = trust.put_back(&cfg)?;
        if !changes.is_empty() {
            return Err(trust.refusal(&changes, true).into());
        }
    }
    match &fresh {
        None => trust.verify_config(given)?,
        Some(text) => trust.record_config(&cfg, text, p1)?,
    }
    Ok(Gated {
        cfg,
        trust,
        notes: Vec::new(),
    })
}

fn accept(
    mut trust: Trust,
    given: &Path,
    p1: &Path,
    known: Option<Known>,
) -> Result<Gated, RoundsError> {
    let mut notes = Vec::new();
    let _old_lock = match &known {
        Some(k) => lock_log_dir(&k.cfg.runtime.log_dir)?,
        None => None,
    };
    if let Some(k) = &known {
        trust.config_at = Some(k.at.clone());
        if guard_pending(&k.cfg) {
            for c in trust.put_back(&k.cfg)? {
                notes.push(format!(
                    "put back {}: {} (changed during a round that belay did not end: make the change again, then trust it)",
                    c.rel, c.what
                ));
            }
        }
    }
    let (cfg, text) = load_fresh(given)?;
    let _new_lock = if known.is_none() {
        lock_log_dir(&cfg.runtime.log_dir)?
    } else {
        None
    };
    trust.config_at = trust.place_of(&cfg)?;
    match (&known, &trust.config_at) {
        (_, None) => notes.push(format!(
            "{}: outside the work tree, which no agent can write: nothing to trust",
            cfg.path.display()
        )),
        (Some(k), Some(at)) if k.at != *at => notes.push(format!(
            "{}: trusted; it now leads to {} (was {})",
            given.display(),
            at.root.join(&at.rel).display(),
            k.at.root.join(&k.at.rel).display()
        )),
        (Some(k), Some(at)) if k.bytes == text.as_bytes() => {
            notes.push(format!("{}: unchanged", at.rel))
        }
        (Some(k), Some(at)) => notes.push(format!(
            "{}: trusted as changed: {}",
            at.rel,
            describe_change(&k.bytes, text.as_bytes())
        )),
        (None, Some(at)) => notes.push(format!("{}: trusted", at.rel)),
    }
    trust.record_config(&cfg, &text, p1)?;
    for rel in trust.refresh(&cfg)? {
        notes.push(format!("{rel}: trusted as changed"));
    }
    Ok(Gated { cfg, trust, notes })
}

/// What a start would refuse about the config at `given` (for `doctor`),
/// reading nothing but the config itself.
pub fn pending_change(given: &Path) -> Result<Option<ControlChanged>, RoundsError> {
    pending_in(ControlStore::new(store_dir()), given)
}

fn pending_in(store: ControlStore, given: &Path) -> Result<Option<ControlChanged>, RoundsError> {
    let (p1, p2) = names_of(given)?;
    let at = lookup(&store, &p1, p2.as_deref())?;
    let mut trust = Trust {
        store,
        shown: std::path::absolute(given).unwrap_or_else(|_| given.to_path_buf()),
        config_at: None,
    };
    match at {
        Some(at) => {
            trust.config_at = Some(at);
            Ok(trust.verify_config(given).err())
        }
        None => {
            let paths: Vec<&Path> = std::iter::once(p1.as_path()).chain(p2.as_deref()).collect();
            Ok(trust
                .trusted_tree_above(&paths)?
                .map(|root| trust.untrusted(&root)))
        }
    }
}

#[cfg(test)]
mod tests;
