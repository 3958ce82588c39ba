//! The safety filter for repair commands and probes.
//!
//! A repair may install packages and set up the environment; it may not touch
//! the container engine, push anything, make filesystems, delete broadly, or
//! edit the repository's own source. Probes are stricter: one line, read-only,
//! no installs, no network.

use regex::Regex;
use std::sync::OnceLock;

/// Why a command is refused, or `None` when it may run as a repair.
pub fn check_repair(cmd: &str) -> Option<String> {
    for (re, why) in repair_rules() {
        if re.is_match(cmd) {
            return Some(format!("refused `{}`: {why}", one_line(cmd)));
        }
    }
    // Shell operators quoted into an argument (`node@'14.x >=14.17 <15'`)
    // are no redirection and split no command.
    let cmd_unquoted = &operators_out_of_quotes(cmd);
    if let Some(target) = broad_rm(cmd_unquoted) {
        return Some(format!(
            "refused `{}`: recursive deletion of {target} is refused (only build environments such as .venv, node_modules, build and target under the repository, or paths outside it, may go)",
            one_line(cmd)
        ));
    }
    if let Some(path) = repo_write_target(cmd_unquoted) {
        return Some(format!(
            "refused `{}`: it writes {path}, part of the repository's own source (repairs change the environment, not the project)",
            one_line(cmd)
        ));
    }
    None
}

/// Directories under the repository that are build environments, not source.
const REPO_ENV_DIRS: [&str; 4] = [".venv/", "node_modules/", "build/", "target/"];

/// `cmd` with the shell's operators (`> < | & ;`, parentheses and braces)
/// inside single or double quotes made `_`: what is quoted is an argument.
fn operators_out_of_quotes(cmd: &str) -> String {
    let mut quote = None;
    // A backslash outside single quotes escapes the next character: `\'`
    // opens no quote (`echo don\'t > setup.py` still writes setup.py).
    let mut escaped = false;
    cmd.chars()
        .map(|c| {
            if std::mem::take(&mut escaped) {
                return c;
            }
            match (quote, c) {
                (None | Some('"'), '\\') => {
                    escaped = true;
                    c
                }
                (None, '\'' | '"') => {
                    quote = Some(c);
                    c
                }
                (Some(q), _) if c == q => {
                    quote = None;
                    c
                }
                (Some(_), '>' | '<' | '|' | '&' | ';' | '(' | ')' | '{' | '}' | '\n') => '_',
                _ => c,
            }
        })
        .collect()
}

/// Fixes run in /workspace/repo: a relative path is a path of the repository.
/// So is one under another name in `/workspace` that no mode mounts at: the
/// checkout's clone name links there (`plan::checkout_link`). The path is
/// read as the kernel resolves it, `//`, `.` and `..` included
/// (`/workspace/./repo/x`, `//workspace/repo/x`, `.venv/../setup.py`).
fn absolute(p: &str) -> String {
    use belay_sandbox::layout::{reserved, REPO, WORKSPACE};
    let p = p.trim_matches(|c| c == '"' || c == '\'');
    if p.starts_with('~') || p.starts_with('$') {
        return p.to_string();
    }
    let p = lexical(&if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{REPO}/{p}")
    });
    let under = p
        .strip_prefix(WORKSPACE)
        .and_then(|r| r.strip_prefix('/'))
        .filter(|r| !r.is_empty());
    // Only a path through it: the link itself (`rm /workspace/NAME`)
    // is no part of the source, nor is a file beside it.
    match under.and_then(|r| r.split_once('/')) {
        Some((name, rest)) if !reserved(name) => format!("{REPO}/{rest}"),
        _ => p,
    }
}

/// An absolute path with `//` and `.` dropped and `..` taken back, as the
/// kernel walks it (links aside). A trailing `/` (or `/.`) stays: `rm -r
/// link/` goes through the link.
fn lexical(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    let through = p.ends_with('/') || p.ends_with("/.") || p.ends_with("/..");
    let mut out = format!("/{}", parts.join("/"));
    if through && !parts.is_empty() {
        out.push('/');
    }
    out
}

/// Whether an absolute path is part of the repository's own source.
fn in_repo_source(p: &str) -> bool {
    let p = p.trim_end_matches('/');
    p == "/workspace/repo"
        || p.strip_prefix("/workspace/repo/").is_some_and(|rest| {
            !rest.is_empty()
                && rest != "."
                && !REPO_ENV_DIRS
                    .iter()
                    .any(|d| format!("{rest}/").starts_with(d))
        })
}

/// The target of a recursive `rm` that is refused: a broad system path, or
/// the repository's own source.
fn broad_rm(cmd: &str) -> Option<String> {
    const BROAD: &[&str] = &[
        "/",
        "/*",
        "~",
        "~/",
        "$HOME",
        "*",
        "/workspace",
        "/usr",
        "/etc",
        "/var",
        "/root",
        "/home",
        "/opt",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64",
        "/boot",
        "/sys",
        "/proc",
        "/dev",
        "/srv",
        "/belay",
    ];
    for segment in cmd.split(['\n', ';', '&', '|', '(', ')', '{', '}']) {
        let words: Vec<&str> = segment.split_whitespace().collect();
        let pos = usize::from(words.first() == Some(&"sudo"));
        if !words
            .get(pos)
            .is_some_and(|w| *w == "rm" || w.ends_with("/rm"))
        {
            continue;
        }
        let mut recursive = false;
        let mut targets = Vec::new();
        let mut options_done = false;
        for w in &words[pos + 1..] {
            if !options_done && *w == "--" {
                options_done = true;
            } else if !options_done && w.starts_with("--") {
                recursive |= *w == "--recursive";
            } else if !options_done && w.starts_with('-') && w.len() > 1 {
                recursive |= w.contains('r') || w.contains('R');
            } else {
                targets.push(*w);
            }
        }
        if !recursive {
            continue;
        }
        for t in targets {
            let t = t.trim_matches(|c| c == '"' || c == '\'');
            let abs = absolute(t);
            let trimmed = abs.trim_end_matches('/');
            if BROAD.contains(&t)
                || BROAD.contains(&trimmed)
                || trimmed.is_empty()
                || in_repo_source(&abs)
            {
                return Some(t.to_string());
            }
        }
    }
    None
}

/// A file under /workspace/repo that `cmd` writes (redirection, tee, cp, mv,
/// install), other than the build environments belay owns there.
fn repo_write_target(cmd: &str) -> Option<String> {
    static REDIRECT: OnceLock<Option<Regex>> = OnceLock::new();
    let redirect = REDIRECT.get_or_init(|| Regex::new(r">>?\s*([^&\s]\S*)").ok());
    let in_repo_source = |p: &str| in_repo_source(&absolute(p));
    for segment in cmd.split(['\n', ';', '&', '|', '(', ')', '{', '}']) {
        if let Some(re) = redirect {
            for c in re.captures_iter(segment) {
                if in_repo_source(&c[1]) {
                    return Some(c[1].to_string());
                }
            }
        }
        let words: Vec<String> = shlex::split(segment)
            .unwrap_or_else(|| segment.split_whitespace().map(str::to_string).collect());
        if let Some(t) = in_place_edits(&words)
            .into_iter()
            .find(|t| in_repo_source(t))
        {
            return Some(t);
        }
        // The command word itself (after sudo), not an argument such as the
        // `install` of `apt-get install`.
        let pos = usize::from(words.first().is_some_and(|w| w == "sudo"));
        if !words
            .get(pos)
            .is_some_and(|w| matches!(w.as_str(), "tee" | "cp" | "mv" | "install"))
        {
            continue;
        }
        let args: Vec<&String> = words[pos + 1..]
            .iter()
            .filter(|w| !w.starts_with('-'))
            .collect();
        let targets: Vec<&String> = if words[pos] == "tee" {
            args
        } else {
            args.last().copied().into_iter().collect()
        };
        if let Some(t) = targets.into_iter().find(|t| in_repo_source(t)) {
            return Some(t.to_string());
        }
    }
    None
}

/// The files a `sed` or `perl` in a command's words edits in place (`-i`,
/// `-i.bak`, `-Ei`, `--in-place`), wherever it stands (after `sudo`, `env`,
/// `xargs` or `find -exec`). Files it cannot name (`{}` from find, stdin from
/// xargs) are the working directory, the repository: refused, as a fix that
/// edits files it found is an edit of the source.
fn in_place_edits(words: &[String]) -> Vec<String> {
    let Some((at, perl)) =
        words
            .iter()
            .enumerate()
            .find_map(|(n, w)| match w.rsplit('/').next().unwrap_or(w) {
                "sed" => Some((n, false)),
                "perl" => Some((n, true)),
                _ => None,
            })
    else {
        return Vec::new();
    };
    // The options whose value may be the next word: a script, or sed's
    // line length.
    let (takes_script, takes_value): (&[char], &[char]) = if perl {
        (&['e', 'E'], &['I', 'M', 'm', 'x', 'C', 'd', 'D', 'l', '0'])
    } else {
        (&['e', 'f'], &['l'])
    };
    let (mut in_place, mut script_given, mut files) = (false, false, Vec::new());
    let mut rest = words[at + 1..].iter();
    while let Some(w) = rest.next() {
        match w.as_str() {
            "{}" => files.push(".".to_string()),
            "+" | ";" | "\\;" => {}
            "--" => files.extend(rest.by_ref().cloned()),
            _ if w.starts_with("--") => {
                in_place |= w == "--in-place" || w.starts_with("--in-place=");
                script_given |= w.starts_with("--expression") || w.starts_with("--file");
                if matches!(w.as_str(), "--expression" | "--file" | "--line-length") {
                    rest.next();
                }
            }
            _ if w.starts_with('-') && w.len() > 1 => {
                for (n, c) in w.char_indices().skip(1) {
                    let last = n + c.len_utf8() == w.len();
                    if c == 'i' {
                        in_place = true; // the rest is its suffix
                        break;
                    }
                    if takes_script.contains(&c) {
                        script_given = true;
                    }
                    if takes_script.contains(&c) || takes_value.contains(&c) {
                        if last
                            && !(perl
                                && matches!(c, 'l' | '0' | 'M' | 'm' | 'I' | 'x' | 'C' | 'd' | 'D'))
                        {
                            rest.next();
                        }
                        break;
                    }
                }
            }
            _ => files.push(w.clone()),
        }
    }
    if !in_place {
        return Vec::new();
    }
    // Without -e or -f, the first operand is the script.
    if !script_given && !files.is_empty() {
        files.remove(0);
    }
    if files.is_empty() {
        files.push(".".to_string());
    }
    files
}

/// Why a command is refused as a probe, or `None` when it is an acceptable probe.
pub fn check_probe(cmd: &str) -> Option<String> {
    if cmd.contains('\n') || cmd.trim().is_empty() {
        return Some("a probe is a single non-empty line".into());
    }
    if let Some(why) = check_repair(cmd) {
        return Some(why);
    }
    // Discarding output is fine; writing it anywhere else is not.
    let stripped = cmd
        .replace("2>/dev/null", "")
        .replace(">/dev/null", "")
        .replace("> /dev/null", "")
        .replace("2>&1", "");
    for (re, why) in probe_rules() {
        if re.is_match(&stripped) {
            return Some(format!("refused probe `{cmd}`: {why}"));
        }
    }
    None
}

fn one_line(cmd: &str) -> String {
    let l: String = cmd.lines().next().unwrap_or("").chars().take(120).collect();
    if cmd.lines().count() > 1 {
        format!("{l} ...")
    } else {
        l
    }
}

fn compile(rules: &[(&str, &'static str)]) -> Vec<(Regex, &'static str)> {
    rules
        .iter()
        .filter_map(|(p, why)| Regex::new(p).ok().map(|r| (r, *why)))
        .collect()
}

fn repair_rules() -> &'static [(Regex, &'static str)] {
    static R: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    R.get_or_init(|| {
        compile(&[
            (r"(^|[\s;&|(`])(sudo\s+)?(\S*/)?(docker|podman|nerdctl|ctr|crictl)(\s|$)", "container engines are off limits inside the sandbox"),
            (r"/var/run/docker\.sock|/run/docker\.sock", "the Docker socket is off limits"),
            (r"\bgit\b[^;&|\n]*\spush\b", "pushing is the commit point's job, never a repair's"),
            (r"\bmkfs(\.\w+)?\b|\bmke2fs\b|\bwipefs\b|\bfdisk\b|\bparted\b", "making or changing filesystems is refused"),
            (r"\bdd\s+[^\n]*\bof=/dev/", "writing to devices is refused"),
            (r"\b(shutdown|reboot|halt|poweroff)\b|\bkill\s+-9\s+-1\b", "stopping the machine is refused"),
            (r"\bgit\b[^;&|\n]*\s(checkout|reset|clean|stash|apply|am|rebase|merge|commit|restore|switch)\b", "changing the repository through git is refused"),
        ])
    })
}

fn probe_rules() -> &'static [(Regex, &'static str)] {
    static R: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    R.get_or_init(|| {
        compile(&[
            (r"\b(apt-get|apt|aptitude|dpkg\s+-i|apk|dnf|yum)\s+(install|add|upgrade|update|remove|purge)\b", "probes do not install"),
            (r"\b(pip3?|python3?\s+-m\s+pip|uv|poetry|pipenv|npm|yarn|pnpm|cargo|go|gem|mvn|gradle)\s+(install|add|ci|sync|get|fetch|download|update|upgrade|build)\b", "probes do not install or fetch"),
            (r"\b(curl|wget|nc|ncat|telnet|ssh|scp|rsync|ftp)\b|/dev/tcp/", "probes use no network"),
            (r">\s*[^&\s]|\btee\b|\b(rm|mv|cp|mkdir|touch|chmod|chown|ln|sed\s+-i)\b", "probes are read-only"),
        ])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repairs_that_are_refused() {
        for cmd in [
            "docker run --rm -v /:/host debian",
            "sudo podman build .",
            "curl --unix-socket /var/run/docker.sock http://x/containers/json",
            "git push origin HEAD",
            "git -c user.name=x push --force",
            "mkfs.ext4 /dev/sda1",
            "dd if=/dev/zero of=/dev/sda bs=1M",
            "rm -rf -- /",
            "rm --recursive --force /",
            "rm -rf /workspace/repo/src",
            "rm -rf src",
            "/usr/bin/docker ps",
            "git -C /workspace/repo push",
            "git --git-dir=/workspace/repo/.git reset --hard",
            "echo x > setup.py",
            "cp /tmp/a.py src/x.py",
            "{ true; } && { cp /tmp/a.py src/x.py; }",
            "rm -rf /",
            "rm -rf /*",
            "rm -fr ~",
            "rm -rf /workspace/repo",
            "rm -r -f /usr",
            "cd /workspace/repo && rm -rf .",
            "sed -i 's/==1.2/>=1.2/' requirements.txt",
            "sed -i.bak 's/x/y/' /workspace/repo/setup.py",
            "echo 'import os' >> /workspace/repo/src/pkg/__init__.py",
            "cp /tmp/patched.py /workspace/repo/src/app.py",
            "cat x | tee -a /workspace/repo/setup.cfg",
            "git checkout -- .",
            "git -C /workspace/repo reset --hard",
            // The checkout under its clone's name is the checkout.
            "rm -rf /workspace/mqemitter/",
            "rm -rf /workspace/mqemitter/lib",
            "sed -i 's/a/b/' /workspace/mqemitter/index.js",
            "echo x > /workspace/mqemitter/x.js",
            "echo 'a > b' > setup.py",
            "echo don\\'t > setup.py",
            "echo \"a \\\" > b\" > setup.py",
            "echo x >'/workspace/repo/setup.py'",
            // The path as the kernel walks it.
            "sed -i 's/x/y/' /workspace/./repo/setup.py",
            "sed -i 's/x/y/' //workspace/repo/setup.py",
            "echo x > //workspace//repo/setup.py",
            "cp /tmp/a.py /workspace/repo/.venv/../src/a.py",
            "rm -rf /workspace/repo/node_modules/../src",
            "rm -rf ../repo/lib",
            "rm -rf //",
            // In-place edits, however spelled and wherever they stand.
            "sed -E -i 's/a/b/' setup.py",
            "sed --in-place=.bak 's/a/b/' Makefile",
            "sudo sed -i -e 's/a b/c/' 'my file.py'",
            "perl -pi -e 's/a/b/' lib/x.pm",
            "perl -i.bak -pe 's/a/b/' /workspace/repo/x.pl",
            "grep -rl foo . | xargs sed -i 's/a/b/'",
            "find . -name '*.js' -exec sed -i 's/a/b/' {} +",
        ] {
            assert!(check_repair(cmd).is_some(), "should refuse: {cmd}");
        }
    }

    #[test]
    fn repairs_that_are_allowed() {
        for cmd in [
            "apt-get install -y --no-install-recommends libffi-dev",
            "python3 -m venv /workspace/repo/.venv",
            "/workspace/repo/.venv/bin/python -m pip install pyyaml",
            "rm -rf /workspace/repo/.venv",
            "rm -rf /tmp/build-cache",
            "rm -rf .venv node_modules",
            "make 2>&1 > /tmp/make.log",
            "pip install x 2>/dev/null",
            "echo 'export PATH=/usr/local/bin:$PATH' > /etc/profile.d/belay.sh",
            "echo '[global]' > /workspace/repo/.venv/pip.conf",
            "cp /workspace/repo/requirements.txt /tmp/req.txt",
            "sed -E 's/==.*//' requirements.txt > /tmp/belay-relaxed.txt",
            "chmod +x gradlew",
            "npm install -g node@20",
            "dockerize-thing --help",
            "rm -rf /workspace/mqemitter/node_modules",
            "rm -f /workspace/mqemitter",
            "echo done > /workspace/build.log",
            "sed -i 's/a/b/' /workspace/repo/.venv/lib/python3.11/site-packages/x.py",
            "sed -i 's|a|b|' /workspace/mqemitter/node_modules/x/index.js",
            "sed -i 's/deb.debian.org/mirror/' /etc/apt/sources.list",
            "perl -pi -e 's/a/b/' /usr/share/perl5/X.pm",
            "sed -n 's/x/y/p' setup.py",
            "apt-get install -y sed perl",
            "sed -e 's/==.*//' -i /tmp/req.txt",
            // The node-engine repair of a range that narrows the line.
            "npm install -g --no-audit --no-fund --force node@'14.x >=14.17.0 <15' npm@9 && hash -r && node --version",
            "npm install -g node@'16.x ~16.13 || 16.x >=16.14 <17' && hash -r",
        ] {
            assert_eq!(check_repair(cmd), None, "should allow: {cmd}");
        }
    }

    #[test]
    fn probes() {
        for ok in [
            "dpkg -s libffi-dev",
            "command -v gcc",
            "python3 -c 'import ssl'",
            "ls /usr/include/ffi.h",
            "pkg-config --exists libpq 2>/dev/null",
        ] {
            assert_eq!(check_probe(ok), None, "{ok}");
        }
        for bad in [
            "apt-get install -y gcc",
            "pip install requests",
            "python -m pip install x",
            "curl http://example.invalid",
            "echo x > /etc/passwd",
            "rm /tmp/x",
            "ls\nrm -rf /",
            "",
        ] {
            assert!(check_probe(bad).is_some(), "{bad:?}");
        }
    }
}
