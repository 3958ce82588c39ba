//! Audit levels: how much agent text belay's records keep.
//!
//! * `full`: agent output, prompts and notes as they are;
//! * `redacted` (the default): scrubbed for known secret shapes (PEM private
//!   keys, AWS access keys, GitHub, Slack and OpenAI tokens, bearer tokens,
//!   `token: value` assignments);
//! * `off`: agent text dropped, replaced by `<suppressed by audit-level=off:
//!   N chars>`.
//!
//! At every level the values of the secrets belay knows (the model key, the
//! variables named by `--secret-env` and the environment's secret-looking
//! variables) are redacted from every file belay writes. Agents always get the
//! real prompt: the level changes what is recorded, never what they are told.

use std::borrow::Cow;
use std::path::Path;
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditLevel {
    Off,
    #[default]
    Redacted,
    Full,
}

impl std::str::FromStr for AuditLevel {
    type Err = crate::PlanError;
    fn from_str(s: &str) -> Result<Self, crate::PlanError> {
        match s {
            "off" => Ok(AuditLevel::Off),
            "redacted" => Ok(AuditLevel::Redacted),
            "full" => Ok(AuditLevel::Full),
            o => Err(crate::PlanError::UnknownAuditLevel {
                value: o.to_string(),
            }),
        }
    }
}

fn shapes() -> &'static [Regex] {
    static S: OnceLock<Vec<Regex>> = OnceLock::new();
    S.get_or_init(|| {
        [
            r"(?s)-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\z)",
            r"AKIA[0-9A-Z]{16}",
            r"gh[pousr]_[A-Za-z0-9]{36,}",
            r"xox[baprs]-[A-Za-z0-9-]{10,}",
            r"sk-[A-Za-z0-9_-]{20,}",
            r"(?i)bearer\s+[A-Za-z0-9._~+/=-]{20,}",
            r"(?i)(api_key|secret|token|password|passwd)(\s*[:=]\s*)\S{6,}",
        ]
        .iter()
        .filter_map(|p| Regex::new(p).ok())
        .collect()
    })
}

/// Text with known secret shapes replaced by `[REDACTED]`.
pub fn scrub_shapes(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    for re in shapes() {
        if re.is_match(&out) {
            out = Cow::Owned(re.replace_all(&out, "[REDACTED]").into_owned());
        }
    }
    out
}

impl AuditLevel {
    /// Agent text as this level records it.
    pub fn prepare(self, text: &str) -> String {
        match self {
            AuditLevel::Full => text.to_string(),
            AuditLevel::Redacted => scrub_shapes(text).into_owned(),
            AuditLevel::Off => format!(
                "<suppressed by audit-level=off: {} chars>",
                text.chars().count()
            ),
        }
    }

    /// Whether an agent's own event stream is recorded as it runs.
    pub fn streams_agent_events(self) -> bool {
        self == AuditLevel::Full
    }
}

/// The values in the work tree's `.env` files (`KEY=VALUE`, 8 characters or
/// more): an agent can read them, so a commit must not carry them. A link
/// named `.env…` is read when it points inside the tree (the agent reads it
/// there too); files git tracks (`tracked`, relative paths) are public
/// already and skipped. A bounded walk (8 levels, 200 files) that skips
/// `.git` and dependency directories.
///
/// Every file is read through [`belay_sandbox::hostfs::read`]: no link at any
/// level below `root`, a regular file only, non-blocking, at most 1 MiB. A
/// link's target is resolved inside the tree as the OS would (a link to a
/// link followed, by the tree's own contents), and read the same way; one
/// that leaves the tree is skipped.
pub fn dotenv_secrets(root: &Path, tracked: &[String]) -> Vec<(String, String)> {
    const SKIP: &[&str] = &[".git", "node_modules", "target", ".venv", "venv", "vendor"];
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        // names-only: the names listed lead to reads through hostfs (rooted at the tree), which refuse a path through a swapped link.
        let Ok(rd) = fs_err::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(ft) = e.file_type() else { continue };
            let envish = name == ".env" || name.starts_with(".env.");
            if ft.is_dir() && depth < 8 && !SKIP.contains(&name.as_str()) {
                stack.push((e.path(), depth + 1));
                continue;
            }
            if !envish || !(ft.is_file() || ft.is_symlink()) {
                continue;
            }
            let Some(rel) = e
                .path()
                .strip_prefix(root)
                .ok()
                .and_then(|r| r.to_str())
                .map(String::from)
            else {
                continue;
            };
            if tracked.contains(&rel) {
                continue;
            }
            // A link is followed only by name, to a regular file inside the tree.
            let target = if ft.is_symlink() {
                match link_inside(root, &rel) {
                    Some(t) => t,
                    None => continue,
                }
            } else {
                rel
            };
            let Ok(Some(bytes)) = belay_sandbox::hostfs::read(root, &target, 1 << 20) else {
                continue;
            };
            seen += 1;
            if seen > 200 {
                return out;
            }
            let text = String::from_utf8_lossy(&bytes);
            for (k, v) in belay_model::keys::parse_dotenv(&text) {
                if v.len() >= 8 {
                    out.push((format!("{name}:{k}"), v));
                }
            }
        }
    }
    out
}

/// Where the link `rel` (relative to `root`) leads inside the tree, resolved
/// as the OS would resolve it, a link to a link followed, in the tree's own
/// contents ([`belay_sandbox::hostfs::resolve_in_tree`]); an absolute target
/// under `root` is taken as that path of the tree. `None` when it leaves the
/// tree or leads to the root itself.
fn link_inside(root: &Path, rel: &str) -> Option<String> {
    use belay_sandbox::hostfs::{read_link, resolve_in_tree, Resolved};
    let target = read_link(root, Path::new(rel)).ok()??;
    let start = if target.is_absolute() {
        target.strip_prefix(root).ok()?.to_path_buf()
    } else {
        Path::new(rel).to_path_buf()
    };
    match resolve_in_tree(root, &start).ok()? {
        Resolved::Inside(p) if !p.as_os_str().is_empty() => p.to_str().map(String::from),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_level_does_what_it_says() {
        let t = "key AKIAABCDEFGHIJKLMNOP and token=abcdef123456 and ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        let r = AuditLevel::Redacted.prepare(t);
        assert!(
            !r.contains("AKIA") && !r.contains("abcdef123456") && !r.contains("ghp_"),
            "{r}"
        );
        assert_eq!(AuditLevel::Full.prepare(t), t);
        assert_eq!(
            AuditLevel::Off.prepare("abc"),
            "<suppressed by audit-level=off: 3 chars>"
        );
        let pem = "x\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\ny";
        assert_eq!(AuditLevel::Redacted.prepare(pem), "x\n[REDACTED]\ny");
        assert_eq!(AuditLevel::default(), AuditLevel::Redacted);
    }

    #[test]
    fn the_trees_dotenv_values_are_found() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("config")).unwrap();
        std::fs::write(
            d.path().join("config/.env"),
            "# a comment\nexport DB_PASSWORD=\"hunter2-long-value\"\nSHORT=abc\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.path().join("node_modules/x")).unwrap();
        std::fs::write(d.path().join("node_modules/x/.env"), "K=skipped-value-1\n").unwrap();
        // A link to a file inside the tree is read; a tracked file is not.
        std::fs::create_dir_all(d.path().join("secrets")).unwrap();
        std::fs::write(
            d.path().join("secrets/prod.conf"),
            "API_TOKEN=Zq9vLmW3kPx7Tn2R\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("secrets/prod.conf", d.path().join(".env")).unwrap();
        std::fs::write(d.path().join(".env.example"), "K=public-example-1\n").unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let mut found = dotenv_secrets(&root, &[".env.example".to_string()]);
        found.sort();
        assert_eq!(
            found,
            [
                (".env:API_TOKEN".to_string(), "Zq9vLmW3kPx7Tn2R".to_string()),
                (
                    ".env:DB_PASSWORD".to_string(),
                    "hunter2-long-value".to_string()
                )
            ]
        );
    }

    #[test]
    fn dotenv_links_out_of_the_tree_are_never_read() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("tree");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(
            d.path().join("host.env"),
            "HOST_TOKEN=host-canary-value-1\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(d.path().join("host.env"), root.join(".env")).unwrap();
        std::os::unix::fs::symlink("../../host.env", root.join("sub/.env.rel")).unwrap();
        std::os::unix::fs::symlink(d.path(), root.join("sub/up")).unwrap();
        std::fs::write(root.join("sub/.env.real"), "K=inside-the-tree-1\n").unwrap();
        // A link to the link is not followed either.
        std::os::unix::fs::symlink(".env.rel", root.join("sub/.env.hop")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let found = dotenv_secrets(&root, &[]);
        assert_eq!(
            found,
            [(".env.real:K".to_string(), "inside-the-tree-1".to_string())]
        );
    }
}
