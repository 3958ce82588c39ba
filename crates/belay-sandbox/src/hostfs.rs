//! Host-side access to a workspace that sandboxes can write.
//!
//! A step's container writes the bind-mounted workspace; belay then reads and
//! writes files there on the host (artifacts, shared files, scrubbing of
//! declared outputs, the built-in agent's edits, stale-output deletion).
//!
//! Threat model: anything in the workspace may have been planted by the
//! sandbox, **and may change while belay works**: a process in the container
//! can swap a directory for a symlink (`renameat2(RENAME_EXCHANGE)`) between
//! any two system calls of belay's. So no path is ever resolved twice by name:
//!
//! * the walk starts from an open handle on the root and opens each parent
//!   with `openat(…, O_NOFOLLOW | O_DIRECTORY)` relative to the handle of the
//!   level above, so a link at any level fails the open instead of being
//!   followed, and a directory that is swapped after it was opened is still
//!   the directory that was checked;
//! * every open, create, rename, unlink and stat of the last component is
//!   done relative to the parent's handle, with `O_NOFOLLOW` /
//!   `AT_SYMLINK_NOFOLLOW`;
//! * `..`, absolute paths and any `.git` component (for writes) are refused
//!   by name before anything is opened.
//!
//! The container cannot move a directory out of the workspace mount (a rename
//! across mounts fails with `EXDEV`), so a handle once opened stays inside.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// What host-side workspace access refused or failed to do.
#[derive(Debug, thiserror::Error)]
pub enum HostFsError {
    #[error("`{rel}` is refused: {why}")]
    Refused { rel: String, why: String },
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl belay_record::Classify for HostFsError {
    fn exit_class(&self) -> belay_record::ExitClass {
        match self {
            HostFsError::Refused { .. } => belay_record::ExitClass::Failed,
            HostFsError::Io { source, .. } => belay_record::io_class(source),
        }
    }
}

impl From<HostFsError> for String {
    fn from(e: HostFsError) -> String {
        e.to_string()
    }
}

fn refused(rel: &str, why: impl Into<String>) -> HostFsError {
    HostFsError::Refused {
        rel: rel.to_string(),
        why: why.into(),
    }
}

fn io(op: &'static str, path: PathBuf, e: Errno) -> HostFsError {
    HostFsError::Io {
        op,
        path,
        source: e.into(),
    }
}

/// The names of `rel`, checked: no `..`, no root, not empty; no `.git` when
/// `writing`.
fn names(rel: &str, writing: bool) -> Result<Vec<&str>, HostFsError> {
    let mut out = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(n) => match n.to_str() {
                Some(s) => out.push(s),
                None => return Err(refused(rel, "the name is not UTF-8")),
            },
            Component::CurDir => {}
            _ => return Err(refused(rel, "not a path inside the workspace")),
        }
    }
    if out.is_empty() {
        return Err(refused(rel, "it names no file"));
    }
    if writing && out.iter().any(|n| n.eq_ignore_ascii_case(".git")) {
        return Err(refused(
            rel,
            "git's own files are not writable from the sandbox",
        ));
    }
    Ok(out)
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// An open handle on the parent directory of `rel`'s last name, reached
/// without following any link. `Ok(None)`: a parent is missing and `create`
/// is off.
fn open_parent<'a>(
    root: &Path,
    rel: &'a str,
    create: bool,
    writing: bool,
) -> Result<Option<(OwnedFd, &'a str)>, HostFsError> {
    let names = names(rel, writing)?;
    let (last, parents) = names
        .split_last()
        .ok_or_else(|| refused(rel, "it names no file"))?;
    let mut dir = rustix::fs::open(root, DIR_FLAGS, Mode::empty())
        .map_err(|e| io("open the workspace", root.to_path_buf(), e))?;
    let mut at = root.to_path_buf();
    for n in parents {
        at.push(n);
        let next = match rustix::fs::openat(&dir, *n, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&dir, *n, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(io("create", at, e)),
                }
                rustix::fs::openat(&dir, *n, DIR_FLAGS, Mode::empty())
                    .map_err(|e| not_a_dir(rel, &at, e))?
            }
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(not_a_dir(rel, &at, e)),
        };
        dir = next;
    }
    Ok(Some((dir, last)))
}

fn not_a_dir(rel: &str, at: &Path, e: Errno) -> HostFsError {
    match e {
        Errno::LOOP | Errno::NOTDIR => refused(
            rel,
            format!(
                "{} is a symlink or not a directory; belay does not go through links",
                at.display()
            ),
        ),
        e => io("open", at.to_path_buf(), e),
    }
}

/// Read a regular file (not a link), at most `max` bytes. `Ok(None)` when absent.
pub fn read(root: &Path, rel: &str, max: u64) -> Result<Option<Vec<u8>>, HostFsError> {
    let Some((dir, name)) = open_parent(root, rel, false, false)? else {
        return Ok(None);
    };
    let path = root.join(rel);
    let Some((f, st)) = open_regular(&dir, name, rel, &path)? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity((st.st_size as u64).min(max) as usize);
    f.take(max)
        .read_to_end(&mut out)
        .map_err(|source| HostFsError::Io {
            op: "read",
            path,
            source,
        })?;
    Ok(Some(out))
}

/// Read a file that a sandbox may have written (or replaced), at most `max`
/// bytes: the one host read of an untrusted path. Under `root` (a work tree,
/// a workspace) it is [`read`]: no link at any level below the root. Outside
/// `root` (a path the user gave, such as a stop file elsewhere) the last name
/// is still never followed. Either way only a regular file is read, opened
/// non-blocking, so a FIFO, a device or `/dev/zero` behind a link is refused
/// at once, never waited on or read without bound. `Ok(None)` when absent.
pub fn read_under(root: &Path, path: &Path, max: u64) -> Result<Option<Vec<u8>>, HostFsError> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    };
    if let Ok(rel) = abs.strip_prefix(root) {
        let rel = rel
            .to_str()
            .ok_or_else(|| refused(&abs.to_string_lossy(), "the name is not UTF-8"))?;
        return read(root, rel, max);
    }
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name().and_then(|n| n.to_str()))
    else {
        return Err(refused(&abs.to_string_lossy(), "it names no file"));
    };
    let dir = match rustix::fs::open(
        parent,
        DIR_FLAGS.difference(OFlags::NOFOLLOW),
        Mode::empty(),
    ) {
        Ok(d) => d,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io("open", parent.to_path_buf(), e)),
    };
    let shown = abs.to_string_lossy().into_owned();
    let Some((f, st)) = open_regular(&dir, name, &shown, &abs)? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity((st.st_size as u64).min(max) as usize);
    f.take(max)
        .read_to_end(&mut out)
        .map_err(|source| HostFsError::Io {
            op: "read",
            path: abs,
            source,
        })?;
    Ok(Some(out))
}

/// Read a file of a repository belay did not make and no sandbox is
/// writing (a project the batch builder cloned, the user's checkout before
/// analysis), at most `max` bytes. Links are followed while they stay inside
/// `root` (a `requirements.txt -> requirements/base.txt` is common), never out
/// of it: a committed `pyproject.toml -> ~/.netrc` or `-> /dev/zero` is
/// refused. Only a regular file is read, opened non-blocking. `Ok(None)` when
/// absent.
pub fn read_in_tree(root: &Path, rel: &str, max: u64) -> Result<Option<Vec<u8>>, HostFsError> {
    // Resolved in the tree as the OS would, never looking outside it.
    match resolve_in_tree(root, Path::new(rel))? {
        Resolved::Inside(inner) => match inner.to_str() {
            Some("") => Err(refused(rel, "it names the repository itself")),
            Some(inner) => read(root, inner, max),
            None => Err(refused(rel, "the name is not UTF-8")),
        },
        Resolved::Escapes(why) => Err(refused(
            rel,
            format!("it leads out of the repository ({why})"),
        )),
    }
}

/// The name a quarantined repository's `.git` gets.
pub const QUARANTINED_GIT: &str = ".git.belay-quarantined";

/// Move the `.git` (a directory, a gitfile or anything else) of the
/// directory `rel` aside to [`QUARANTINED_GIT`] (or `…-N` when taken),
/// never through a link: a repository a sandbox planted at a committed
/// submodule's path would otherwise run its config (`core.fsmonitor`,
/// hooks) on the user's next `git status` in the outer tree. `Ok(None)`
/// when `rel` holds no `.git`; the new name otherwise.
pub fn quarantine_git(root: &Path, rel: &str) -> Result<Option<String>, HostFsError> {
    let inner = if rel.is_empty() || rel == "." {
        return Err(refused(rel, "the top repository is not quarantined"));
    } else {
        format!("{rel}/.git")
    };
    let Some((dir, _)) = open_parent(root, &inner, false, false)? else {
        return Ok(None);
    };
    match rustix::fs::statat(&dir, ".git", AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => {}
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io("stat", root.join(&inner), e)),
    }
    for n in 0..100u32 {
        let to = if n == 0 {
            QUARANTINED_GIT.to_string()
        } else {
            format!("{QUARANTINED_GIT}-{n}")
        };
        match rustix::fs::renameat_with(
            &dir,
            ".git",
            &dir,
            to.as_str(),
            rustix::fs::RenameFlags::NOREPLACE,
        ) {
            Ok(()) => return Ok(Some(format!("{rel}/{to}"))),
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(io("rename", root.join(&inner), e)),
        }
    }
    Err(refused(&inner, "no free quarantine name"))
}

/// Open `name` in `dir` for reading: a regular file, never through a link
/// (and never blocking on a FIFO). `Ok(None)` when absent.
fn open_regular(
    dir: impl AsFd,
    name: impl rustix::path::Arg,
    rel: &str,
    path: &Path,
) -> Result<Option<(File, rustix::fs::Stat)>, HostFsError> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::LOOP) => {
            return Err(refused(
                rel,
                "it is a symlink; belay does not read through links",
            ))
        }
        Err(e) => return Err(io("read", path.to_path_buf(), e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| io("stat", path.to_path_buf(), e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(refused(rel, "it is not a regular file"));
    }
    Ok(Some((File::from(fd), st)))
}

/// Write a file atomically: a fresh temporary file in the same directory
/// (created exclusively, never through a link), then a rename over the name,
/// which replaces a link rather than following it. An existing regular file
/// keeps its mode.
pub fn write(root: &Path, rel: &str, content: &[u8]) -> Result<(), HostFsError> {
    let (dir, name) = open_parent(root, rel, true, true)?
        .ok_or_else(|| refused(rel, "a parent directory could not be made"))?;
    let path = root.join(rel);
    let mode = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            // The permission bits only: a set-id bit a step set on the file
            // is not carried over to what belay writes.
            FileType::RegularFile => Some(st.st_mode & 0o777),
            FileType::Symlink => {
                return Err(refused(
                    rel,
                    "it is a symlink; belay does not write through links",
                ))
            }
            _ => return Err(refused(rel, "it is not a regular file")),
        },
        Err(Errno::NOENT) => None,
        Err(e) => return Err(io("stat", path, e)),
    };
    let nonce = fastrand::u64(..);
    let tmp = format!(".{name}.belay-{}-{nonce:016x}", std::process::id());
    let fd = rustix::fs::openat(
        &dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode.unwrap_or(0o644) & 0o777),
    )
    .map_err(|e| io("create", root.join(&tmp), e))?;
    let result = (|| {
        if let Some(m) = mode {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(m))
                .map_err(|e| io("set the mode of", path.clone(), e))?;
        }
        write_synced(File::from(fd), content, &path)?;
        rustix::fs::renameat(&dir, tmp.as_str(), &dir, name)
            .map_err(|e| io("replace", path.clone(), e))
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
    }
    result
}

/// Write a file in place, keeping its inode (a bind mount over its name, in
/// a container, stays attached): the existing regular file, opened without
/// following a link or blocking on a FIFO, with one link only (a hard link
/// would carry the write elsewhere), truncated and written. Where that cannot
/// be (no file, a link, several links), [`write`] replaces it atomically.
/// Not atomic: for a file whose trusted copy belay keeps elsewhere.
pub fn write_in_place(root: &Path, rel: &str, content: &[u8]) -> Result<(), HostFsError> {
    let Some((dir, name)) = open_parent(root, rel, false, true)? else {
        return write(root, rel, content);
    };
    let path = root.join(rel);
    let fd = match rustix::fs::openat(
        &dir,
        name,
        OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(_) => return write(root, rel, content),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| io("stat", path.clone(), e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_nlink != 1 {
        drop(fd);
        return write(root, rel, content);
    }
    // A set-id bit a sandbox set goes, as with `write`.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(st.st_mode & 0o777))
        .map_err(|e| io("set the mode of", path.clone(), e))?;
    rustix::fs::ftruncate(&fd, 0).map_err(|e| io("truncate", path.clone(), e))?;
    write_synced(File::from(fd), content, &path)
}

/// Write `content` to `f` and sync it (errors name `path`).
fn write_synced(mut f: File, content: &[u8], path: &Path) -> Result<(), HostFsError> {
    f.write_all(content).map_err(|source| HostFsError::Io {
        op: "write",
        path: path.to_path_buf(),
        source,
    })?;
    f.sync_all().map_err(|source| HostFsError::Io {
        op: "sync",
        path: path.to_path_buf(),
        source,
    })
}

/// Delete a file (a link itself, never its target). Whether there was one.
pub fn remove(root: &Path, rel: &str) -> Result<bool, HostFsError> {
    let Some((dir, name)) = open_parent(root, rel, false, true)? else {
        return Ok(false);
    };
    remove_at(dir.as_fd(), name, &root.join(rel), rel)
}

fn remove_at(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &str,
    path: &Path,
    rel: &str,
) -> Result<bool, HostFsError> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(Errno::ISDIR) | Err(Errno::PERM) => {
            match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    Err(refused(rel, "it is a directory"))
                }
                _ => Err(io("delete", path.to_path_buf(), Errno::PERM)),
            }
        }
        Err(e) => Err(io("delete", path.to_path_buf(), e)),
    }
}

/// Scrub secrets out of a file in place, streamed (no size limit, nothing
/// held whole): a first pass looks for any secret form; only if one is found
/// is the file rewritten through a [`belay_record::StreamRedactor`] into a
/// fresh file in the same directory (reached through the same handle),
/// renamed over the name. Whether it was rewritten; `Ok(false)` when absent.
pub fn scrub(
    root: &Path,
    rel: &str,
    redactor: &belay_record::Redactor,
) -> Result<bool, HostFsError> {
    if redactor.is_empty() {
        return Ok(false);
    }
    let Some((dir, name)) = open_parent(root, rel, false, true)? else {
        return Ok(false);
    };
    scrub_at(
        dir.as_fd(),
        std::ffi::OsStr::new(name),
        rel,
        &root.join(rel),
        redactor,
    )
}

/// [`scrub`] of the entry `name` of the open directory `dir` (`rel` and
/// `path` name it in errors). The temporary file's name does not carry the
/// file's (a long name would not fit, and a name may hold a secret).
fn scrub_at(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    rel: &str,
    path: &Path,
    redactor: &belay_record::Redactor,
) -> Result<bool, HostFsError> {
    let open = || -> Result<Option<(File, u32)>, HostFsError> {
        Ok(open_regular(dir, name, rel, path)?.map(|(f, st)| (f, st.st_mode & 0o777)))
    };
    let ioerr = |op: &'static str| {
        let path = path.to_path_buf();
        move |source| HostFsError::Io {
            op,
            path: path.clone(),
            source,
        }
    };
    let Some((f, _)) = open()? else {
        return Ok(false);
    };
    if redactor.scanner().scan(f).map_err(ioerr("read"))?.is_none() {
        return Ok(false);
    }
    let Some((f, mode)) = open()? else {
        return Ok(false);
    };
    let tmp = format!(
        ".belay-scrub-{}-{:016x}",
        std::process::id(),
        fastrand::u64(..)
    );
    let fd = rustix::fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(|e| io("create", path.with_file_name(&tmp), e))?;
    let result = (|| {
        let mut out = std::io::BufWriter::with_capacity(256 * 1024, File::from(fd));
        let mut r = std::io::BufReader::with_capacity(256 * 1024, f);
        let mut sr = belay_record::StreamRedactor::new(redactor.clone());
        let mut buf = Vec::new();
        loop {
            let chunk = std::io::BufRead::fill_buf(&mut r).map_err(ioerr("read"))?;
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len();
            buf.clear();
            sr.push(chunk, &mut buf);
            std::io::BufRead::consume(&mut r, n);
            out.write_all(&buf).map_err(ioerr("write"))?;
        }
        buf.clear();
        sr.finish(&mut buf);
        out.write_all(&buf).map_err(ioerr("write"))?;
        let f = out.into_inner().map_err(|e| HostFsError::Io {
            op: "write",
            path: path.to_path_buf(),
            source: e.into_error(),
        })?;
        f.sync_all().map_err(ioerr("sync"))?;
        rustix::fs::renameat(dir, tmp.as_str(), dir, name)
            .map_err(|e| io("replace", path.to_path_buf(), e))
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    result.map(|()| true)
}

/// What a walk of the workspace after a step found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WorkspaceSweep {
    /// Regular files whose set-uid or set-gid bits were cleared.
    pub setid_cleared: Vec<String>,
    /// Entries named `.git` below the top (nested repositories or gitfiles).
    pub nested_git: Vec<String>,
}

/// Walk the whole workspace (not following links, not entering the top
/// `.git`): clear the set-uid and set-gid bits of every regular file (a step
/// runs as root, so a set-id file it leaves would be a root shell for anyone
/// on the host), and list every nested `.git`. Names need not be UTF-8; there
/// is no depth limit; anything the walk cannot open is an error, never
/// skipped. Run when no sandbox process is alive.
pub fn sweep_workspace(root: &Path) -> Result<WorkspaceSweep, HostFsError> {
    let dir = rustix::fs::open(root, DIR_FLAGS, Mode::empty())
        .map_err(|e| io("open the workspace", root.to_path_buf(), e))?;
    let mut out = WorkspaceSweep::default();
    sweep_in(dir, root, &PathBuf::new(), true, &mut out)?;
    Ok(out)
}

fn sweep_in(
    dir: OwnedFd,
    root: &Path,
    prefix: &Path,
    top: bool,
    out: &mut WorkspaceSweep,
) -> Result<(), HostFsError> {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let at = root.join(prefix);
    let entries = rustix::fs::Dir::read_from(&dir).map_err(|e| io("list", at.clone(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io("list", at.clone(), e))?;
        let cname = entry.file_name();
        let bytes = cname.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let rel = prefix.join(OsStr::from_bytes(bytes));
        let shown = rel.to_string_lossy().into_owned();
        if bytes.eq_ignore_ascii_case(b".git") {
            if top {
                continue;
            }
            out.nested_git.push(shown.clone());
        }
        let st = match rustix::fs::statat(&dir, cname, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(io("stat", root.join(&rel), e)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let sub = rustix::fs::openat(&dir, cname, DIR_FLAGS, Mode::empty())
                    .map_err(|e| io("open", root.join(&rel), e))?;
                sweep_in(sub, root, &rel, false, out)?;
            }
            FileType::RegularFile if st.st_mode & 0o6000 != 0 => {
                let fd = rustix::fs::openat(
                    &dir,
                    cname,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                    Mode::empty(),
                )
                .map_err(|e| io("open", root.join(&rel), e))?;
                // The mode of what was opened, not of what was listed.
                let now = rustix::fs::fstat(&fd).map_err(|e| io("stat", root.join(&rel), e))?;
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(now.st_mode & 0o1777))
                    .map_err(|e| io("clear the set-id bits of", root.join(&rel), e))?;
                out.setid_cleared.push(shown);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether `rel` can be reached without a link in any parent (for git
/// pathspecs: git refuses a pathspec "beyond a symbolic link").
pub fn parents_are_dirs(root: &Path, rel: &str) -> bool {
    matches!(open_parent(root, rel, false, false), Ok(Some(_)))
}

/// What [`scrub_tree`] changed, as relative paths under their names now.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TreeScrub {
    /// Regular files that held a secret, rewritten.
    pub scrubbed: Vec<String>,
    /// Entries whose name held a secret, renamed.
    pub renamed: Vec<String>,
    /// Links whose target held a secret, made again with the target redacted
    /// (the link itself, never what it points to).
    pub relinked: Vec<String>,
}

/// The longest redacted name kept (a numbered suffix and the file system's
/// 255 bytes must fit).
const CLEAN_NAME_MAX: usize = 200;

/// Scrub a whole directory a sandbox wrote (a run's artifacts): walked from
/// directory handles, never through a link, whatever its names and depth.
/// A name that holds a secret is renamed first (the name redacted; made
/// unique with a `-N` suffix when taken), so no later path, error or event
/// carries it; every regular file is then scrubbed streamed, as [`scrub`]
/// does (no size limit, nothing held whole); a link whose target holds a
/// secret is replaced by one to the redacted target. Other entries (FIFOs,
/// devices) are never opened. Anything the walk cannot open is an error,
/// never skipped. Run when no sandbox process is alive. A missing root is
/// an empty one.
pub fn scrub_tree(
    root: &Path,
    redactor: &belay_record::Redactor,
) -> Result<TreeScrub, HostFsError> {
    let mut out = TreeScrub::default();
    if redactor.is_empty() {
        return Ok(out);
    }
    let dir = match rustix::fs::open(root, DIR_FLAGS, Mode::empty()) {
        Ok(d) => d,
        Err(Errno::NOENT) => return Ok(out),
        Err(e) => return Err(io("open", root.to_path_buf(), e)),
    };
    scrub_tree_in(dir, root, Path::new(""), redactor, &mut out)?;
    Ok(out)
}

fn scrub_tree_in(
    dir: OwnedFd,
    root: &Path,
    prefix: &Path,
    redactor: &belay_record::Redactor,
    out: &mut TreeScrub,
) -> Result<(), HostFsError> {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let at = root.join(prefix);
    // A chain of directories a sandbox made deep enough to run out of file
    // handles (two a level) is refused by name, not met as EMFILE.
    if prefix.components().count() >= MAX_RESOLVE_DEPTH {
        return Err(refused(
            &at.to_string_lossy(),
            format!("it is more than {MAX_RESOLVE_DEPTH} directories deep; remove it"),
        ));
    }
    let entries = rustix::fs::Dir::read_from(&dir).map_err(|e| io("list", at.clone(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io("list", at.clone(), e))?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let mut name = OsStr::from_bytes(bytes).to_os_string();
        if let std::borrow::Cow::Owned(clean) = redactor.redact_bytes(bytes) {
            match rename_clean(&dir, bytes, clean, redactor, &at)? {
                Some(new) => name = new,
                None => continue,
            }
            out.renamed
                .push(prefix.join(&name).to_string_lossy().into_owned());
        }
        let rel = prefix.join(&name);
        let shown = rel.to_string_lossy().into_owned();
        let path = root.join(&rel);
        let st = match rustix::fs::statat(&dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(io("stat", path, e)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let sub = rustix::fs::openat(&dir, name.as_os_str(), DIR_FLAGS, Mode::empty())
                    .map_err(|e| not_a_dir(&shown, &path, e))?;
                scrub_tree_in(sub, root, &rel, redactor, out)?;
            }
            FileType::RegularFile => {
                let changed = scrub_at(dir.as_fd(), &name, &shown, &path, redactor)?;
                if changed {
                    out.scrubbed.push(shown);
                }
            }
            FileType::Symlink => {
                let changed = relink_clean(&dir, &name, redactor, &path)?;
                if changed {
                    out.relinked.push(shown);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Rename the entry `old` of `dir` to `clean` (its name with the secrets
/// redacted), made a valid name that holds no secret, with a `-N` suffix
/// when the name is taken (never replacing an entry). The new name; `None`
/// when the entry is gone. `at` is the directory's path, for errors (which
/// never show the old name).
fn rename_clean(
    dir: &OwnedFd,
    old: &[u8],
    clean: Vec<u8>,
    redactor: &belay_record::Redactor,
    at: &Path,
) -> Result<Option<std::ffi::OsString>, HostFsError> {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let old = OsStr::from_bytes(old);
    let mut base: Vec<u8> = clean
        .into_iter()
        .map(|b| if b == b'/' || b == 0 { b'_' } else { b })
        .collect();
    base.truncate(CLEAN_NAME_MAX);
    let holds_secret = |n: &[u8]| matches!(redactor.redact_bytes(n), std::borrow::Cow::Owned(_));
    if base.is_empty() || base == b"." || base == b".." || holds_secret(&base) {
        base = b"[REDACTED]".to_vec();
    }
    for i in 0..1000u32 {
        let mut cand = base.clone();
        if i > 0 {
            cand.extend_from_slice(format!("-{i}").as_bytes());
        }
        if holds_secret(&cand) {
            continue;
        }
        let new = OsStr::from_bytes(&cand);
        let shown = at.join(new);
        match rustix::fs::renameat_with(dir, old, dir, new, rustix::fs::RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(Some(new.to_os_string())),
            Err(Errno::EXIST) | Err(Errno::NOTEMPTY) => continue,
            Err(Errno::NOENT) => return Ok(None),
            // A file system without RENAME_NOREPLACE: look, then rename
            // (no sandbox process is alive to race it).
            Err(Errno::INVAL) => {
                match rustix::fs::statat(dir, new, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(_) => continue,
                    Err(Errno::NOENT) => {}
                    Err(e) => return Err(io("stat", shown, e)),
                }
                return match rustix::fs::renameat(dir, old, dir, new) {
                    Ok(()) => Ok(Some(new.to_os_string())),
                    Err(Errno::NOENT) => Ok(None),
                    Err(e) => Err(io("rename to", shown, e)),
                };
            }
            Err(e) => return Err(io("rename to", shown, e)),
        }
    }
    Err(refused(
        &at.join(OsStr::from_bytes(&base)).to_string_lossy(),
        "a name holding a secret could not be renamed: 1000 names like its redacted one are taken",
    ))
}

/// Replace the link `name` of `dir` by one to its target redacted, when the
/// target holds a secret. Whether it was replaced.
fn relink_clean(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    redactor: &belay_record::Redactor,
    path: &Path,
) -> Result<bool, HostFsError> {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let target = match rustix::fs::readlinkat(dir, name, Vec::new()) {
        Ok(t) => t,
        // Gone, or no longer a link.
        Err(Errno::NOENT) | Err(Errno::INVAL) => return Ok(false),
        Err(e) => return Err(io("read the link", path.to_path_buf(), e)),
    };
    let std::borrow::Cow::Owned(clean) = redactor.redact_bytes(target.to_bytes()) else {
        return Ok(false);
    };
    let clean: Vec<u8> = clean.into_iter().filter(|b| *b != 0).collect();
    let tmp = format!(
        ".belay-link-{}-{:016x}",
        std::process::id(),
        fastrand::u64(..)
    );
    rustix::fs::symlinkat(OsStr::from_bytes(&clean), dir, tmp.as_str())
        .map_err(|e| io("create", path.with_file_name(&tmp), e))?;
    if let Err(e) = rustix::fs::renameat(dir, tmp.as_str(), dir, name) {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
        return Err(io("replace", path.to_path_buf(), e));
    }
    Ok(true)
}

/// The most links one resolution follows (Linux's own limit).
pub const MAX_LINK_HOPS: usize = 40;

/// The most directory levels one resolution holds open.
const MAX_RESOLVE_DEPTH: usize = 256;

/// Where a path of a tree leads, every link on the way followed as the OS
/// would follow it: see [`resolve_in_tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// A path inside the tree, relative to its root, with no link in it (the
    /// empty path is the root itself). Its names need not exist.
    Inside(PathBuf),
    /// It leaves the tree, or cannot be resolved within the limits: why.
    Escapes(&'static str),
}

impl Resolved {
    pub fn escapes(&self) -> bool {
        matches!(self, Resolved::Escapes(_))
    }
}

/// A link's own target, read without following any link on the way: each
/// directory is opened from the one above with `O_NOFOLLOW`, the last name is
/// read relative to its directory. `Ok(None)` when `rel` is no link, is
/// absent, or a parent on the way is missing, a link or no directory (a link
/// there is an entry of its own).
pub fn read_link(root: &Path, rel: &Path) -> Result<Option<PathBuf>, HostFsError> {
    use std::os::unix::ffi::OsStringExt;
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            _ => return Ok(None),
        }
    }
    let Some(last) = names.pop() else {
        return Ok(None);
    };
    let mut dir = rustix::fs::open(root, DIR_FLAGS, Mode::empty())
        .map_err(|e| io("open the tree", root.to_path_buf(), e))?;
    for n in names {
        dir = match rustix::fs::openat(&dir, n, DIR_FLAGS, Mode::empty()) {
            Ok(d) => d,
            Err(_) => return Ok(None),
        };
    }
    match rustix::fs::statat(&dir, last, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {}
        _ => return Ok(None),
    }
    match rustix::fs::readlinkat(&dir, last, Vec::new()) {
        Ok(t) => Ok(Some(PathBuf::from(std::ffi::OsString::from_vec(
            t.into_bytes(),
        )))),
        Err(Errno::NOENT) | Err(Errno::INVAL) => Ok(None),
        Err(e) => Err(io("read the link", root.join(rel), e)),
    }
}

/// Resolve `rel` (relative to `root`) the way the OS would, following every
/// link on the way and the last name's too, in terms of the tree's contents
/// alone: each link is read without following it, relative to a handle on
/// its directory (reached from the root with `O_NOFOLLOW` per level), and
/// its target resolved name by name from there, so the `..` after a link
/// applies to where the link leads, not to its name. Nothing outside the
/// tree is ever looked at.
///
/// [`Resolved::Escapes`]: an absolute link, a `..` above the root, more than
/// [`MAX_LINK_HOPS`] links, or more than 256 directory levels. A missing
/// name, or one that is no directory, with more names after it (where the OS
/// would fail) is taken by name, as if it were a directory: it may be made
/// later, and what follows must not climb out then either.
pub fn resolve_in_tree(root: &Path, rel: &Path) -> Result<Resolved, HostFsError> {
    resolve_in_tree_seeing(root, rel, &mut |_: &Path| {})
}

/// [`resolve_in_tree`], telling `seen` each path (relative to the root) it
/// looks up on the way: a link's resolution depends on those entries only.
pub fn resolve_in_tree_seeing(
    root: &Path,
    rel: &Path,
    seen: &mut dyn FnMut(&Path),
) -> Result<Resolved, HostFsError> {
    use std::os::unix::ffi::OsStringExt;
    enum Step {
        Up,
        Name(std::ffi::OsString),
    }
    /// The steps of `p`, last first (a stack); `None` when `p` is absolute.
    fn steps(p: &Path) -> Option<Vec<Step>> {
        let mut out = Vec::new();
        for c in p.components() {
            match c {
                Component::Normal(n) => out.push(Step::Name(n.to_os_string())),
                Component::ParentDir => out.push(Step::Up),
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return None,
            }
        }
        out.reverse();
        Some(out)
    }
    let Some(mut pending) = steps(rel) else {
        return Ok(Resolved::Escapes("an absolute path"));
    };
    let top = rustix::fs::open(root, DIR_FLAGS, Mode::empty())
        .map_err(|e| io("open the tree", root.to_path_buf(), e))?;
    // The names resolved so far, each with a handle when it is a directory
    // there (below a name without one, nothing exists).
    let mut cur: Vec<(std::ffi::OsString, Option<OwnedFd>)> = Vec::new();
    let mut hops = 0usize;
    while let Some(step) = pending.pop() {
        let name = match step {
            Step::Up => {
                if cur.pop().is_none() {
                    return Ok(Resolved::Escapes("it climbs above the root"));
                }
                continue;
            }
            Step::Name(n) => n,
        };
        let parent = match cur.last() {
            None => Some(&top),
            Some((_, fd)) => fd.as_ref(),
        };
        let Some(parent) = parent else {
            cur.push((name, None));
            continue;
        };
        let here: PathBuf = cur
            .iter()
            .map(|(n, _)| n.as_os_str())
            .chain(std::iter::once(name.as_os_str()))
            .collect();
        seen(&here);
        let kind = match rustix::fs::statat(parent, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(FileType::from_raw_mode(st.st_mode)),
            Err(Errno::NOENT) | Err(Errno::NOTDIR) => None,
            Err(e) => return Err(io("stat", root.join(&here), e)),
        };
        match kind {
            Some(FileType::Symlink) => {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Ok(Resolved::Escapes("it goes through more than 40 links"));
                }
                let target = rustix::fs::readlinkat(parent, name.as_os_str(), Vec::new())
                    .map_err(|e| io("read the link", root.join(&here), e))?;
                let target = PathBuf::from(std::ffi::OsString::from_vec(target.into_bytes()));
                // The target is taken from the link's directory: `cur` as is.
                let Some(more) = steps(&target) else {
                    return Ok(Resolved::Escapes("a link on the way is absolute"));
                };
                pending.extend(more);
            }
            Some(FileType::Directory) => {
                if cur.len() >= MAX_RESOLVE_DEPTH {
                    return Ok(Resolved::Escapes("it goes more than 256 levels deep"));
                }
                let fd = rustix::fs::openat(parent, name.as_os_str(), DIR_FLAGS, Mode::empty())
                    .map_err(|e| match e {
                        Errno::LOOP | Errno::NOTDIR => refused(
                            &here.to_string_lossy(),
                            "it changed while its links were resolved",
                        ),
                        e => io("open", root.join(&here), e),
                    })?;
                cur.push((name, Some(fd)));
            }
            _ => cur.push((name, None)),
        }
    }
    Ok(Resolved::Inside(cur.into_iter().map(|(n, _)| n).collect()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An in-place write keeps the file's inode (what a container's bind
    /// mount over its name is attached to); a file with a second hard link,
    /// or none, is replaced atomically instead (the other name keeps its
    /// content); a link is refused.
    #[test]
    fn a_write_in_place_keeps_the_inode_and_never_writes_through_a_link() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::write(root.join("plan.json"), "old old old\n").unwrap();
        let ino = std::fs::metadata(root.join("plan.json")).unwrap().ino();
        write_in_place(root, "plan.json", b"new\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("plan.json")).unwrap(),
            "new\n"
        );
        assert_eq!(
            std::fs::metadata(root.join("plan.json")).unwrap().ino(),
            ino
        );
        std::fs::hard_link(root.join("plan.json"), root.join("other")).unwrap();
        write_in_place(root, "plan.json", b"newer\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("other")).unwrap(),
            "new\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("plan.json")).unwrap(),
            "newer\n"
        );
        write_in_place(root, "fresh.json", b"x").unwrap();
        assert_eq!(std::fs::read(root.join("fresh.json")).unwrap(), b"x");
        std::fs::write(root.join("target"), "host\n").unwrap();
        std::os::unix::fs::symlink(root.join("target"), root.join("ln")).unwrap();
        assert!(write_in_place(root, "ln", b"x").is_err());
        assert_eq!(
            std::fs::read_to_string(root.join("target")).unwrap(),
            "host\n"
        );
    }

    /// The engines' crates, whose host reads of a work tree must go through
    /// this module.
    const ENGINE_CRATES: [&str; 7] = [
        "belay-env",
        "belay-pipeline",
        "belay-plan",
        "belay-rounds",
        "belay-jobs",
        "belay-ui",
        "belay-agent",
    ];

    /// The CI check: no engine reads a file or a directory with plain
    /// `std::fs`/`fs_err`, unless the line (or one of the two before it) says
    /// why the path is belay's own or the user's and never a tree a sandbox
    /// wrote (`// host-owned: …`). Everything else reads through `hostfs`.
    #[test]
    fn no_engine_reads_with_plain_fs_without_saying_the_path_is_host_owned() {
        let pat = regex::Regex::new(
            r"(std::fs::|fs_err::|\bfs::)(read|read_to_string|read_dir)\(|File::open\(",
        )
        .unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut bad = Vec::new();
        for c in ENGINE_CRATES {
            let mut stack = vec![root.join("crates").join(c).join("src")];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                        continue;
                    }
                    let name = p.file_name().unwrap().to_string_lossy().to_string();
                    if !name.ends_with(".rs") || name.ends_with("tests.rs") {
                        continue;
                    }
                    let text = std::fs::read_to_string(&p).unwrap();
                    let lines: Vec<&str> = text.lines().collect();
                    for (i, l) in lines.iter().enumerate() {
                        // An inline test module ends the engine code; a
                        // `#[cfg(test)] mod x;` declaration does not.
                        if l.starts_with("#[cfg(test)]")
                            && lines.get(i + 1).is_some_and(|n| n.contains('{'))
                        {
                            break;
                        }
                        if l.trim_start().starts_with("//") || !pat.is_match(l) {
                            continue;
                        }
                        let ctx = lines[i.saturating_sub(2)..=i].join(" ");
                        if !ctx.contains("host-owned:") && !ctx.contains("names-only:") {
                            bad.push(format!("{}:{}: {}", p.display(), i + 1, l.trim()));
                        }
                    }
                }
            }
        }
        assert!(
            bad.is_empty(),
            "plain reads in engine code: read through belay_sandbox::hostfs, or add \
             `// host-owned: <why the path is belay's or the user's>` (or `// names-only: …` \
             for a listing whose entries are then read through hostfs):\n{}",
            bad.join("\n")
        );
    }

    #[test]
    fn a_planted_submodule_repository_is_moved_aside_never_through_a_link() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("tree");
        std::fs::create_dir_all(root.join("sub/.git/hooks")).unwrap();
        std::fs::write(root.join("sub/.git/config"), "[core]\n\tfsmonitor = evil\n").unwrap();
        assert_eq!(
            quarantine_git(&root, "sub").unwrap().as_deref(),
            Some("sub/.git.belay-quarantined")
        );
        assert!(!root.join("sub/.git").exists());
        assert!(root.join("sub/.git.belay-quarantined/config").exists());
        std::fs::write(root.join("sub/.git"), "gitdir: ../elsewhere\n").unwrap();
        assert_eq!(
            quarantine_git(&root, "sub").unwrap().as_deref(),
            Some("sub/.git.belay-quarantined-1")
        );
        assert_eq!(quarantine_git(&root, "sub").unwrap(), None);
        // A link on the way is refused, never followed.
        std::fs::create_dir_all(d.path().join("outside/.git")).unwrap();
        std::os::unix::fs::symlink(d.path().join("outside"), root.join("link")).unwrap();
        assert!(quarantine_git(&root, "link").is_err());
        assert!(d.path().join("outside/.git").exists());
        assert!(quarantine_git(&root, "").is_err());
    }

    #[test]
    fn read_in_tree_follows_links_inside_and_never_out() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("repo");
        std::fs::create_dir_all(root.join("requirements")).unwrap();
        std::fs::write(root.join("requirements/base.txt"), "six\n").unwrap();
        std::os::unix::fs::symlink("requirements/base.txt", root.join("requirements.txt")).unwrap();
        std::fs::write(d.path().join("netrc"), "machine x password y").unwrap();
        std::os::unix::fs::symlink(d.path().join("netrc"), root.join("pyproject.toml")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", root.join("setup.cfg")).unwrap();
        assert_eq!(
            read_in_tree(&root, "requirements.txt", 100)
                .unwrap()
                .unwrap(),
            b"six\n".to_vec()
        );
        assert!(read_in_tree(&root, "pyproject.toml", 100).is_err());
        assert!(read_in_tree(&root, "setup.cfg", 100).is_err());
        assert!(read_in_tree(&root, "../netrc", 100).is_err());
        assert_eq!(read_in_tree(&root, "none", 100).unwrap(), None);
    }

    #[test]
    fn read_under_refuses_links_fifos_and_devices_at_once() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("tree");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let canary = d.path().join("host.txt");
        std::fs::write(&canary, "host canary").unwrap();
        std::os::unix::fs::symlink(&canary, root.join("stop")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", root.join("zero")).unwrap();
        std::os::unix::fs::symlink(d.path(), root.join("up")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let t = std::time::Instant::now();
        for name in ["stop", "zero", "fifo", "up/host.txt"] {
            let e = read_under(&root, &root.join(name), 1 << 20).unwrap_err();
            assert!(matches!(e, HostFsError::Refused { .. }), "{name}: {e}");
            assert!(!e.to_string().contains("host canary"));
        }
        // Relative paths are taken under the root.
        assert!(read_under(&root, Path::new("stop"), 10).is_err());
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        // Outside the root: the last name is still never followed.
        std::os::unix::fs::symlink(&canary, d.path().join("outside-link")).unwrap();
        assert!(read_under(&root, &d.path().join("outside-link"), 10).is_err());
        assert_eq!(
            read_under(&root, &canary, 4).unwrap().unwrap(),
            b"host".to_vec()
        );
        std::fs::write(root.join("sub/ok"), "yes").unwrap();
        assert_eq!(
            read_under(&root, &root.join("sub/ok"), 10)
                .unwrap()
                .unwrap(),
            b"yes".to_vec()
        );
        assert_eq!(read_under(&root, &root.join("none"), 10).unwrap(), None);
        assert_eq!(read_under(&root, &d.path().join("none"), 10).unwrap(), None);
    }

    #[test]
    fn links_dot_git_and_escapes_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("ws");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        let outside = d.path().join("secret.txt");
        std::fs::write(&outside, "host secret").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link.txt")).unwrap();
        std::os::unix::fs::symlink(d.path(), root.join("up")).unwrap();
        // Reads do not follow links, in the file or in a parent.
        assert!(read(&root, "link.txt", 100).is_err());
        assert!(read(&root, "up/secret.txt", 100).is_err());
        assert!(read(&root, "../secret.txt", 100).is_err());
        assert_eq!(read(&root, "missing.txt", 100).unwrap(), None);
        assert_eq!(read(&root, "no/such/dir.txt", 100).unwrap(), None);
        // Writes neither follow links nor reach .git, however spelled.
        assert!(write(&root, "link.txt", b"x").is_err());
        assert!(write(&root, "up/secret.txt", b"x").is_err());
        assert!(write(&root, "./.git/config", b"x").is_err());
        assert!(write(&root, "sub/.GIT/hooks/x", b"x").is_err());
        assert!(write(&root, "/etc/passwd", b"x").is_err());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "host secret");
        // A planted temporary name does not redirect the write.
        write(&root, "a/b.txt", b"one").unwrap();
        assert_eq!(read(&root, "./a/b.txt", 100).unwrap().unwrap(), b"one");
        write(&root, "a/b.txt", b"two").unwrap();
        assert_eq!(read(&root, "a/b.txt", 2).unwrap().unwrap(), b"tw");
        // Modes are kept.
        std::fs::set_permissions(
            root.join("a/b.txt"),
            std::os::unix::fs::PermissionsExt::from_mode(0o750),
        )
        .unwrap();
        write(&root, "a/b.txt", b"three").unwrap();
        let m = std::fs::metadata(root.join("a/b.txt")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
            0o750
        );
        // Removing a link removes the link only.
        assert!(remove(&root, "link.txt").unwrap());
        assert!(outside.exists());
        assert!(!remove(&root, "link.txt").unwrap());
        assert!(remove(&root, "a").is_err(), "directories are not removed");
        assert!(!parents_are_dirs(&root, "up/secret.txt"));
        assert!(parents_are_dirs(&root, "a/b.txt"));
    }

    #[test]
    fn scrub_streams_large_files_and_strip_clears_set_id_bits() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let red = belay_record::Redactor::new([("T".to_string(), "tok-0123456789".to_string())]);
        let mut big = vec![b'x'; 70 << 20];
        big.extend_from_slice(b" tok-0123456789 end");
        std::fs::write(root.join("out.md"), &big).unwrap();
        assert!(scrub(root, "out.md", &red).unwrap());
        let after = std::fs::read(root.join("out.md")).unwrap();
        assert_eq!(
            after.len(),
            (70 << 20) + b" [REDACTED:T] end".len(),
            "nothing was cut"
        );
        assert!(after.ends_with(b" [REDACTED:T] end"));
        assert!(
            !scrub(root, "out.md", &red).unwrap(),
            "clean files are left alone"
        );
        std::fs::create_dir_all(root.join("bin/deep")).unwrap();
        std::fs::write(root.join("bin/deep/sh"), "x").unwrap();
        std::fs::set_permissions(
            root.join("bin/deep/sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o4755),
        )
        .unwrap();
        std::os::unix::fs::symlink("/usr/bin/passwd", root.join("bin/link")).unwrap();
        // A name that is not UTF-8, and a deep tree, are not skipped.
        use std::os::unix::ffi::OsStrExt;
        let odd = root.join(std::ffi::OsStr::from_bytes(b"d\xfe"));
        let mut deep = odd.clone();
        for _ in 0..300 {
            deep.push("a");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("sh"), "x").unwrap();
        std::fs::set_permissions(
            deep.join("sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o6755),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("vendor/x/.git")).unwrap();
        let swept = sweep_workspace(root).unwrap();
        assert_eq!(swept.setid_cleared.len(), 2, "{:?}", swept.setid_cleared);
        assert!(swept.setid_cleared.contains(&"bin/deep/sh".to_string()));
        assert_eq!(swept.nested_git, ["vendor/x/.git"]);
        let m = std::fs::metadata(deep.join("sh")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777,
            0o755
        );
        let m = std::fs::metadata(root.join("bin/deep/sh")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777,
            0o755
        );
    }

    /// The attack of finding 2/3: a racer swaps a directory with a link to a
    /// host directory (`renameat2(RENAME_EXCHANGE)`) while belay reads,
    /// writes and deletes under it. Nothing outside may ever be touched.
    #[test]
    fn a_racing_directory_link_swap_never_reaches_outside() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("ws");
        let outside = d.path().join("host-git");
        std::fs::create_dir_all(root.join("x")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("config"), "host config").unwrap();
        std::fs::write(outside.join("victim"), "keep me").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("xl")).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let racer = {
            let stop = stop.clone();
            let root = root.clone();
            std::thread::spawn(move || {
                let dir = rustix::fs::open(&root, DIR_FLAGS, Mode::empty()).unwrap();
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if rustix::fs::renameat_with(
                        &dir,
                        "x",
                        &dir,
                        "xl",
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .is_ok()
                    {
                        swaps += 1;
                    }
                }
                swaps
            })
        };
        let mut landed = 0;
        for i in 0..3000 {
            if write(&root, "x/config", format!("planted {i}").as_bytes()).is_ok() {
                landed += 1;
            }
            let _ = read(&root, "x/victim", 100);
            let _ = remove(&root, "x/victim");
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = racer.join().unwrap();
        assert!(swaps > 1000, "the racer ran ({swaps} swaps)");
        assert!(landed > 0, "some writes went to the real directory");
        assert_eq!(
            std::fs::read_to_string(outside.join("config")).unwrap(),
            "host config"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("victim")).unwrap(),
            "keep me"
        );
        let extra: Vec<_> = std::fs::read_dir(&outside)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(extra.len(), 2, "nothing was created outside: {extra:?}");
    }

    /// The tester's chain: ten levels down, `x` leads to the root and
    /// `passwd` climbs one more `..` from there. Each link alone stays
    /// inside by name; resolved as the OS does, `passwd` leaves the tree.
    #[test]
    fn a_link_chain_out_of_the_tree_escapes() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("repo");
        let deep = "a/b/c/d/e/f/g/h/i/j";
        std::fs::create_dir_all(root.join(deep)).unwrap();
        let up10 = [".."; 10].join("/");
        let up11 = [".."; 11].join("/");
        std::os::unix::fs::symlink(&up10, root.join(deep).join("x")).unwrap();
        std::os::unix::fs::symlink(
            format!("x/{up11}/etc/passwd"),
            root.join(deep).join("passwd"),
        )
        .unwrap();
        let x = PathBuf::from(deep).join("x");
        let passwd = PathBuf::from(deep).join("passwd");
        assert_eq!(
            resolve_in_tree(&root, &x).unwrap(),
            Resolved::Inside(PathBuf::new()),
            "x is the root itself"
        );
        assert!(resolve_in_tree(&root, &passwd).unwrap().escapes());
        assert_eq!(
            read_link(&root, &passwd).unwrap().unwrap(),
            PathBuf::from(format!("x/{up11}/etc/passwd"))
        );
        // What is looked at on the way includes the link `x`.
        let mut seen = Vec::new();
        let _ = resolve_in_tree_seeing(&root, &passwd, &mut |p: &Path| seen.push(p.to_path_buf()))
            .unwrap();
        assert!(seen.contains(&x), "{seen:?}");
    }

    #[test]
    fn links_inside_the_tree_resolve_inside() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("repo");
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(root.join("other")).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        std::fs::write(root.join("other/f"), "x").unwrap();
        // A link to a link inside the tree.
        std::os::unix::fs::symlink("../file", root.join("sub/l2")).unwrap();
        std::os::unix::fs::symlink("sub/l2", root.join("l1")).unwrap();
        assert_eq!(
            resolve_in_tree(&root, Path::new("l1")).unwrap(),
            Resolved::Inside(PathBuf::from("file"))
        );
        // A relative link that climbs and stays inside.
        std::os::unix::fs::symlink("../../other/f", root.join("sub/deeper/rel")).unwrap();
        assert_eq!(
            resolve_in_tree(&root, Path::new("sub/deeper/rel")).unwrap(),
            Resolved::Inside(PathBuf::from("other/f"))
        );
        // `..` after a link applies to where the link leads.
        std::os::unix::fs::symlink("sub/deeper", root.join("dl")).unwrap();
        std::os::unix::fs::symlink("dl/../../file", root.join("via")).unwrap();
        assert_eq!(
            resolve_in_tree(&root, Path::new("via")).unwrap(),
            Resolved::Inside(PathBuf::from("file"))
        );
        // A dangling link inside is inside; a plain file is itself.
        std::os::unix::fs::symlink("sub/none", root.join("dangling")).unwrap();
        assert_eq!(
            resolve_in_tree(&root, Path::new("dangling")).unwrap(),
            Resolved::Inside(PathBuf::from("sub/none"))
        );
        assert_eq!(read_link(&root, Path::new("file")).unwrap(), None);
        assert_eq!(read_link(&root, Path::new("missing/x")).unwrap(), None);
    }

    #[test]
    fn absolute_looping_and_climbing_links_escape() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("repo");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(d.path().join("host.txt"), "host").unwrap();
        // An absolute link, even to a path that does not exist.
        std::os::unix::fs::symlink("/etc/passwd", root.join("abs")).unwrap();
        assert_eq!(
            resolve_in_tree(&root, Path::new("abs")).unwrap(),
            Resolved::Escapes("a link on the way is absolute")
        );
        std::os::unix::fs::symlink("../../host.txt", root.join("sub/up")).unwrap();
        assert!(resolve_in_tree(&root, Path::new("sub/up"))
            .unwrap()
            .escapes());
        // Two links to each other never resolve.
        std::os::unix::fs::symlink("loop2", root.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", root.join("loop2")).unwrap();
        assert!(resolve_in_tree(&root, Path::new("loop1"))
            .unwrap()
            .escapes());
        // A name that is not there yet is taken as a directory: made later,
        // it must not lead out either.
        std::os::unix::fs::symlink("later/../../host.txt", root.join("notyet")).unwrap();
        assert!(resolve_in_tree(&root, Path::new("notyet"))
            .unwrap()
            .escapes());
        // A link through a link to the directory above the root.
        std::os::unix::fs::symlink("..", root.join("parent")).unwrap();
        assert!(resolve_in_tree(&root, Path::new("parent/repo"))
            .unwrap()
            .escapes());
    }

    #[test]
    fn scrub_tree_scrubs_every_file_and_name_and_follows_no_link() {
        use std::os::unix::ffi::OsStrExt;
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("artifacts");
        let secret = "tok-0123456789abcdef";
        let red = belay_record::Redactor::new([("T".to_string(), secret.to_string())]);
        std::fs::create_dir_all(root.join("deep/er")).unwrap();
        std::fs::write(root.join("undeclared.txt"), format!("a {secret} b")).unwrap();
        let mut bin = vec![0u8, 0xff, 0xfe];
        bin.extend_from_slice(secret.as_bytes());
        bin.push(0);
        std::fs::write(root.join("deep/er/x.bin"), &bin).unwrap();
        // A secret in a file's name, in a directory's name, and a name
        // that is not UTF-8; a redacted name that is taken already.
        std::fs::write(root.join(format!("key-{secret}.txt")), "clean").unwrap();
        std::fs::write(root.join("key-[REDACTED:T].txt"), "first").unwrap();
        std::fs::create_dir_all(root.join(format!("dir-{secret}"))).unwrap();
        std::fs::write(root.join(format!("dir-{secret}/in")), secret).unwrap();
        let mut odd = b"\xfe".to_vec();
        odd.extend_from_slice(secret.as_bytes());
        std::fs::write(root.join(std::ffi::OsStr::from_bytes(&odd)), "x").unwrap();
        // Links are never followed; one whose target holds the secret is remade.
        let outside = d.path().join("host.txt");
        std::fs::write(&outside, format!("host {secret}")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
        std::os::unix::fs::symlink(d.path(), root.join("updir")).unwrap();
        std::os::unix::fs::symlink(format!("/tmp/{secret}"), root.join("named")).unwrap();
        let done = scrub_tree(&root, &red).unwrap();
        assert_eq!(
            std::fs::read_to_string(&outside).unwrap(),
            format!("host {secret}"),
            "nothing outside changed"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("undeclared.txt")).unwrap(),
            "a [REDACTED:T] b"
        );
        let x = std::fs::read(root.join("deep/er/x.bin")).unwrap();
        assert!(x.starts_with(&[0, 0xff, 0xfe]) && x.ends_with(b"[REDACTED:T]\0"));
        assert_eq!(
            std::fs::read_to_string(root.join("key-[REDACTED:T].txt")).unwrap(),
            "first",
            "a taken name is never replaced"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("key-[REDACTED:T].txt-1")).unwrap(),
            "clean"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("dir-[REDACTED:T]/in")).unwrap(),
            "[REDACTED:T]"
        );
        assert_eq!(
            std::fs::read_link(root.join("named")).unwrap(),
            PathBuf::from("/tmp/[REDACTED:T]")
        );
        // No name, content or link target under the root holds the secret.
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let name = e.file_name();
                assert!(
                    !name
                        .as_bytes()
                        .windows(secret.len())
                        .any(|w| w == secret.as_bytes()),
                    "{name:?}"
                );
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    stack.push(e.path());
                } else if ft.is_file() {
                    let b = std::fs::read(e.path()).unwrap();
                    assert!(!b.windows(secret.len()).any(|w| w == secret.as_bytes()));
                } else if ft.is_symlink() && e.file_name() != "out" {
                    let t = std::fs::read_link(e.path()).unwrap();
                    assert!(!t.to_string_lossy().contains(secret), "{t:?}");
                }
            }
        }
        assert_eq!(done.renamed.len(), 3, "{done:?}");
        assert!(
            done.scrubbed.contains(&"undeclared.txt".to_string()),
            "{done:?}"
        );
        assert!(
            done.scrubbed.contains(&"deep/er/x.bin".to_string()),
            "{done:?}"
        );
        assert!(
            done.scrubbed.contains(&"dir-[REDACTED:T]/in".to_string()),
            "{done:?}"
        );
        assert_eq!(done.relinked, ["named"]);
        // A second pass finds nothing; a missing root is an empty one.
        assert_eq!(scrub_tree(&root, &red).unwrap(), TreeScrub::default());
        assert_eq!(
            scrub_tree(&d.path().join("none"), &red).unwrap(),
            TreeScrub::default()
        );
    }
}
