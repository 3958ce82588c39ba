//! Oracle files (`*.oracle.json`): commands that must exit 0 on the final image.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::EnvError;

#[derive(Debug, Clone, PartialEq)]
pub struct OracleCommand {
    pub oracle_id: String,
    pub command: String,
}

#[derive(Deserialize)]
struct File {
    fixed_test_commands: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    command: Option<String>,
    commands: Option<Vec<String>>,
    oracle_id: Option<String>,
    #[allow(dead_code)]
    source: Option<String>,
    #[allow(dead_code)]
    oracle_priority: Option<i64>,
}

/// Parse an oracle file; errors carry `file:line:column`.
pub fn load(path: &Path) -> Result<Vec<OracleCommand>, EnvError> {
    // host-owned: the oracle file is the user's (--oracle-file, --oracles-dir), never mounted.
    let text = fs_err::read_to_string(path).map_err(|e| {
        EnvError::Usage(format!(
            "cannot read oracle file {}: {e}. Pass --oracle-file with an existing *.oracle.json",
            path.display()
        ))
    })?;
    parse(&text, path)
}

pub fn parse(text: &str, path: &Path) -> Result<Vec<OracleCommand>, EnvError> {
    let f: File = serde_json::from_str(text).map_err(|e| EnvError::BadManifest {
        path: PathBuf::from(path),
        line: e.line(),
        column: e.column(),
        message: format!("not a valid oracle file ({e}); expected {{\"fixed_test_commands\": [{{\"command\": ...}}]}}"),
    })?;
    let mut out = Vec::new();
    for (i, e) in f.fixed_test_commands.into_iter().enumerate() {
        let id = e.oracle_id.unwrap_or_else(|| format!("oracle-{}", i + 1));
        let cmds: Vec<String> = e
            .command
            .into_iter()
            .chain(e.commands.unwrap_or_default())
            .collect();
        if cmds.is_empty() {
            return Err(EnvError::BadManifest {
                path: PathBuf::from(path),
                line: 1,
                column: 1,
                message: format!(
                    "entry {} ({id}) has neither \"command\" nor \"commands\"",
                    i + 1
                ),
            });
        }
        for c in cmds {
            out.push(OracleCommand {
                oracle_id: id.clone(),
                command: c,
            });
        }
    }
    if out.is_empty() {
        return Err(EnvError::BadManifest {
            path: PathBuf::from(path),
            line: 1,
            column: 1,
            message: "fixed_test_commands is empty".into(),
        });
    }
    Ok(out)
}

/// `--oracle-collect-only`: a pytest command rewritten to only collect the
/// tests (exit 5, "no tests collected", passes). `None` for other commands,
/// which are never rewritten.
pub fn collect_only(command: &str) -> Option<String> {
    if command.contains("--collect-only") {
        return None;
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "pytest" || w.ends_with("/pytest") || *w == "py.test")?;
    let mut out: Vec<String> = words[..=at].iter().map(|s| s.to_string()).collect();
    out.push("--collect-only".into());
    out.push("-q".into());
    out.extend(words[at + 1..].iter().map(|s| s.to_string()));
    Some(format!(
        "{{ {}; rc=$?; [ \"$rc\" -eq 0 ] || [ \"$rc\" -eq 5 ]; }}",
        out.join(" ")
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn collect_only_rewrites_pytest_only() {
        let r = collect_only("python -m pytest tests -x").unwrap();
        assert!(
            r.contains("python -m pytest --collect-only -q tests -x"),
            "{r}"
        );
        assert!(collect_only("npm test").is_none());
        assert!(collect_only("pytest --collect-only -q").is_none());
    }

    use super::*;

    #[test]
    fn both_shapes() {
        let t = r#"{"fixed_test_commands": [{"command": "pytest -q", "oracle_id": "a", "source": "generic", "oracle_priority": 1},
            {"commands": ["true", "echo ok"]}]}"#;
        let c = parse(t, Path::new("x.oracle.json")).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].oracle_id, "a");
        assert_eq!(c[2].oracle_id, "oracle-2");
    }

    #[test]
    fn errors_have_positions() {
        let e = parse(
            "{\n \"fixed_test_commands\": [\n  {\"command\": 3}\n ]\n}",
            Path::new("p.oracle.json"),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("p.oracle.json:3:"), "{e}");
        let e = parse(
            "{\"fixed_test_commands\": [{}]}",
            Path::new("p.oracle.json"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("neither"), "{e}");
    }
}
