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

/// The most of a `.env` file read.
pub const MAX_DOTENV_FILE: u64 = 1024 * 1024;

/// The longest `.env` value taken (a PEM key is a few KiB).
pub const MAX_DOTENV_VALUE: usize = 64 * 1024;

/// Parse `.env` text: `KEY=VALUE` lines, optional `export `, optional single or
/// double quotes, `#` comments. Malformed lines are skipped.
///
/// A quoted value may span lines: it runs to the matching closing quote, and
/// the rest of the line that holds it is ignored. Inside double quotes `\n`,
/// `\r`, `\t`, `\"` and `\\` are unescaped (another `\x` is kept as written);
/// single quotes are literal. A quote that is never closed takes the rest of
/// its line; the lines after it are read as entries of their own. A value is
/// at most [`MAX_DOTENV_VALUE`] bytes (a closing quote further on is not
/// looked for), so a planted file cannot make a secret of any size.
pub fn parse_dotenv(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < text.len() {
        let line_end = text[pos..].find('\n').map_or(text.len(), |i| pos + i);
        let raw = &text[pos..line_end];
        pos = (line_end + 1).min(text.len());
        // Trimmed at the start only, so the value is a suffix of `raw` and
        // its offset in `text` is known.
        let line = raw.trim_start();
        if line.trim_end().is_empty() || line.starts_with('#') {
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
        let v = v.trim_start();
        let value = match v.chars().next() {
            Some(q @ ('"' | '\'')) => {
                // After the opening quote, to the end of the file.
                let from = line_end - v.len() + 1;
                let mut upto = (from + MAX_DOTENV_VALUE).min(text.len());
                while !text.is_char_boundary(upto) {
                    upto -= 1;
                }
                let (value, close) = unquote(&text[from..upto], q);
                match close {
                    Some(close) => {
                        let close = from + close;
                        pos = text[close..]
                            .find('\n')
                            .map_or(text.len(), |i| close + i + 1);
                        value
                    }
                    // Never closed: the rest of its own line, as before
                    // (the rest of the file would make a secret of any
                    // size, with a pattern for every line of it).
                    None => text[from..line_end].trim_end().to_string(),
                }
            }
            // An unquoted value ends at an inline comment.
            _ => {
                let v = v.trim_end();
                v.split(" #").next().unwrap_or(v).trim_end().to_string()
            }
        };
        out.push((k.to_string(), value));
    }
    out
}

/// A quoted `.env` value whose text after the opening quote `q` starts `s`:
/// the value, and the offset in `s` just past the closing quote (`None` when
/// there is none; the value is then all of `s`).
fn unquote(s: &str, q: char) -> (String, Option<usize>) {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        if c == q {
            return (value, Some(i + c.len_utf8()));
        }
        if q == '"' && c == '\\' {
            match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, 'r')) => value.push('\r'),
                Some((_, 't')) => value.push('\t'),
                Some((_, '"')) => value.push('"'),
                Some((_, '\\')) => value.push('\\'),
                Some((_, other)) => {
                    value.push('\\');
                    value.push(other);
                }
                None => value.push('\\'),
            }
            continue;
        }
        value.push(c);
    }
    (value, None)
}

/// Where settings come from: the process environment first, then `.env` in `dir`.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    dotenv: Vec<(String, String)>,
}

impl Settings {
    /// Read `dir/.env` if there is one. It is read as a regular file only,
    /// at most 1 MiB: a link, a FIFO or a device there (a planted one, when
    /// `dir` is a work tree an agent writes) is not read and is said in the
    /// log, so it can neither hang belay nor hand it another file.
    pub fn load(dir: &Path) -> Self {
        let path = dir.join(".env");
        let dotenv = match belay_record::read_regular(&path, MAX_DOTENV_FILE) {
            Ok(Some(b)) => parse_dotenv(&String::from_utf8_lossy(&b)),
            Ok(None) => {
                if fs_err::symlink_metadata(&path).is_ok() {
                    tracing::warn!(
                        "{} is not a regular file (a link, a FIFO, a device): not read",
                        path.display()
                    );
                }
                Vec::new()
            }
            Err(e) => {
                tracing::warn!("cannot read {}: {e}", path.display());
                Vec::new()
            }
        };
        Settings { dotenv }
    }

    /// The one rule every mode uses: the environment, then `./.env` of the
    /// directory belay was started in. That may be a work tree an agent
    /// writes (`plan run` in its repository, a rounds unit in its work dir):
    /// the file is read as a regular file only ([`Settings::load`]), and a
    /// value there never overrides the environment.
    pub fn for_cwd() -> Self {
        match std::env::current_dir() {
            Ok(d) => Settings::load(&d),
            Err(_) => Settings::env_only(),
        }
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

    /// A `.env` an agent could plant in its work tree: a link to another
    /// file is not followed, a FIFO does not block, `/dev/zero` is not read.
    #[test]
    fn a_planted_dotenv_is_neither_followed_nor_blocking() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("other"), "BELAY_T_PLANTED=from-the-link\n").unwrap();
        std::os::unix::fs::symlink(d.path().join("other"), d.path().join(".env")).unwrap();
        assert_eq!(Settings::load(d.path()).var("BELAY_T_PLANTED"), None);
        std::fs::remove_file(d.path().join(".env")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.path().join(".env")).unwrap();
        assert_eq!(Settings::load(d.path()).var("BELAY_T_PLANTED"), None);
        std::fs::remove_file(d.path().join(".env")).unwrap();
        let ok = std::process::Command::new("mkfifo")
            .arg(d.path().join(".env"))
            .status()
            .unwrap();
        assert!(ok.success());
        let t = std::time::Instant::now();
        assert_eq!(Settings::load(d.path()).var("BELAY_T_PLANTED"), None);
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        std::fs::remove_file(d.path().join(".env")).unwrap();
        std::fs::write(d.path().join(".env"), "BELAY_T_PLANTED=plain\n").unwrap();
        assert_eq!(
            Settings::load(d.path()).var("BELAY_T_PLANTED").as_deref(),
            Some("plain")
        );
    }

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
    fn dotenv_multi_line_values() {
        let pem = "-----BEGIN PRIVATE KEY-----\n\
                   MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n\
                   VJTUt9Us8cKjMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDu\n\
                   -----END PRIVATE KEY-----";
        let text = format!("A=1\nPRIVATE_KEY=\"{pem}\" # trailing\nexport B='{pem}'\r\nC=after\n");
        let v = parse_dotenv(&text);
        assert_eq!(
            v,
            vec![
                ("A".into(), "1".into()),
                ("PRIVATE_KEY".into(), pem.to_string()),
                ("B".into(), pem.to_string()),
                ("C".into(), "after".into()),
            ]
        );
        // Escapes in double quotes; single quotes are literal; an escaped
        // quote does not end the value.
        let v = parse_dotenv(
            "TOKEN2=\"a\\nsecret\\nb\"\nT=\"x\\ty\\r\\\"q\\\" \\\\ \\z\"\nS='a\\nb\\'\nN=\"a # b\"\n",
        );
        assert_eq!(
            v,
            vec![
                ("TOKEN2".into(), "a\nsecret\nb".into()),
                ("T".into(), "x\ty\r\"q\" \\ \\z".into()),
                ("S".into(), "a\\nb\\".into()),
                ("N".into(), "a # b".into()),
            ]
        );
        // A quote never closed takes the rest of its line; the lines after
        // it are still read as entries.
        let v = parse_dotenv("K=\"-----BEGIN KEY-----\nbody-line-123456\nL=2\n\n");
        assert_eq!(
            v,
            vec![
                ("K".into(), "-----BEGIN KEY-----".into()),
                ("L".into(), "2".into()),
            ]
        );
        assert_eq!(
            parse_dotenv("K='abc"),
            vec![("K".to_string(), "abc".to_string())]
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
