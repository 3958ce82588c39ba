//! The round's prompt: the prompt files joined, YAML front matter stripped,
//! and the round context prepended (or left to a file, or skipped).

use std::path::PathBuf;

use crate::config::{Config, ContextMode, Phase};
use crate::state::RoundContext;

/// A prompt that cannot be used: a file, or what the files make together.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("prompt file {}: it is not UTF-8 text", .path.display())]
    NotText { path: PathBuf },
    #[error("prompt file {}: it does not exist", .path.display())]
    Missing { path: PathBuf },
    #[error("prompt file {}: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: belay_sandbox::hostfs::HostFsError,
    },
    #[error("the assembled prompt is empty")]
    Empty,
    #[error("the assembled prompt starts with {first:?}: a CLI could read it as a flag, or the file lost its start")]
    BadStart { first: char },
    #[error("the assembled prompt is {len} bytes, under 500: it looks truncated")]
    Short { len: usize },
}

/// The largest prompt file read.
pub(crate) const MAX_PROMPT_FILE: u64 = 4 * 1024 * 1024;

/// A prompt that cannot be used is the config's to fix (exit 78 in rounds).
impl belay_record::Classify for PromptError {
    fn exit_class(&self) -> belay_record::ExitClass {
        match self {
            PromptError::NotText { .. }
            | PromptError::Missing { .. }
            | PromptError::Unreadable { .. }
            | PromptError::Empty
            | PromptError::BadStart { .. }
            | PromptError::Short { .. } => belay_record::ExitClass::Usage,
        }
    }
}

/// The prompt files of a round, joined. The first must exist; later
/// missing ones are skipped (as the peer does). The error names the file.
///
/// A prompt in the work tree (which the agent can write) is read through
/// real dirs only and as a regular file only: a link planted there (to a
/// host file, `/dev/zero`, a FIFO) is refused, never followed, so the next
/// prompt cannot carry a host file.
pub fn assemble_files(cfg: &Config, phase: Option<&Phase>) -> Result<String, PromptError> {
    let files = cfg.prompt_files(phase);
    let mut parts = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let text = match crate::trusted::read_file(&cfg.runtime.work_dir, f, MAX_PROMPT_FILE) {
            Ok(Some((_, b))) => {
                String::from_utf8(b).map_err(|_| PromptError::NotText { path: f.clone() })?
            }
            Ok(None) if i > 0 => continue,
            Ok(None) => return Err(PromptError::Missing { path: f.clone() }),
            Err(source) => {
                return Err(PromptError::Unreadable {
                    path: f.clone(),
                    source,
                })
            }
        };
        parts.push(if cfg.prompt.strip_frontmatter {
            strip_frontmatter(&text).to_string()
        } else {
            text
        });
    }
    Ok(parts.join(&cfg.prompt.separator))
}

/// Drop a leading `---` … `---` block.
pub fn strip_frontmatter(t: &str) -> &str {
    let Some(rest) = t
        .strip_prefix("---\n")
        .or_else(|| t.strip_prefix("---\r\n"))
    else {
        return t;
    };
    let mut off = 0;
    for line in rest.split_inclusive('\n') {
        off += line.len();
        if line.trim_end() == "---" {
            return rest[off..].trim_start_matches(['\r', '\n']);
        }
    }
    t
}

/// The context block as it is prepended.
pub fn context_block(ctx: &RoundContext) -> String {
    let json = serde_json::to_string_pretty(ctx).unwrap_or_else(|_| "{}".into());
    format!("```round-context\n{json}\n```\n\n")
}

/// The prompt the agent gets.
pub fn with_context(cfg: &Config, body: &str, ctx: &RoundContext) -> String {
    if cfg.prompt.inject_context && cfg.prompt.mode == ContextMode::Prepend {
        format!("{}{body}", context_block(ctx))
    } else {
        body.to_string()
    }
}

/// The peer's smoke check: non-empty, at least 500 bytes, and not starting
/// with `-` or white space (a truncated or mangled prompt, or one a CLI
/// would read as a flag).
pub fn smoke(prompt: &str) -> Result<(), PromptError> {
    if prompt.is_empty() {
        return Err(PromptError::Empty);
    }
    if let Some(c) = prompt.chars().next() {
        if c == '-' || c.is_whitespace() {
            return Err(PromptError::BadStart { first: c });
        }
    }
    if prompt.len() < 500 {
        return Err(PromptError::Short { len: prompt.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontmatter_goes_and_the_smoke_check_reads_the_start() {
        assert_eq!(strip_frontmatter("---\na: 1\n---\nbody"), "body");
        assert_eq!(strip_frontmatter("no front\n---\n"), "no front\n---\n");
        assert_eq!(strip_frontmatter("---\nunclosed"), "---\nunclosed");
        assert!(smoke(&"x".repeat(500)).is_ok());
        assert!(smoke(&"x".repeat(499))
            .unwrap_err()
            .to_string()
            .contains("499 bytes"));
        assert!(smoke(&format!("-{}", "x".repeat(600)))
            .unwrap_err()
            .to_string()
            .contains("flag"));
        assert!(smoke(&format!("\n{}", "x".repeat(600))).is_err());
        assert!(smoke("").is_err());
    }
}
