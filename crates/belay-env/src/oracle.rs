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
    let text = std::fs::read_to_string(path).map_err(|e| {
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

#[cfg(test)]
mod tests {
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
