//! Host-side access to a workspace that sandboxes can write.
//!
//! A step's container writes the bind-mounted workspace; belay then reads and
//! writes files there on the host (artifacts, shared files, the built-in
//! agent's edits). Anything in the workspace may have been planted by the
//! sandbox, so these functions never follow a symlink, never leave the root,
//! and never touch `.git` when writing: a link to `~/.ssh/id_rsa` or a
//! `.git/config` with a filter would otherwise reach the host.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

fn nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// The path of `rel` under `root`, every parent a real directory (created when
/// `create` is set; else `Ok(None)` when one is missing). Errors name what is
/// refused.
pub fn resolve(
    root: &Path,
    rel: &str,
    create: bool,
    writing: bool,
) -> Result<Option<PathBuf>, String> {
    let mut names = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            _ => return Err(format!("`{rel}` is not a path inside the workspace")),
        }
    }
    let Some((last, parents)) = names.split_last() else {
        return Err(format!("`{rel}` names no file"));
    };
    if writing && names.iter().any(|n| *n == ".git") {
        return Err("git's own files are not writable from the sandbox".into());
    }
    let mut dir = root.to_path_buf();
    for n in parents {
        dir.push(n);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "{} is a symlink; belay does not go through links",
                    dir.display()
                ))
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{} is not a directory", dir.display())),
            Err(_) if create => std::fs::create_dir(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        }
    }
    Ok(Some(dir.join(last)))
}

/// Read a regular file (not a link), at most `max` bytes. `Ok(None)` when absent.
pub fn read(root: &Path, rel: &str, max: u64) -> Result<Option<Vec<u8>>, String> {
    let Some(path) = resolve(root, rel, false, false)? else {
        return Ok(None);
    };
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(nofollow())
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "cannot read {} (belay does not read through links): {e}",
                path.display()
            ))
        }
    };
    let meta = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut out = Vec::with_capacity(meta.len().min(max) as usize);
    f.take(max)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(Some(out))
}

/// Write a file atomically (a fresh temporary file, then a rename that
/// replaces a link rather than following it). An existing file keeps its mode.
pub fn write(root: &Path, rel: &str, content: &[u8]) -> Result<(), String> {
    let path = resolve(root, rel, true, true)?
        .ok_or_else(|| format!("`{rel}`: a parent directory could not be made"))?;
    let mode = match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(format!(
                "{} is a symlink; belay does not write through links",
                path.display()
            ))
        }
        Ok(m) if !m.is_file() => return Err(format!("{} is not a regular file", path.display())),
        Ok(m) => Some(std::os::unix::fs::PermissionsExt::mode(&m.permissions())),
        Err(_) => None,
    };
    let dir = path.parent().unwrap_or(root);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".{name}.belay-{}-{nonce}", std::process::id()));
    let result = (|| {
        let mut f: File = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nofollow())
            .open(&tmp)
            .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        f.write_all(content)
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        if let Some(m) = mode {
            f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(m))
                .map_err(|e| format!("cannot set the mode of {}: {e}", tmp.display()))?;
        }
        f.sync_all()
            .map_err(|e| format!("cannot sync {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("cannot replace {}: {e}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Delete a file (a link itself, never its target). Whether there was one.
pub fn remove(root: &Path, rel: &str) -> Result<bool, String> {
    let Some(path) = resolve(root, rel, false, true)? else {
        return Ok(false);
    };
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => Err(format!("{} is a directory", path.display())),
        Ok(_) => std::fs::remove_file(&path)
            .map(|_| true)
            .map_err(|e| format!("cannot delete {}: {e}", path.display())),
        Err(_) => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
        // Writes neither follow links nor reach .git, however spelled.
        assert!(write(&root, "link.txt", b"x").is_err());
        assert!(write(&root, "up/secret.txt", b"x").is_err());
        assert!(write(&root, "./.git/config", b"x").is_err());
        assert!(write(&root, "sub/.git/hooks/x", b"x").is_err());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "host secret");
        // A planted temporary name does not redirect the write.
        write(&root, "a/b.txt", b"one").unwrap();
        assert_eq!(read(&root, "./a/b.txt", 100).unwrap().unwrap(), b"one");
        write(&root, "a/b.txt", b"two").unwrap();
        assert_eq!(read(&root, "a/b.txt", 2).unwrap().unwrap(), b"tw");
        // Removing a link removes the link only.
        assert!(remove(&root, "link.txt").unwrap());
        assert!(outside.exists());
        assert!(!remove(&root, "link.txt").unwrap());
    }
}
