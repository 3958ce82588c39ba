//! What an agent's commit never holds, in every mode that commits an agent's
//! work (the plan loop's checkpoints, the jobs' commits): secrets' usual
//! homes and the agent CLIs' own state.

/// Never committed, as pathspec globs. (The `**/` forms match at the top
/// too; a pathspec that names a path the repository ignores would make
/// `git add` fail.)
pub const AGENT_EXCLUDES: &[&str] = &[
    "**/.env",
    "**/.env.*",
    "**/.env/**",
    "**/.env.*/**",
    "**/.codex/**",
    "**/.claude/**",
    "**/.gemini/**",
    "**/.grok/**",
];

/// The agents' tooling directories.
const TOOLING: &[&str] = &[".codex", ".claude", ".gemini", ".grok"];

/// [`AGENT_EXCLUDES`] as owned strings, for a [`crate::CommitRequest`].
pub fn agent_exclude_globs() -> Vec<String> {
    AGENT_EXCLUDES.iter().map(|s| s.to_string()).collect()
}

/// Whether a commit leaves `path` out ([`AGENT_EXCLUDES`]).
pub fn is_excluded(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    for p in path.split('/') {
        if TOOLING.contains(&p) {
            return true;
        }
        if p == ".env" || p.starts_with(".env.") {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::is_excluded;

    #[test]
    fn what_a_commit_leaves_out() {
        for p in [
            ".env",
            "a/.env",
            ".env.local",
            "x/y/.env.prod",
            ".codex/auth.json",
            "a/.claude/x",
            ".gemini",
        ] {
            assert!(is_excluded(p), "{p}");
        }
        for p in ["env", "a.env", "src/main.rs", ".envrc", "codex/x"] {
            assert!(!is_excluded(p), "{p}");
        }
    }
}
