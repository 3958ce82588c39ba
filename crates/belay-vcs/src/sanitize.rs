//! The view of `.git/config` that sandboxes get: an allowlist of the keys a
//! git in the sandbox needs (the repository format and extensions, remotes
//! and branches, the identity), remote URLs without their credentials.
//! Nothing else is copied: a proxy's password, a mail password, a credential
//! helper, an `extraheader`, an `insteadOf` with a token never reach it.

use std::path::Path;

use crate::{Git, VcsError};

pub(crate) use belay_record::without_userinfo as strip_userinfo;

/// Whether the sandbox's copy keeps `key` (lower case but for subsections).
fn allowed(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    let (section, rest) = lower.split_once('.').unwrap_or((lower.as_str(), ""));
    let var = rest.rsplit('.').next().unwrap_or("");
    let has_sub = rest.contains('.');
    match section {
        "core" => {
            matches!(
                var,
                "repositoryformatversion"
                    | "filemode"
                    | "bare"
                    | "logallrefupdates"
                    | "ignorecase"
                    | "precomposeunicode"
                    | "symlinks"
                    | "autocrlf"
                    | "eol"
                    | "safecrlf"
                    | "quotepath"
                    | "sparsecheckout"
                    | "sparsecheckoutcone"
            ) && !has_sub
        }
        "extensions" | "index" | "feature" => !has_sub,
        "remote" => has_sub && matches!(var, "url" | "pushurl" | "fetch" | "push"),
        "branch" => has_sub && matches!(var, "remote" | "merge" | "rebase" | "pushremote"),
        "submodule" => has_sub && matches!(var, "url" | "active" | "path"),
        "user" => !has_sub && matches!(var, "name" | "email"),
        "init" => !has_sub && var == "defaultbranch",
        "lfs" => !has_sub && var == "repositoryformatversion",
        _ => false,
    }
}

/// The config file as it was when its copy was last made (inode, size,
/// modification and change times): the same file gives the same copy.
type Stamp = (u64, u64, i64, i64, i64, i64);

/// The last copy made of each config file, by its stamp: a run's boxes
/// (each call's, the reviewer's) take it without a git process per key
/// (about 25 ms a box).
static MADE: std::sync::Mutex<Vec<(std::path::PathBuf, Stamp, Vec<u8>)>> =
    std::sync::Mutex::new(Vec::new());

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).ok()?;
    m.is_file().then(|| {
        (
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    })
}

pub(crate) async fn write(git: &Git, dest: &Path) -> Result<(), VcsError> {
    let src = git.git_dir().join("config");
    // Taken before the file is read: a change after it gives a new stamp.
    let stamp = stamp(&src);
    let made = stamp.and_then(|st| {
        MADE.lock().ok().and_then(|m| {
            m.iter()
                .find(|(p, s, _)| *p == src && *s == st)
                .map(|(_, _, bytes)| bytes.clone())
        })
    });
    let tmp = dest.with_extension("tmp");
    if let Some(bytes) = made {
        fs_err::write(&tmp, &bytes).map_err(|e| VcsError::io("write", &tmp, e))?;
        return fs_err::rename(&tmp, dest).map_err(|e| VcsError::io("write", dest, e));
    }
    let list = git
        .run(&["config", "-z", "--file", &src.to_string_lossy(), "--list"])
        .await?;
    fs_err::write(&tmp, b"").map_err(|e| VcsError::io("write", &tmp, e))?;
    let file = tmp.to_string_lossy().into_owned();
    for entry in list.split('\0').filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
        if !allowed(key) {
            continue;
        }
        let var = key.rsplit('.').next().unwrap_or("").to_ascii_lowercase();
        let value = if matches!(var.as_str(), "url" | "pushurl") {
            strip_userinfo(value).unwrap_or_else(|| value.to_string())
        } else {
            value.to_string()
        };
        git.run(&["config", "--file", &file, "--add", key, &value])
            .await?;
    }
    if let (Some(st), Ok(bytes)) = (stamp, fs_err::read(&tmp)) {
        if let Ok(mut m) = MADE.lock() {
            m.retain(|(p, _, _)| *p != src);
            // A long-lived server's many work trees: the newest few.
            if m.len() >= 64 {
                m.remove(0);
            }
            m.push((src.clone(), st, bytes));
        }
    }
    fs_err::rename(&tmp, dest).map_err(|e| VcsError::io("write", dest, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::allowed;

    #[test]
    fn only_what_a_sandboxed_git_needs() {
        for k in [
            "core.repositoryformatversion",
            "core.bare",
            "extensions.objectformat",
            "remote.origin.url",
            "remote.my.fork.fetch",
            "branch.main.merge",
            "user.email",
        ] {
            assert!(allowed(k), "{k}");
        }
        for k in [
            "http.proxy",
            "sendemail.smtppass",
            "credential.helper",
            "http.https://x.extraheader",
            "url.https://tok@x/.insteadof",
            "core.fsmonitor",
            "core.hookspath",
            "core.sshcommand",
            "remote.origin.uploadpack",
            "filter.lfs.process",
        ] {
            assert!(!allowed(k), "{k}");
        }
    }
}
