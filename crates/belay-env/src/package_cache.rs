//! The machine's package download caches, mounted into build containers.
//!
//! pip's, uv's, npm's and yarn's download caches live in one directory per
//! machine (`<cache>/packages/shared`), bind-mounted at `/mnt` in every build
//! container and named to the tools by variables of each exec, never of the
//! container. `/mnt` is already in Debian images, so not even a mount point
//! is created (the engine makes missing mount points in the container's own
//! layer when it copies files in): `docker commit` keeps neither the cache
//! nor a variable pointing at it, and neither is part of a cache key.
//!
//! pip, uv and npm lock their own caches, so concurrent builds share them;
//! yarn 1 does not, and its installs take its file mutex in the cache
//! (`--mutex file:…`, see the plan), one at a time.
//! apt does not wait for its archive lock (a second `apt-get` fails with
//! "Could not get lock"), so apt's archives are a small pool of slots: each
//! build holds one slot's lock for its whole run, and concurrent builds take
//! different slots. The slots and their locks are outside what any container
//! sees: a container that could write `apt/1 -> /` would have the next build
//! bind-mount the host's root. Cargo's registry is not shared: it is where the offline
//! test build reads the project's crates, so it stays in the image.
//!
//! A shared cache is a channel between builds: what one build writes there,
//! the next one installs. Build repositories you do not trust with
//! `--no-package-cache`.
//!
//! The caches are bounded: when a build that used them ends and they hold
//! more than the cap (`BELAY_PACKAGE_CACHE_MAX`, default 10 GiB; `0` for no
//! cap), the least recently used files go until they are under 80% of it,
//! as `uv cache prune` and npm's cache verification do for their own. A
//! trim runs only while no build uses the caches (every build holds
//! `use.lock` shared; a trim takes it exclusive, without waiting), so no
//! build reads a file while it goes; the next build's end trims instead.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use belay_sandbox::Mount;

use crate::EnvError;

/// Where the caches appear in build containers.
pub const MOUNT_ROOT: &str = "/mnt";
/// apt's archive directory in Debian images.
const APT_ARCHIVES: &str = "/var/cache/apt/archives";
/// How many builds can share apt's archives at once.
const APT_SLOTS: usize = 4;

/// One tool's cache: its directory under `<cache>/packages`, where it is
/// mounted, and the variable that points the tool at it.
struct ToolCache {
    dir: &'static str,
    var: &'static str,
}

const TOOLS: &[ToolCache] = &[
    ToolCache {
        dir: "pip",
        var: "PIP_CACHE_DIR",
    },
    ToolCache {
        dir: "uv",
        var: "UV_CACHE_DIR",
    },
    ToolCache {
        dir: "npm",
        var: "npm_config_cache",
    },
    ToolCache {
        dir: "yarn",
        var: "YARN_CACHE_FOLDER",
    },
];

/// The caches one build uses, and its apt slot (held until dropped).
#[derive(Debug)]
pub struct PackageCaches {
    /// `<cache>/packages/shared`: the part containers see.
    shared: PathBuf,
    apt_slot: Option<(PathBuf, std::fs::File)>,
    /// `use.lock`, held shared while the build runs (a trim waits for none).
    in_use: Option<std::fs::File>,
    cache_dir: PathBuf,
}

/// The default cap of the package caches.
pub const DEFAULT_MAX_BYTES: u64 = 10 << 30;
/// What a trim brings the caches down to, in percent of the cap.
const TRIM_TO_PERCENT: u64 = 80;
/// How often a build's end may walk the caches to trim them.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// The tools whose cache entries are directories (uv's unpacked wheels,
/// yarn's unpacked packages) that must go whole: neither tool checks that
/// every file of an entry is still there.
const WHOLE_ENTRY_TOOLS: &[&str] = &["uv", "yarn"];

/// The cap: `BELAY_PACKAGE_CACHE_MAX` (bytes, or with a K, M, G or T
/// suffix; `0`: none), else [`DEFAULT_MAX_BYTES`]. A value that does not
/// parse is an error naming it.
pub fn max_bytes() -> Result<Option<u64>, EnvError> {
    match std::env::var("BELAY_PACKAGE_CACHE_MAX") {
        Err(_) => Ok(Some(DEFAULT_MAX_BYTES)),
        Ok(v) if v.trim().is_empty() => Ok(Some(DEFAULT_MAX_BYTES)),
        Ok(v) => match parse_size(&v) {
            Some(0) => Ok(None),
            Some(n) => Ok(Some(n)),
            None => Err(EnvError::Usage(format!(
                "BELAY_PACKAGE_CACHE_MAX={v:?} is no size: give bytes or a number with K, M, G or T (10G), or 0 for no cap"
            ))),
        },
    }
}

/// `10G`, `512M`, `2048` (bytes), `1.5T`, `10GiB`, `10GB`.
pub fn parse_size(v: &str) -> Option<u64> {
    let t = v.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (num, mult) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 1u64 << 10),
        'M' => (&t[..t.len() - 1], 1 << 20),
        'G' => (&t[..t.len() - 1], 1 << 30),
        'T' => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: f64 = num.trim().parse().ok()?;
    (n.is_finite() && n >= 0.0).then_some((n * mult as f64) as u64)
}

/// `<cache>/packages`.
pub fn root(cache_dir: &Path) -> PathBuf {
    cache_dir.join("packages")
}

impl PackageCaches {
    /// Create the cache directories and take a free apt slot (none when every
    /// slot is held: that build downloads its `.deb`s itself).
    pub fn open(cache_dir: &Path) -> Result<Self, EnvError> {
        let root = root(cache_dir);
        let shared = root.join("shared");
        fs_err::create_dir_all(&root).map_err(|e| EnvError::io("cannot create", &root, e))?;
        let use_path = root.join("use.lock");
        let in_use = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&use_path)
            .map_err(|e| EnvError::io("cannot open", &use_path, e))?;
        // Shared: builds run side by side; a trim waits for no build. A
        // trim in progress makes this wait until it ends.
        rustix::fs::flock(&in_use, rustix::fs::FlockOperation::LockShared)
            .map_err(|e| EnvError::io("cannot lock", &use_path, e.into()))?;
        for t in TOOLS {
            let d = shared.join(t.dir);
            fs_err::create_dir_all(&d).map_err(|e| EnvError::io("cannot create", &d, e))?;
        }
        let mut apt_slot = None;
        for i in 0..APT_SLOTS {
            let dir = root.join("apt").join(i.to_string());
            fs_err::create_dir_all(dir.join("partial"))
                .map_err(|e| EnvError::io("cannot create", &dir, e))?;
            let lock_path = root.join("apt").join(format!("{i}.lock"));
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| EnvError::io("cannot open", &lock_path, e))?;
            if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
                apt_slot = Some((dir, f));
                break;
            }
        }
        Ok(Self {
            shared,
            apt_slot,
            in_use: Some(in_use),
            cache_dir: cache_dir.to_path_buf(),
        })
    }

    /// The bind mounts of a build container.
    pub fn mounts(&self) -> Vec<Mount> {
        let mut m = vec![Mount {
            host: self.shared.clone(),
            container: MOUNT_ROOT.into(),
            read_only: false,
        }];
        if let Some((dir, _)) = &self.apt_slot {
            m.push(Mount {
                host: dir.clone(),
                container: APT_ARCHIVES.into(),
                read_only: false,
            });
        }
        m
    }

    /// The variables of each exec that point the tools at their caches.
    pub fn exec_env(&self) -> Vec<(String, String)> {
        TOOLS
            .iter()
            .map(|t| (t.var.to_string(), format!("{MOUNT_ROOT}/{}", t.dir)))
            .collect()
    }

    pub fn has_apt(&self) -> bool {
        self.apt_slot.is_some()
    }
}

/// The BuildKit cache mounts and variables a written Dockerfile's `RUN`
/// gives each block, for the same effect as belay's own mounts: the caches
/// live in the builder, never in a layer.
pub fn buildkit_run_prefix() -> String {
    let mut s = String::from("RUN");
    for t in TOOLS {
        s.push_str(&format!(
            " --mount=type=cache,id=belay-{d},target={MOUNT_ROOT}/{d} \\\n   ",
            d = t.dir
        ));
    }
    // apt waits for no lock of its own: one build at a time in the archive.
    s.push_str(&format!(
        " --mount=type=cache,id=belay-apt,target={APT_ARCHIVES},sharing=locked \\\n   "
    ));
    for t in TOOLS {
        s.push_str(&format!(" {}={MOUNT_ROOT}/{}", t.var, t.dir));
    }
    s
}

/// Bytes and files under the machine's package caches (for `belay env gc`).
/// Build containers write these caches (`/mnt`, apt's archives), so the walk
/// goes from directory handles and never through a link: a directory that a
/// build swapped for a link to `/` is not followed, then or mid-walk.
pub fn usage(cache_dir: &Path) -> (u64, u64) {
    let mut total = (0u64, 0u64);
    if let Ok(dir) = rustix::fs::open(root(cache_dir), WALK_FLAGS, rustix::fs::Mode::empty()) {
        walk(&dir, Path::new(""), 0, &mut |_, st| {
            total.0 += u64::try_from(st.st_size).unwrap_or(0);
            total.1 += 1;
        });
    }
    total
}

/// How the walk opens a directory: never through a link.
const WALK_FLAGS: rustix::fs::OFlags = rustix::fs::OFlags::RDONLY
    .union(rustix::fs::OFlags::DIRECTORY)
    .union(rustix::fs::OFlags::NOFOLLOW)
    .union(rustix::fs::OFlags::CLOEXEC);

/// Deeper than this, a cache is not counted (a build can nest directories
/// without bound; each level holds a handle).
const WALK_MAX_DEPTH: usize = 64;

/// Every regular file under `dir` (reached from directory handles, never
/// through a link), with its path relative to where the walk began.
fn walk(
    dir: &std::os::fd::OwnedFd,
    rel: &Path,
    depth: usize,
    on_file: &mut dyn FnMut(&Path, &rustix::fs::Stat),
) {
    use rustix::fs::{AtFlags, FileType};
    if depth > WALK_MAX_DEPTH {
        return;
    }
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let Ok(st) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let path = rel.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                if let Ok(sub) =
                    rustix::fs::openat(dir, name, WALK_FLAGS, rustix::fs::Mode::empty())
                {
                    walk(&sub, &path, depth + 1, on_file);
                }
            }
            FileType::RegularFile => on_file(&path, &st),
            _ => {}
        }
    }
}

/// The build is done with the caches: its locks go, and the caches are
/// trimmed to the cap when no other build uses them (whichever way the
/// build ended).
impl Drop for PackageCaches {
    fn drop(&mut self) {
        self.apt_slot = None;
        self.in_use = None;
        // The walk costs a second or two on a big cache: at most one every
        // ten minutes.
        let stamp = root(&self.cache_dir).join("trimmed-at");
        let recent = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < TRIM_EVERY);
        if recent {
            return;
        }
        match max_bytes() {
            Ok(Some(max)) => {
                let _ = std::fs::write(&stamp, b"");
                if let Err(e) = trim(&self.cache_dir, max) {
                    tracing::warn!("the package caches are not trimmed: {e}");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("the package caches are not trimmed: {e}"),
        }
    }
}

/// One entry of the caches, for the trim: a file, or a directory that goes
/// whole; where it is and when it was last used (the later of access and
/// modification times, of any file in it).
struct Entry {
    rel: PathBuf,
    size: u64,
    used: i64,
    dir: bool,
}

/// Bring the caches under `TRIM_TO_PERCENT`% of `max` when they are over
/// `max`, least recently used first, while no build uses them (else
/// nothing: the next build's end trims). Never follows a link. What was
/// removed (bytes, files), when anything was.
pub fn trim(cache_dir: &Path, max: u64) -> Result<Option<(u64, u64)>, EnvError> {
    let r = root(cache_dir);
    let use_path = r.join("use.lock");
    let Ok(lock) = std::fs::OpenOptions::new().write(true).open(&use_path) else {
        return Ok(None);
    };
    if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Ok(None);
    }
    let Ok(dir) = rustix::fs::open(&r, WALK_FLAGS, rustix::fs::Mode::empty()) else {
        return Ok(None);
    };
    // What an earlier trim left to delete.
    let _ = fs_err::remove_dir_all(r.join("shared").join(TRASH));
    let mut entries = collect(&dir);
    let total: u64 = entries.iter().map(|e| e.size).sum();
    if total <= max {
        return Ok(None);
    }
    let target = max / 100 * TRIM_TO_PERCENT;
    entries.sort_by_key(|e| e.used);
    let (mut left, mut bytes, mut files) = (total, 0u64, 0u64);
    for e in entries {
        if left <= target {
            break;
        }
        let gone = if e.dir {
            trash_below(&dir, &r, &e.rel)
        } else {
            unlink_below(&dir, &e.rel)
        };
        if gone {
            left -= e.size;
            bytes += e.size;
            files += 1;
        }
    }
    tracing::info!(
        "package caches over {:.1} GiB: removed {files} least recently used file(s), {:.1} GiB",
        max as f64 / f64::from(1u32 << 30),
        bytes as f64 / f64::from(1u32 << 30)
    );
    Ok(Some((bytes, files)))
}

/// The entries under `dir` (not the locks): each file, or, for a tool
/// whose entries are directories, each entry directory whole, with the size
/// of its files and the last use of any of them.
fn collect(dir: &std::os::fd::OwnedFd) -> Vec<Entry> {
    let mut by_unit: std::collections::BTreeMap<PathBuf, Entry> = Default::default();
    walk(dir, Path::new(""), 0, &mut |path, st| {
        let comps: Vec<&std::ffi::OsStr> = path.iter().collect();
        if comps.len() <= 2 && path.extension().is_some_and(|x| x == "lock") {
            return;
        }
        let unit: PathBuf = comps.iter().take(4).collect();
        let (rel, dir) = if comps.len() > 4 && whole_entry(&unit) {
            (unit, true)
        } else {
            (path.to_path_buf(), false)
        };
        let e = by_unit.entry(rel.clone()).or_insert(Entry {
            rel,
            size: 0,
            used: i64::MIN,
            dir,
        });
        e.size += u64::try_from(st.st_size).unwrap_or(0);
        e.used = e.used.max(st.st_atime.max(st.st_mtime));
    });
    by_unit.into_values().collect()
}

/// Where a trim moves whole entries before deleting them (under `shared/`,
/// the same file system): an entry is gone from its tool at once, and a
/// delete cut short leaves only trash, removed by the next trim.
const TRASH: &str = ".belay-trash";

/// `shared/<tool>/<bucket>/<entry>` of a tool whose entries go whole.
fn whole_entry(rel: &Path) -> bool {
    let c: Vec<&std::ffi::OsStr> = rel.iter().collect();
    c.len() == 4 && c[0] == "shared" && WHOLE_ENTRY_TOOLS.iter().any(|t| c[1] == *t)
}

/// Move the directory `rel` below `root` into the trash (opening each
/// directory on the way without following a link), then delete it.
fn trash_below(root: &std::os::fd::OwnedFd, root_path: &Path, rel: &Path) -> bool {
    let comps: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let Some((last, dirs)) = comps.split_last() else {
        return false;
    };
    let mut cur: Option<std::os::fd::OwnedFd> = None;
    for d in dirs {
        let base = cur.as_ref().unwrap_or(root);
        match rustix::fs::openat(base, *d, WALK_FLAGS, rustix::fs::Mode::empty()) {
            Ok(fd) => cur = Some(fd),
            Err(_) => return false,
        }
    }
    let trash = root_path.join("shared").join(TRASH);
    if fs_err::create_dir_all(&trash).is_err() {
        return false;
    }
    let Ok(trash_fd) = rustix::fs::open(&trash, WALK_FLAGS, rustix::fs::Mode::empty()) else {
        return false;
    };
    let name = format!("{:016x}", fastrand::u64(..));
    let base = cur.as_ref().unwrap_or(root);
    if rustix::fs::renameat(base, *last, &trash_fd, name.as_str()).is_err() {
        return false;
    }
    let _ = fs_err::remove_dir_all(trash.join(&name));
    true
}

/// Remove `rel` below `root`, opening each directory on the way without
/// following a link.
fn unlink_below(root: &std::os::fd::OwnedFd, rel: &Path) -> bool {
    let comps: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let Some((file, dirs)) = comps.split_last() else {
        return false;
    };
    let mut cur: Option<std::os::fd::OwnedFd> = None;
    for d in dirs {
        let base = cur.as_ref().unwrap_or(root);
        match rustix::fs::openat(base, *d, WALK_FLAGS, rustix::fs::Mode::empty()) {
            Ok(fd) => cur = Some(fd),
            Err(_) => return false,
        }
    }
    let base = cur.as_ref().unwrap_or(root);
    rustix::fs::unlinkat(base, *file, rustix::fs::AtFlags::empty()).is_ok()
}

/// Remove the machine's package caches (`belay env gc --package-caches`).
/// Fails, saying why, while a build holds an apt slot.
pub fn clear(cache_dir: &Path) -> Result<(u64, u64), EnvError> {
    let r = root(cache_dir);
    // Every build holds use.lock shared (an apt slot is not every build's).
    let use_path = r.join("use.lock");
    let _in_use = match std::fs::OpenOptions::new().write(true).open(&use_path) {
        Ok(f) => {
            if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err()
            {
                return Err(EnvError::Usage(format!(
                    "a build is using the package caches ({} is locked); clear them when no build runs",
                    use_path.display()
                )));
            }
            Some(f)
        }
        Err(_) => None,
    };
    for i in 0..APT_SLOTS {
        let lock_path = r.join("apt").join(format!("{i}.lock"));
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(&lock_path) else {
            continue;
        };
        if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(EnvError::Usage(format!(
                "a build is using the package caches ({} is locked); clear them when no build runs",
                lock_path.display()
            )));
        }
    }
    let used = usage(cache_dir);
    if r.exists() {
        fs_err::remove_dir_all(&r).map_err(|e| EnvError::io("cannot remove", &r, e))?;
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_builds_take_different_apt_slots() {
        let d = tempfile::tempdir().unwrap();
        let a = PackageCaches::open(d.path()).unwrap();
        let b = PackageCaches::open(d.path()).unwrap();
        let slot = |c: &PackageCaches| {
            c.mounts()
                .into_iter()
                .find(|m| m.container == APT_ARCHIVES)
                .map(|m| m.host)
        };
        assert_ne!(slot(&a), slot(&b));
        assert!(slot(&a).is_some() && slot(&b).is_some());
        // Every slot held: the next build goes without an apt cache.
        let rest: Vec<PackageCaches> = (2..APT_SLOTS)
            .map(|_| PackageCaches::open(d.path()).unwrap())
            .collect();
        let none = PackageCaches::open(d.path()).unwrap();
        assert!(!none.has_apt());
        // A slot is free again once its build ends.
        drop(rest);
        assert!(PackageCaches::open(d.path()).unwrap().has_apt());
        // Clearing refuses while a build holds a slot.
        assert!(clear(d.path()).is_err());
        drop((a, b, none));
        clear(d.path()).unwrap();
        assert!(!root(d.path()).exists());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("10G"), Some(10 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("2048"), Some(2048));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("10gb"), Some(10 << 30));
        assert_eq!(parse_size("1X"), None);
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("ten"), None);
        assert_eq!(parse_size("-1G"), None);
    }

    #[test]
    fn a_trim_takes_the_least_recently_used_and_waits_for_no_build() {
        let d = tempfile::tempdir().unwrap();
        let c = PackageCaches::open(d.path()).unwrap();
        let shared = root(d.path()).join("shared");
        // Ten files of 100 KiB, used one after another (oldest first).
        for i in 0..10 {
            let f = shared.join("npm").join(format!("f{i}"));
            std::fs::write(&f, vec![0u8; 100 << 10]).unwrap();
            let t =
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i);
            let file = std::fs::File::options().write(true).open(&f).unwrap();
            file.set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t))
                .unwrap();
        }
        // A link a build left to a host file is never followed nor counted.
        let outside = d.path().join("host-file");
        std::fs::write(&outside, vec![1u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink(&outside, shared.join("pip").join("link")).unwrap();
        // While a build uses the caches, nothing goes.
        assert_eq!(trim(d.path(), 500 << 10).unwrap(), None);
        assert!((0..10).all(|i| shared.join("npm").join(format!("f{i}")).exists()));
        // Once it is done (its end trims to the default cap, far above
        // 1 MiB), a trim brings them to 80% of the cap: the six oldest go.
        drop(c);
        assert!((0..10).all(|i| shared.join("npm").join(format!("f{i}")).exists()));
        assert_eq!(trim(d.path(), 500 << 10).unwrap(), Some((600 << 10, 6)));
        let left: Vec<String> = (0..10)
            .filter(|i| shared.join("npm").join(format!("f{i}")).exists())
            .map(|i| format!("f{i}"))
            .collect();
        assert_eq!(left, ["f6", "f7", "f8", "f9"]);
        assert!(outside.exists(), "a file outside the caches went");
        // Under the cap: nothing to do.
        assert_eq!(trim(d.path(), 500 << 10).unwrap(), None);
        // uv's unpacked wheels go whole, by the newest file in them: the old
        // entry goes, every file of it; the new one stays whole.
        let uv = shared.join("uv").join("archive-v0");
        for (entry, secs) in [("old", 1_000u64), ("new", 9_000_000_000)] {
            let e = uv.join(entry).join("pkg");
            std::fs::create_dir_all(&e).unwrap();
            for f in ["__init__.py", "core.py"] {
                let p = e.join(f);
                std::fs::write(&p, vec![0u8; 200 << 10]).unwrap();
                let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
                let file = std::fs::File::options().write(true).open(&p).unwrap();
                file.set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t))
                    .unwrap();
            }
        }
        let (_, n) = trim(d.path(), 1100 << 10).unwrap().unwrap();
        assert_eq!(n, 1, "one entry went");
        assert!(!uv.join("old").exists(), "the old entry is not whole gone");
        assert!(uv.join("new/pkg/__init__.py").exists() && uv.join("new/pkg/core.py").exists());
    }

    #[test]
    fn the_tools_are_pointed_at_the_mounts() {
        let d = tempfile::tempdir().unwrap();
        let c = PackageCaches::open(d.path()).unwrap();
        let env = c.exec_env();
        assert!(env.contains(&("PIP_CACHE_DIR".into(), "/mnt/pip".into())));
        assert!(env.contains(&("UV_CACHE_DIR".into(), "/mnt/uv".into())));
        for (_, path) in &env {
            let dir = path.trim_start_matches("/mnt/");
            assert!(root(d.path()).join("shared").join(dir).is_dir(), "{path}");
        }
        assert_eq!(c.mounts()[0].container, "/mnt");
        // What containers can write holds no slot and no lock.
        assert!(!c.mounts()[0].host.join("apt").exists());
        assert!(c.mounts()[1].host.starts_with(root(d.path()).join("apt")));
    }
}
