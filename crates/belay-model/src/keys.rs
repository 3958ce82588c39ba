//! API keys and endpoint settings: from the environment, then from a local
//! `.env` that never overrides what is already set. Keys live only in memory:
//! [`Secret`] does not print, and nothing here writes a file.

use std::fmt;
use std::path::Path;

/// A secret value. `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Parse `.env` text: `KEY=VALUE` lines, optional `export `, optional single or
/// double quotes, `#` comments. Malformed lines are skipped.
pub fn parse_dotenv(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim();
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let v = v.trim();
        let quoted = v
            .chars()
            .next()
            .filter(|q| *q == '"' || *q == '\'')
            .and_then(|q| v[1..].find(q).map(|end| &v[1..1 + end]));
        let v = if let Some(inner) = quoted {
            inner
        } else {
            // An unquoted value ends at an inline comment.
            v.split(" #").next().unwrap_or(v).trim_end()
        };
        out.push((k.to_string(), v.to_string()));
    }
    out
}

/// Where settings come from: the process environment first, then `.env` in `dir`.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    dotenv: Vec<(String, String)>,
}

impl Settings {
    /// Read `dir/.env` if there is one.
    pub fn load(dir: &Path) -> Self {
        let dotenv = fs_err::read_to_string(dir.join(".env"))
            .map(|t| parse_dotenv(&t))
            .unwrap_or_default();
        Settings { dotenv }
    }

    /// The process environment only.
    pub fn env_only() -> Self {
        Settings::default()
    }

    /// A setting: the environment wins over `.env`; empty counts as unset.
    pub fn var(&self, name: &str) -> Option<String> {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| {
                self.dotenv
                    .iter()
                    .rev()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .filter(|v| !v.is_empty())
            })
    }

    pub fn secret(&self, name: &str) -> Option<Secret> {
        self.var(name).map(Secret)
    }
}

pub use belay_record::{looks_secret, secret_looking_env};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn dotenv_forms() {
        let v = parse_dotenv(
            "# c\nA=1\nexport B=\"two words\" # note\nC='x=y'\nD=plain # note\nbad line\n=x\nE=\n",
        );
        assert_eq!(
            v,
            vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into()),
                ("C".into(), "x=y".into()),
                ("D".into(), "plain".into()),
                ("E".into(), "".into()),
            ]
        );
    }

    #[test]
    fn env_wins_over_dotenv_and_secret_hides() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(".env"),
            "BELAY_TEST_DOTENV_ONLY=from-file\nPATH=/nowhere\n",
        )
        .unwrap();
        let s = Settings::load(dir.path());
        assert_eq!(
            s.var("BELAY_TEST_DOTENV_ONLY").as_deref(),
            Some("from-file")
        );
        assert_ne!(s.var("PATH").as_deref(), Some("/nowhere"));
        let k = s.secret("BELAY_TEST_DOTENV_ONLY").unwrap();
        assert_eq!(format!("{k:?} {k}"), "Secret(***) ***");
    }
}
