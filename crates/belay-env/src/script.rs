//! Block scripts as text: the shared prelude, command-level splitting (for the
//! single-command ablations), patch-back of repairs, and the whole-script form.

/// Whether the node on `PATH` is Debian's (the `nodejs` package, whose
/// versions carry `+dfsg`; NodeSource's package has the same name and paths).
pub const DEBIAN_NODE: &str = r#"{ dpkg -S "$(readlink -f "$(command -v node)")" 2>/dev/null | grep -q '^nodejs:' && dpkg-query -W -f='${Version}' nodejs 2>/dev/null | grep -q dfsg; }"#;

/// Lines that set up every block (`set -euo pipefail`, exports, `cd`), kept in
/// front of each command when a block runs command by command.
fn is_prelude(line: &str) -> bool {
    let l = line.trim();
    l.starts_with("#!")
        || l.starts_with("set -")
        || l.starts_with("export ")
        || l.starts_with("cd ")
}

/// Split a block script into its prelude and its top-level commands. A line
/// ending in `\` continues; `if/for/while/case/{`...`fi/done/esac/}` blocks are
/// kept whole; comments and blank lines are dropped.
pub fn split_commands(script: &str) -> (String, Vec<String>) {
    let mut prelude = String::new();
    let mut commands = Vec::new();
    let mut current = String::new();
    let mut depth: i32 = 0;
    let mut in_header = true;
    for line in script.lines() {
        let t = line.trim();
        if current.is_empty() && depth == 0 {
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            if in_header && is_prelude(t) {
                prelude.push_str(line);
                prelude.push('\n');
                continue;
            }
        }
        in_header = false;
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(line);
        depth += nesting(t);
        if t.ends_with('\\') || depth > 0 {
            continue;
        }
        depth = 0;
        commands.push(std::mem::take(&mut current));
    }
    if !current.trim().is_empty() {
        commands.push(current);
    }
    (prelude, commands)
}

/// Net opening of compound commands on one line.
fn nesting(line: &str) -> i32 {
    let code = line.split(" #").next().unwrap_or(line);
    let mut d = 0;
    for w in code.split(|c: char| c.is_whitespace() || c == ';') {
        match w {
            "if" | "for" | "while" | "until" | "case" | "{" => d += 1,
            "fi" | "done" | "esac" | "}" => d -= 1,
            _ => {}
        }
    }
    d
}

/// Prepend a repair to a block script, right after its prelude, with a note.
pub fn patch_script(script: &str, fix: &str, note: &str) -> String {
    // Idempotent: a fix already patched in (say, before a crash) is not added twice.
    if script.lines().any(|l| l == fix) {
        return script.to_string();
    }
    let mut out = String::new();
    let mut inserted = false;
    let mut lines = script.lines().peekable();
    while let Some(line) = lines.next() {
        out.push_str(line);
        out.push('\n');
        let t = line.trim();
        let next_is_header = lines
            .peek()
            .map(|n| {
                is_prelude(n)
                    || n.trim().starts_with('#') && !n.trim().starts_with("# belay repair")
            })
            .unwrap_or(false);
        if !inserted && (is_prelude(t) || t.starts_with('#')) && !next_is_header {
            out.push_str(&format!("\n# belay repair: {note}\n{fix}\n"));
            inserted = true;
        }
    }
    if !inserted {
        return format!("# belay repair: {note}\n{fix}\n{script}");
    }
    out
}

/// All blocks' scripts as one script: each block in a subshell, so that one
/// block's `cd` or `export` cannot leak into the next (as with separate runs).
pub fn whole_script<'a>(scripts: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut s = String::from(
        "#!/usr/bin/env bash\n# belay: the planned setup as one whole script\nset -euo pipefail\n",
    );
    for (id, body) in scripts {
        s.push_str(&format!(
            "\necho '[belay] == {id}'\nbash -euo pipefail <<'BELAY_BLOCK_{n}'\n{body}\nBELAY_BLOCK_{n}\n",
            n = id.replace('-', "_")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "#!/usr/bin/env bash\n# belay block 30-x: X\n# Goal: g\nset -euo pipefail\nexport DEBIAN_FRONTEND=noninteractive\ncd /workspace/repo\n\napt-get update -q\n# a comment\napt-get install -y \\\n  gcc make\nif [ ! -x .venv/bin/python ]; then\n  python3 -m venv .venv\nfi\necho done\n";

    #[test]
    fn splits_into_commands() {
        let (prelude, cmds) = split_commands(S);
        assert!(prelude.contains("set -euo pipefail") && prelude.contains("cd /workspace/repo"));
        assert_eq!(cmds.len(), 4, "{cmds:#?}");
        assert_eq!(cmds[0], "apt-get update -q");
        assert!(cmds[1].contains("gcc make"));
        assert!(cmds[2].starts_with("if ") && cmds[2].ends_with("fi"));
        assert_eq!(cmds[3], "echo done");
    }

    #[test]
    fn patches_after_the_prelude() {
        let p = patch_script(
            S,
            "apt-get install -y libffi-dev",
            "missing-c-header (attempt 1)",
        );
        let idx_cd = p.find("cd /workspace/repo").unwrap();
        let idx_fix = p.find("apt-get install -y libffi-dev").unwrap();
        let idx_body = p.find("apt-get update -q").unwrap();
        assert!(idx_cd < idx_fix && idx_fix < idx_body, "{p}");
        assert!(p.contains("# belay repair: missing-c-header (attempt 1)"));
        // A second patch goes in front of the first.
        let p2 = patch_script(&p, "echo second", "second");
        assert!(
            p2.find("echo second").unwrap() < p2.find("libffi-dev").unwrap(),
            "{p2}"
        );
        let (_, cmds) = split_commands(&p2);
        assert_eq!(cmds[0], "echo second");
        assert_eq!(
            patch_script(&p2, "echo second", "again"),
            p2,
            "patching is idempotent"
        );
    }

    #[test]
    fn whole_script_keeps_blocks_apart() {
        let w = whole_script([("00-a", "cd /tmp\necho a"), ("10-b", "pwd")].into_iter());
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&w)
            .current_dir("/")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert_eq!(
            text.lines().last(),
            Some("/"),
            "a block's cd leaked into the next: {text}"
        );
        // A failing block fails the whole script.
        let w = whole_script([("00-a", "false"), ("10-b", "echo never")].into_iter());
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&w)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(!String::from_utf8_lossy(&out.stdout).contains("never"));
    }
}
