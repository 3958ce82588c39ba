//! A CLI's own login directory for a container round, without letting the
//! agent write the host's: the files go into a scratch copy of the round's
//! own, mounted at the container's home; afterwards only the CLI's token
//! files flow back (a refreshed login). Settings, hooks and MCP servers an
//! agent writes there never reach the host, where the user's own CLI would
//! run them.

use std::path::{Path, PathBuf};

use belay_record::Redactor;
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

/// A token-like string of a token file this long or longer is a secret.
const MIN_SECRET: usize = 12;
/// At most this many secrets from one token file (a file written back from
/// an agent's view could hold any number).
const MAX_SECRETS: usize = 64;

/// The values of the CLIs' token files in `dirs` (as [`prepare`] copies
/// them for the agent): every token-like string (no whitespace, `:` or
/// `@`, so scopes and e-mail addresses are not) of [`MIN_SECRET`]
/// characters or more, at any depth, of each that is JSON. Registered before the agent starts,
/// an agent that prints its login finds it scrubbed from the round's log,
/// its events and every record.
pub(super) fn secrets(dirs: &[PathBuf]) -> Redactor {
    let mut found = Vec::new();
    for d in dirs {
        let Some(name) = d.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        for t in tokens(&name) {
            let Some(bytes) = regular(&d.join(t)) else {
                continue;
            };
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                let mut values = Vec::new();
                json_strings(&v, &mut values);
                let label = format!("{name}/{t}");
                found.extend(
                    values
                        .into_iter()
                        .take(MAX_SECRETS)
                        .map(|s| (label.clone(), s)),
                );
            }
        }
    }
    Redactor::new(found)
}

/// Every token-like string of `v` of [`MIN_SECRET`] characters or more, depth first
/// (serde_json bounds the depth when it parses).
fn json_strings(v: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::String(s)
            if s.chars().count() >= MIN_SECRET
                && !s.chars().any(|c| c.is_whitespace() || c == ':' || c == '@') =>
        {
            out.push(s.clone())
        }
        Value::Array(a) => a.iter().for_each(|x| json_strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| json_strings(x, out)),
        _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_like_string_of_a_json_token_file_is_a_secret() {
        let home = tempfile::tempdir().unwrap();
        let claude = home.path().join(".claude");
        std::fs::create_dir_all(&claude).unwrap();
        std::fs::write(
            claude.join(".credentials.json"),
            r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-AAAABBBBCCCC","refreshToken":"sk-ant-ort01-DDDDEEEEFFFF","expiresAt":1767225600000,"scopes":["short","user:inference"],"account":"someone@example.org"}}"#,
        )
        .unwrap();
        // Not a token file: its strings are not secrets.
        std::fs::write(
            claude.join("settings.json"),
            r#"{"model":"a-long-model-name-here"}"#,
        )
        .unwrap();
        let codex = home.path().join(".codex");
        std::fs::create_dir_all(&codex).unwrap();
        std::fs::write(codex.join("auth.json"), "not json at all, 1234567890").unwrap();
        let r = secrets(&[claude, codex, home.path().join(".gemini")]);
        let values: Vec<&str> = r.secrets().iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(
            values,
            ["sk-ant-oat01-AAAABBBBCCCC", "sk-ant-ort01-DDDDEEEEFFFF"]
        );
        let out = r.redact("cat: sk-ant-ort01-DDDDEEEEFFFF");
        assert_eq!(out, "cat: [REDACTED:.claude/.credentials.json]");
    }
}
