//! The checkpoint cache.
//!
//! A checkpoint is reusable when it was made from the same parent image (by
//! image id, so a changed parent changes every key after it) by the same block
//! script and validation under the same container environment. Keys are stored
//! as labels on checkpoint images, so the cache lives on the engine and `docker
//! rmi` / `belay env gc` are its eviction.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::EnvError;

const VERSION: &str = "belay-cache-v1";
/// The key a checkpoint was made under.
pub const KEY_LABEL: &str = "belay.cache.key";
/// For a repaired checkpoint: the key of the unpatched script, so that a new
/// run planning the same original script finds it.
pub const ALT_LABEL: &str = "belay.cache.alt";
/// For a repaired checkpoint: the patched script (hex), adopted on a hit.
pub const SCRIPT_LABEL: &str = "belay.cache.script";
/// On a toolchain checkpoint: the scope (a batch, or a run) it was made in,
/// which `--no-cache` lookups still see (`build/toolchain.rs`).
pub const SCOPE_LABEL: &str = "belay.cache.scope";
/// On a workspace checkpoint (and so on every checkpoint above it): the
/// blocks laid under the repository copy, comma-separated.
pub const UNDER_WORKSPACE_LABEL: &str = "belay.under-workspace";

fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(VERSION.as_bytes());
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    hex::encode(h.finalize())
}

pub fn block_key(
    parent_image_id: &str,
    block_id: &str,
    script: &str,
    validation: &str,
    env: &str,
) -> String {
    digest(&["block", parent_image_id, block_id, script, validation, env])
}

pub fn workspace_key(base_image_id: &str, tree: &str, env: &str) -> String {
    digest(&["workspace", base_image_id, tree, env])
}

/// What the container sees besides the image: trust files, proxies, network.
pub fn env_fingerprint(
    env: &[(String, String)],
    files: &[(String, Vec<u8>, u32)],
    network: &str,
) -> String {
    let mut h = Sha256::new();
    for (k, v) in env {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    for (p, content, mode) in files {
        h.update(p.as_bytes());
        h.update(mode.to_le_bytes());
        h.update(Sha256::digest(content));
    }
    h.update(network.as_bytes());
    hex::encode(h.finalize())
}

/// A content hash of the repository as it is copied into the container: paths,
/// modes, symlink targets and file contents, in a fixed order.
pub fn tree_hash(root: &Path, excluded: &[String]) -> Result<String, EnvError> {
    let mut h = Sha256::new();
    let mut stack = vec![PathBuf::new()];
    let mut buf = vec![0u8; 64 * 1024];
    while let Some(rel) = stack.pop() {
        let abs = root.join(&rel);
        let meta =
            fs_err::symlink_metadata(&abs).map_err(|e| EnvError::io("cannot read", &abs, e))?;
        h.update(rel.to_string_lossy().as_bytes());
        h.update([0]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            h.update(meta.permissions().mode().to_le_bytes());
        }
        if meta.file_type().is_symlink() {
            // host-owned: the user's repository; builds get a copy, never a mount.
            let t =
                fs_err::read_link(&abs).map_err(|e| EnvError::io("cannot read link", &abs, e))?;
            h.update(t.to_string_lossy().as_bytes());
        } else if meta.is_dir() {
            // host-owned: the user's repository; builds get a copy, never a mount.
            let mut entries: Vec<PathBuf> = fs_err::read_dir(&abs)
                .map_err(|e| EnvError::io("cannot list", &abs, e))?
                .filter_map(|e| e.ok())
                .map(|e| rel.join(e.file_name()))
                .filter(|r| !excluded.iter().any(|x| r.starts_with(x)))
                .collect();
            entries.sort();
            entries.reverse();
            stack.extend(entries);
        } else if meta.is_file() {
            hash_file(&mut h, &abs, &mut buf)?;
        }
        h.update([0xff]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Feed a file's content to `h`, a buffer at a time.
/// Callers pass host-owned files only (the user's repository, belay's binary).
pub(crate) fn hash_file(h: &mut Sha256, path: &Path, buf: &mut [u8]) -> Result<(), EnvError> {
    // host-owned: the user's repository (copied into builds, never mounted) or belay's binary.
    let mut f = std::fs::File::open(path).map_err(|e| EnvError::io("cannot read", path, e))?;
    loop {
        let n = f
            .read(buf)
            .map_err(|e| EnvError::io("cannot read", path, e))?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_every_input() {
        let k = block_key("sha256:a", "10-x", "script", "true", "env");
        assert_eq!(k, block_key("sha256:a", "10-x", "script", "true", "env"));
        for other in [
            block_key("sha256:b", "10-x", "script", "true", "env"),
            block_key("sha256:a", "10-y", "script", "true", "env"),
            block_key("sha256:a", "10-x", "script2", "true", "env"),
            block_key("sha256:a", "10-x", "script", "false", "env"),
            block_key("sha256:a", "10-x", "script", "true", "env2"),
            // Length-prefixing: moving a boundary changes the key.
            block_key("sha256:a", "10-xs", "cript", "true", "env"),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn tree_hash_sees_content_modes_and_exclusions() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src")).unwrap();
        std::fs::write(d.path().join("src/a.py"), "x = 1\n").unwrap();
        std::fs::create_dir_all(d.path().join(".belay/runs")).unwrap();
        let ex = vec![".belay".to_string()];
        let h1 = tree_hash(d.path(), &ex).unwrap();
        std::fs::write(d.path().join(".belay/runs/log"), "noise").unwrap();
        assert_eq!(
            h1,
            tree_hash(d.path(), &ex).unwrap(),
            "excluded paths must not matter"
        );
        std::fs::write(d.path().join("src/a.py"), "x = 2\n").unwrap();
        let h2 = tree_hash(d.path(), &ex).unwrap();
        assert_ne!(h1, h2);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            d.path().join("src/a.py"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        assert_ne!(h2, tree_hash(d.path(), &ex).unwrap());
    }
}
