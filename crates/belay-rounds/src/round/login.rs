//! A CLI's own login directory for a container round, without letting the
//! agent write the host's: the files go into a scratch copy of the round's
//! own, mounted at the container's home; afterwards only the CLI's token
//! files flow back (a refreshed login). Settings, hooks and MCP servers an
//! agent writes there never reach the host, where the user's own CLI would
//! run them.

use std::path::{Path, PathBuf};

use belay_sandbox::Mount;

use crate::RoundsError;

/// Files copied in at most this large.
const MAX_FILE: u64 = 1024 * 1024;

/// The token files that flow back, by login dir name.
fn tokens(dir_name: &str) -> &'static [&'static str] {
    match dir_name {
        ".claude" => &[".credentials.json"],
        ".codex" => &["auth.json"],
        ".gemini" => &["oauth_creds.json", "google_accounts.json"],
        _ => &[],
    }
}

pub(super) struct LoginView {
    pairs: Vec<(PathBuf, PathBuf)>,
}

fn regular(p: &Path) -> Option<Vec<u8>> {
    let m = fs_err::symlink_metadata(p).ok()?;
    (m.is_file() && m.len() <= MAX_FILE)
        // host-owned: the user's login dir; the agent's view is read through hostfs in finish().
        .then(|| fs_err::read(p).ok())
        .flatten()
}

/// Copy the top-level regular files of each login dir into `scratch/<name>`
/// and mount those at `/tmp/<name>`.
pub(super) fn prepare(
    dirs: &[PathBuf],
    scratch: &Path,
) -> Result<(Vec<Mount>, LoginView), RoundsError> {
    use std::os::unix::fs::PermissionsExt;
    let mut mounts = Vec::new();
    let mut pairs = Vec::new();
    for d in dirs {
        let Some(name) = d.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let view = scratch.join(&name);
        if fs_err::symlink_metadata(&view).is_ok() {
            fs_err::remove_dir_all(&view).map_err(|e| RoundsError::io("cannot clear", &view, e))?;
        }
        fs_err::create_dir_all(&view).map_err(|e| RoundsError::io("cannot create", &view, e))?;
        let _ = fs_err::set_permissions(&view, std::fs::Permissions::from_mode(0o700));
        // host-owned: the user's login dir, never mounted (the agent gets the scratch copy).
        if let Ok(rd) = fs_err::read_dir(d) {
            for e in rd.flatten() {
                if let Some(b) = regular(&e.path()) {
                    let to = view.join(e.file_name());
                    belay_record::atomic_write(&to, &b)?;
                }
            }
        }
        mounts.push(Mount {
            host: view.clone(),
            container: format!("/tmp/{name}"),
            read_only: false,
        });
        pairs.push((d.clone(), view));
    }
    Ok((mounts, LoginView { pairs }))
}

impl LoginView {
    /// Copy the refreshed tokens back (regular files only); the names copied.
    pub(super) fn finish(&self) -> Vec<String> {
        let mut back = Vec::new();
        for (host, view) in &self.pairs {
            let name = host
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for t in tokens(&name) {
                // The agent could write the view: its token is read only as a
                // regular file there, never through a link, never waited on.
                let new = match belay_sandbox::hostfs::read(view, t, MAX_FILE + 1) {
                    Ok(Some(b)) if b.len() as u64 <= MAX_FILE => b,
                    _ => continue,
                };
                if regular(&host.join(t)).as_deref() == Some(new.as_slice()) {
                    continue;
                }
                if belay_record::atomic_write(&host.join(t), &new).is_ok() {
                    back.push(format!("{name}/{t}"));
                }
            }
        }
        back
    }
}
