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
//! pip, uv and npm lock their own caches, so concurrent builds share them.
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
        Ok(Self { shared, apt_slot })
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
        usage_in(&dir, 0, &mut total);
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

fn usage_in(dir: &std::os::fd::OwnedFd, depth: usize, total: &mut (u64, u64)) {
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
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                if let Ok(sub) =
                    rustix::fs::openat(dir, name, WALK_FLAGS, rustix::fs::Mode::empty())
                {
                    usage_in(&sub, depth + 1, total);
                }
            }
            FileType::RegularFile => {
                total.0 += u64::try_from(st.st_size).unwrap_or(0);
                total.1 += 1;
            }
            _ => {}
        }
    }
}

/// Remove the machine's package caches (`belay env gc --package-caches`).
/// Fails, saying why, while a build holds an apt slot.
pub fn clear(cache_dir: &Path) -> Result<(u64, u64), EnvError> {
    let r = root(cache_dir);
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
