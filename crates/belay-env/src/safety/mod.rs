//! The safety filter for repair commands and probes.
//!
//! A repair may install packages and set up the environment; it may not touch
//! the container engine, push anything, make filesystems, delete broadly, or
//! edit the repository's own source. Probes are stricter: one line, read-only,
//! no installs, no network.

use crate::shell::{program_name, Command, Text};
use regex::Regex;
use std::sync::OnceLock;

/// How deep `sh -c '…'` and `eval` are read into.
const MAX_NESTING: usize = 4;

/// Why a command is refused, or `None` when it may run as a repair.
pub fn check_repair(cmd: &str) -> Option<String> {
    check_nested(cmd, 0, belay_sandbox::layout::REPO)
        .map(|why| format!("refused `{}`: {why}", one_line(cmd)))
}

/// Why a program is never run by a repair, wherever it stands (after
/// `sudo`, `A=1`, `then`, in `$(…)`), or `None`.
fn refused_program(name: &str) -> Option<&'static str> {
    match name {
        "docker" | "podman" | "nerdctl" | "ctr" | "crictl" => {
            Some("container engines are off limits inside the sandbox")
        }
        "shutdown" | "reboot" | "halt" | "poweroff" => Some("stopping the machine is refused"),
        _ => None,
    }
}

/// `cmd` read from the working directory `cwd`, `depth` shells deep.
fn check_nested(cmd: &str, depth: usize, cwd: &str) -> Option<String> {
    for (re, why) in repair_rules() {
        if re.is_match(cmd) {
            return Some((*why).to_string());
        }
    }
    let text = Text::read(cmd);
    let commands = text.commands();
    let mut cwd = Cwd::new(cwd);
    let mut fed: Option<&Command> = None;
    for c in &commands {
        cwd.enter(c.opened_by);
        if let Some(why) = c.program().and_then(|(_, name)| refused_program(&name)) {
            return Some(why.to_string());
        }
        // What runs in a shell of its own: `sh -c '…'`, `eval`, `$(…)`.
        for inner in nested_script(c).into_iter().chain(substitutions(&c.clean)) {
            if depth >= MAX_NESTING {
                return Some(
                    "shells nested more than four deep are not read: write the commands out in the fix itself".into(),
                );
            }
            if let Some(why) = check_nested(&inner, depth + 1, cwd.dir()) {
                return Some(why);
            }
        }
        let input = Input {
            cwd: cwd.dir(),
            fed: fed.filter(|_| c.opened_by == Some('|')),
        };
        if let Some(target) = deleted(c, &input) {
            return Some(format!(
                "deleting {target} is refused (only build environments such as .venv, node_modules, build and target under the repository, or paths outside it, may go)"
            ));
        }
        if let Some(path) = written(c, &input) {
            return Some(format!(
                "it writes {path}, part of the repository's own source (repairs change the environment, not the project)"
            ));
        }
        cwd.follow(c);
        fed = Some(c);
    }
    None
}

/// Where a command runs: its working directory, and the command whose
/// output its stdin is (for `… | xargs rm`).
struct Input<'a> {
    cwd: &'a str,
    fed: Option<&'a Command>,
}

impl Input<'_> {
    /// The paths `xargs` hands on: what the command before it in the
    /// pipeline lists (grep's and ls's operands, find's starting points),
    /// else the working directory's.
    fn fed_paths(&self) -> Vec<String> {
        let Some((at, name)) = self.fed.and_then(Command::program) else {
            return vec![".".to_string()];
        };
        let words = self.fed.map_or(&[][..], |f| &f.words[at..]);
        let operands: Vec<String> = words[1..]
            .iter()
            .filter(|w| !w.starts_with('-'))
            .cloned()
            .collect();
        let listed = match name.as_str() {
            "find" => find_roots(words),
            // The first operand is the pattern, unless -e or -f gave it.
            "grep" | "egrep" | "rg" => {
                let pattern_given = words.iter().any(|w| w == "-e" || w == "-f");
                operands
                    .into_iter()
                    .skip(usize::from(!pattern_given))
                    .collect()
            }
            "ls" => operands,
            _ => Vec::new(),
        };
        if listed.is_empty() {
            vec![".".to_string()]
        } else {
            listed
        }
    }

    /// Whether the command before is a `find` of build products only.
    fn fed_build_products(&self) -> bool {
        self.fed
            .and_then(|f| f.program().map(|(at, name)| (name, &f.words[at..])))
            .is_some_and(|(name, words)| name == "find" && only_build_products(words))
    }
}

/// The scripts of `$(…)` and `` `…` `` in a command's text (quoted ones
/// too: a double-quoted substitution runs).
fn substitutions(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && b.get(i + 1) == Some(&b'(') && b.get(i + 2) != Some(&b'(') {
            let (mut depth, start) = (0usize, i + 2);
            let mut j = i + 1;
            while j < b.len() {
                match b[j] {
                    b'(' => depth += 1,
                    b')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            out.push(text[start..j.min(b.len())].to_string());
            i = j + 1;
        } else if b[i] == b'`' {
            let end = text[i + 1..].find('`').map_or(b.len(), |n| i + 1 + n);
            out.push(text[i + 1..end].to_string());
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The working directory as the commands run: the repository, until a `cd`
/// to a path that can be read; a subshell's `cd` ends with it.
struct Cwd {
    stack: Vec<String>,
    dir: String,
}

impl Cwd {
    fn new(start: &str) -> Self {
        Self {
            stack: Vec::new(),
            dir: start.to_string(),
        }
    }
    fn dir(&self) -> &str {
        &self.dir
    }
    fn enter(&mut self, opened_by: Option<char>) {
        match opened_by {
            Some('(') => self.stack.push(self.dir.clone()),
            Some(')') => {
                if let Some(d) = self.stack.pop() {
                    self.dir = d;
                }
            }
            _ => {}
        }
    }
    /// A `cd DIR` (or `pushd DIR`) moves; `cd` to what cannot be read
    /// (`cd`, `cd -`, `cd $X`) is the repository still, as the filter
    /// fails safe.
    fn follow(&mut self, c: &Command) {
        let Some((at, name)) = c.program() else {
            return;
        };
        if name != "cd" && name != "pushd" {
            return;
        }
        self.dir = match c.words.get(at + 1) {
            // A fresh temporary directory (`cd "$(mktemp -d)"`).
            Some(d) if d.starts_with("$(mktemp") => "/tmp/mktemp".to_string(),
            Some(d) if !d.starts_with(['$', '~', '-', '`']) => absolute(d, &self.dir),
            _ => belay_sandbox::layout::REPO.to_string(),
        };
    }
}

/// The script a command runs in a shell of its own: `sh -c '…'`, `bash -ec
/// '…'`, `eval …`.
fn nested_script(c: &Command) -> Option<String> {
    let (at, name) = c.program()?;
    let args = &c.words[at + 1..];
    match name.as_str() {
        "eval" => Some(args.join(" ")),
        "sh" | "bash" | "dash" | "zsh" | "ksh" | "su" => {
            let flag = args.iter().position(|a| {
                a == "--command" || (a.starts_with('-') && !a.starts_with("--") && a.contains('c'))
            })?;
            args.get(flag + 1).cloned()
        }
        _ => None,
    }
}

/// Directories that are build environments, not source: anywhere in the
/// repository (a workspace's `packages/app/node_modules`) ...
const ENV_DIRS_ANYWHERE: [&str; 7] = [
    "node_modules",
    ".venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".tox",
    ".eggs",
];
/// ... or at its top (a `build/` deeper down may be source).
const ENV_DIRS_AT_TOP: [&str; 4] = ["build", "target", "dist", "venv"];

/// Fixes run in /workspace/repo: a path is read from the working directory
/// `cwd` (the repository unless a `cd` moved it), as the kernel walks it
/// (`//`, `.` and `..`: `/workspace/./repo/x`, `.venv/../setup.py`). A path
/// under another name in `/workspace` that no mode mounts at is the
/// repository's too: the checkout's clone name links there
/// (`plan::checkout_link`).
fn absolute(p: &str, cwd: &str) -> String {
    use belay_sandbox::layout::{reserved, REPO, WORKSPACE};
    let p = p.trim_matches(|c| c == '"' || c == '\'');
    let pwd = ["${PWD}", "$PWD"]
        .iter()
        .find_map(|v| p.strip_prefix(v))
        .map(|rest| format!("{cwd}{rest}"));
    let p = pwd.as_deref().unwrap_or(p);
    if p.starts_with('~') || p.starts_with('$') {
        return p.to_string();
    }
    let p = lexical(&if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{cwd}/{p}")
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
    if p == "/workspace/repo" {
        return true;
    }
    let Some(rest) = p.strip_prefix("/workspace/repo/") else {
        return false;
    };
    let mut parts = rest.split('/');
    let top = parts.next().unwrap_or("");
    let env = |d: &str| ENV_DIRS_ANYWHERE.contains(&d) || d.ends_with(".egg-info");
    !(ENV_DIRS_AT_TOP.contains(&top) || env(top) || rest.split('/').any(env))
}

/// Paths `rm` must never take, recursively or not.
const BROAD: &[&str] = &[
    "/",
    "/*",
    "~",
    "~/",
    "$HOME",
    "*",
    "/workspace",
    "/workspace/*",
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

/// What an `rm` deletes that is refused: a broad system path, the
/// repository's own source, or (recursively) whatever an unset variable
/// makes of `$X/`.
fn deleted(c: &Command, input: &Input) -> Option<String> {
    let cwd = input.cwd;
    let (at, name) = c.program()?;
    if name == "find" {
        return found_and_deleted(&c.words[at..], cwd);
    }
    if name != "rm" && name != "unlink" {
        return None;
    }
    if c.words[..at].iter().any(|w| program_name(w) == "xargs") {
        if input.fed_build_products() {
            return None;
        }
        return input
            .fed_paths()
            .into_iter()
            .find(|p| in_repo_source(&absolute(p, cwd)))
            .map(|p| format!("{p} (what xargs is fed)"));
    }
    let mut recursive = false;
    let mut targets = Vec::new();
    let mut options_done = false;
    for w in &c.words[at + 1..] {
        if !options_done && w == "--" {
            options_done = true;
        } else if !options_done && w.starts_with("--") {
            recursive |= w == "--recursive";
        } else if !options_done && w.starts_with('-') && w.len() > 1 {
            recursive |= w.contains('r') || w.contains('R');
        } else {
            targets.push(w.as_str());
        }
    }
    targets.into_iter().find_map(|t| {
        let abs = absolute(t, cwd);
        let trimmed = abs.trim_end_matches('/');
        // `$PREFIX/` with PREFIX unset is `/`; `${PREFIX:?}/` fails first.
        let unset_var = recursive
            && t.starts_with('$')
            && !t.contains(":?")
            && t.split_once('/')
                .is_some_and(|(_, rest)| matches!(rest, "" | "*"));
        // Everything in a broad directory (`/usr/*`).
        let all_of_broad = trimmed
            .strip_suffix("/*")
            .is_some_and(|d| BROAD.contains(&d) || d.is_empty());
        (BROAD.contains(&t)
            || BROAD.contains(&trimmed)
            || trimmed.is_empty()
            || unset_var
            || all_of_broad
            || in_repo_source(&abs))
        .then(|| t.to_string())
    })
}

/// Whether a `find`'s `-name`s are all build products (`__pycache__`,
/// `*.pyc`, `*.egg-info`), and it has no `-o` that finds anything else.
fn only_build_products(words: &[String]) -> bool {
    let names: Vec<&str> = words
        .iter()
        .enumerate()
        .filter(|(_, w)| matches!(w.as_str(), "-name" | "-iname"))
        .filter_map(|(n, _)| words.get(n + 1).map(String::as_str))
        .collect();
    !names.is_empty()
        && !words.iter().any(|w| w == "-o" || w == "-or")
        && names.iter().all(|n| {
            ENV_DIRS_ANYWHERE.contains(n)
                || n.ends_with(".egg-info")
                || matches!(
                    *n,
                    "*.pyc" | "*.pyo" | "*.o" | "*.so" | "*.gcda" | "*.tsbuildinfo"
                )
        })
}

/// What `find … -delete` or `find … -exec rm` deletes in the repository's
/// source: everything it finds under its starting points, unless it finds
/// build products only.
fn found_and_deleted(words: &[String], cwd: &str) -> Option<String> {
    let deletes = words.iter().enumerate().any(|(n, w)| {
        w == "-delete"
            || (matches!(w.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir")
                && words
                    .get(n + 1)
                    .is_some_and(|p| matches!(program_name(p).as_str(), "rm" | "unlink")))
    });
    if !deletes || only_build_products(words) {
        return None;
    }
    find_roots(words)
        .into_iter()
        .find(|r| in_repo_source(&absolute(r, cwd)))
}

/// A file of the repository's source that a command writes: by a
/// redirection, as the target of `tee`, `cp`, `mv` (either end), `install`,
/// `ln`, `touch`, `truncate`, `dos2unix`, `patch`, `rsync`, `tar x`, `curl
/// -o`/`-O`, `wget`, or by an in-place `sed` or `perl`.
fn written(c: &Command, input: &Input) -> Option<String> {
    static REDIRECT: OnceLock<Option<Regex>> = OnceLock::new();
    let redirect = REDIRECT.get_or_init(|| Regex::new(r">[>|&]?\s*([^&\s]\S*)").ok());
    let source = |p: &str| in_repo_source(&absolute(p, input.cwd));
    if let Some(re) = redirect {
        for m in re.captures_iter(&c.masked).filter_map(|m| m.get(1)) {
            let target = c.clean.get(m.range()).unwrap_or(m.as_str());
            // `2>&1`, `>&-`: a descriptor, no file.
            let descriptor = target.chars().all(|d| d.is_ascii_digit() || d == '-');
            if !descriptor && source(target) {
                return Some(target.to_string());
            }
        }
    }
    if let Some(t) = in_place_edits(&c.words, input)
        .into_iter()
        .find(|t| source(t))
    {
        return Some(t);
    }
    let (at, name) = c.program()?;
    write_targets(&name, &c.words[at + 1..])
        .into_iter()
        .find(|t| source(t))
}

/// A command's arguments: its options (with their values) and operands.
struct Args {
    options: Vec<(String, String)>,
    operands: Vec<String>,
}

impl Args {
    /// `valued`: the options whose value is the rest of the cluster or the
    /// next word (`-o FILE`, `-fsSLo FILE`, `--output FILE`, `--output=F`).
    fn parse(args: &[String], valued: &[&str]) -> Self {
        let (mut options, mut operands) = (Vec::new(), Vec::new());
        let mut rest = args.iter();
        while let Some(a) = rest.next() {
            if a == "--" {
                operands.extend(rest.by_ref().cloned());
            } else if let Some(long) = a.strip_prefix("--") {
                match long.split_once('=') {
                    Some((k, v)) => options.push((format!("--{k}"), v.to_string())),
                    None if valued.contains(&a.as_str()) => {
                        options.push((a.clone(), rest.next().cloned().unwrap_or_default()))
                    }
                    None => options.push((a.clone(), String::new())),
                }
            } else if a.starts_with('-') && a.len() > 1 {
                for (n, ch) in a.char_indices().skip(1) {
                    let opt = format!("-{ch}");
                    if valued.contains(&opt.as_str()) {
                        let attached = &a[n + ch.len_utf8()..];
                        let v = if attached.is_empty() {
                            rest.next().cloned().unwrap_or_default()
                        } else {
                            attached.to_string()
                        };
                        options.push((opt, v));
                        break;
                    }
                    options.push((opt, String::new()));
                }
            } else {
                operands.push(a.clone());
            }
        }
        Self { options, operands }
    }

    fn values(&self, names: &[&str]) -> Vec<String> {
        self.options
            .iter()
            .filter(|(k, v)| names.contains(&k.as_str()) && !v.is_empty() && v != "-")
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn has(&self, names: &[&str]) -> bool {
        self.options
            .iter()
            .any(|(k, _)| names.contains(&k.as_str()))
    }
}

/// The paths a program writes, from its arguments (`.`: files of the
/// working directory it names no further).
fn write_targets(name: &str, args: &[String]) -> Vec<String> {
    let parse = |valued: &[&str]| Args::parse(args, valued);
    match name {
        "tee" | "dos2unix" | "unix2dos" => parse(&[]).operands,
        "touch" => parse(&["-d", "-t", "-r", "--date", "--reference"]).operands,
        "truncate" => parse(&["-s", "-r", "--size", "--reference"]).operands,
        "mv" => {
            let a = parse(&["-t", "--target-directory", "-S", "--suffix"]);
            let mut t = a.values(&["-t", "--target-directory"]);
            t.extend(a.operands);
            t
        }
        "cp" | "install" | "ln" | "rsync" => {
            let a = parse(&[
                "-t",
                "--target-directory",
                "-S",
                "--suffix",
                "-m",
                "--mode",
                "-o",
                "-g",
                "-e",
            ]);
            let mut t = a.values(&["-t", "--target-directory"]);
            t.extend(a.operands.last().cloned());
            t
        }
        "patch" => {
            let a = parse(&[
                "-i",
                "--input",
                "-d",
                "--directory",
                "-o",
                "--output",
                "-p",
                "-r",
                "-B",
                "-V",
                "-z",
                "-F",
                "-D",
            ]);
            if a.has(&["-v", "--version", "--help"]) {
                return Vec::new();
            }
            let out = a.values(&["-o", "--output"]);
            let dir = a.values(&["-d", "--directory"]);
            match (out.is_empty(), a.operands.first()) {
                (false, _) => out,
                (true, Some(file)) => vec![file.clone()],
                (true, None) if !dir.is_empty() => dir,
                (true, None) => vec![".".to_string()],
            }
        }
        "tar" => {
            let a = parse(&["-f", "--file", "-C", "--directory", "-T", "-X", "-b", "-I"]);
            // Old style: `tar xzf F` — the first word's letters are options.
            let old_x = args
                .first()
                .is_some_and(|w| !w.starts_with('-') && w.contains('x'));
            if !(old_x || a.has(&["-x", "--extract", "--get"])) {
                return Vec::new();
            }
            let dir = a.values(&["-C", "--directory"]);
            if dir.is_empty() {
                vec![".".to_string()]
            } else {
                dir
            }
        }
        "curl" => {
            let a = parse(&[
                "-o",
                "--output",
                "-H",
                "--header",
                "-d",
                "--data",
                "-u",
                "--user",
                "-A",
                "-X",
                "-e",
                "-b",
                "-c",
                "-K",
                "-T",
                "-w",
                "-m",
                "-C",
                "-x",
                "-r",
                "-E",
                "--output-dir",
                "--retry",
                "--max-time",
                "--connect-timeout",
                "--cacert",
            ]);
            let mut t = a.values(&["-o", "--output"]);
            if a.has(&["-O", "--remote-name", "--remote-name-all"]) {
                let dir = a.values(&["--output-dir"]);
                t.push(dir.into_iter().next().unwrap_or_else(|| ".".to_string()));
            }
            t
        }
        "wget" => {
            let a = parse(&[
                "-O",
                "--output-document",
                "-P",
                "--directory-prefix",
                "-o",
                "--output-file",
                "-a",
                "-t",
                "--tries",
                "-T",
                "-U",
                "-e",
                "--header",
            ]);
            let out = a.values(&["-O", "--output-document"]);
            // `-O -` writes to stdout; without -O, a file in -P's directory.
            let to_stdout = a
                .options
                .iter()
                .any(|(k, v)| (k == "-O" || k == "--output-document") && v == "-");
            match (out.is_empty(), to_stdout) {
                (false, _) => out,
                (true, true) => Vec::new(),
                (true, false) => {
                    let dir = a.values(&["-P", "--directory-prefix"]);
                    dir.into_iter()
                        .next()
                        .map_or_else(|| vec![".".to_string()], |d| vec![d])
                }
            }
        }
        _ => Vec::new(),
    }
}

/// The files a `sed` or `perl` in a command's words edits in place (`-i`,
/// `-i.bak`, `-Ei`, `-0pi`, `--in-place`), wherever it stands. Files it
/// cannot name are the working directory's (`.`), refused where that is the
/// repository: what `xargs` feeds it, a `$(…)` list, and, under `find
/// -exec`, find's own starting points.
fn in_place_edits(words: &[String], input: &Input) -> Vec<String> {
    let Some((at, perl)) =
        words
            .iter()
            .enumerate()
            .find_map(|(n, w)| match program_name(w).as_str() {
                "sed" => Some((n, false)),
                "perl" => Some((n, true)),
                _ => None,
            })
    else {
        return Vec::new();
    };
    let (mut in_place, mut script_given, mut files) = (false, false, Vec::new());
    let mut rest = words[at + 1..].iter();
    while let Some(w) = rest.next() {
        match w.as_str() {
            "{}" | "$" => files.push(".".to_string()),
            "+" | ";" | "\\;" => {}
            "--" => files.extend(rest.by_ref().cloned()),
            _ if w.starts_with("$(") || w.starts_with('`') => files.push(".".to_string()),
            // A file a variable names (`"$f"` of a loop over grep's
            // matches) is the working directory's, unless the variable is
            // one of the environment's own.
            _ if w.starts_with('$') && !ENV_VARS.iter().any(|v| w.starts_with(v)) => {
                files.push(".".to_string())
            }
            _ if w.starts_with("--") => {
                in_place |= w == "--in-place" || w.starts_with("--in-place=");
                script_given |= w.starts_with("--expression") || w.starts_with("--file");
                if matches!(w.as_str(), "--expression" | "--file" | "--line-length") {
                    rest.next();
                }
            }
            _ if w.starts_with('-') && w.len() > 1 => {
                let (i, script, skip_next) = short_options(w, perl);
                in_place |= i;
                script_given |= script;
                if skip_next {
                    rest.next();
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
    let before = &words[..at];
    if before.iter().any(|w| program_name(w) == "xargs") {
        files.extend(input.fed_paths());
    }
    if before
        .iter()
        .any(|w| matches!(w.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir"))
    {
        files.retain(|f| f != ".");
        files.extend(find_roots(before));
    }
    if files.is_empty() {
        files.push(".".to_string());
    }
    files
}

/// Variables that name the environment, not the repository.
const ENV_VARS: &[&str] = &[
    "$HOME",
    "${HOME}",
    "$VIRTUAL_ENV",
    "${VIRTUAL_ENV}",
    "$TMPDIR",
    "${TMPDIR}",
    "$PWD",
    "${PWD}",
];

/// A cluster of short options of sed or perl: whether it edits in place,
/// whether it gives the script, and whether its value is the next word.
fn short_options(w: &str, perl: bool) -> (bool, bool, bool) {
    let chars: Vec<char> = w.chars().skip(1).collect();
    let mut n = 0;
    while let Some(&c) = chars.get(n) {
        let last = n + 1 == chars.len();
        match (c, perl) {
            // The rest is the backup suffix.
            ('i', _) => return (true, false, false),
            ('e' | 'f', false) | ('e' | 'E', true) => return (false, true, last),
            ('l', false) => return (false, false, last),
            // perl's `-0777`, `-0x1F`, `-l015`: a number, then more options.
            ('0' | 'l', true) => {
                n += 1;
                let hex = c == '0' && chars.get(n) == Some(&'x');
                if hex {
                    n += 1;
                }
                while chars.get(n).is_some_and(|d| {
                    if hex {
                        d.is_ascii_hexdigit()
                    } else {
                        ('0'..='7').contains(d)
                    }
                }) {
                    n += 1;
                }
                continue;
            }
            // perl's options whose value is the rest of the word.
            ('I' | 'M' | 'm' | 'x' | 'C' | 'd' | 'D', true) => return (false, false, false),
            _ => {}
        }
        n += 1;
    }
    (false, false, false)
}

/// find's starting points: its operands before the first test or action
/// (`.` where it names none).
fn find_roots(before: &[String]) -> Vec<String> {
    let Some(at) = before.iter().position(|w| program_name(w) == "find") else {
        return vec![".".to_string()];
    };
    let roots: Vec<String> = before[at + 1..]
        .iter()
        .take_while(|w| !w.starts_with('-') && !matches!(w.as_str(), "(" | "!" | "\\(" | "\\!"))
        .cloned()
        .collect();
    if roots.is_empty() {
        vec![".".to_string()]
    } else {
        roots
    }
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
            (r"/var/run/docker\.sock|/run/docker\.sock", "the Docker socket is off limits"),
            (r"\bgit\b[^;&|\n]*\spush\b", "pushing is the commit point's job, never a repair's"),
            (r"\bmkfs(\.\w+)?\b|\bmke2fs\b|\bwipefs\b|\bfdisk\b|\bparted\b", "making or changing filesystems is refused"),
            (r"\bdd\s+[^\n]*\bof=/dev/", "writing to devices is refused"),
            (r"\bkill\s+-9\s+-1\b", "stopping the machine is refused"),
            (r"\bgit\b[^;&|\n]*\s(checkout|reset|clean|stash|apply|am|rebase|merge|commit|restore|switch|rm|mv|pull)\b", "changing the repository through git is refused"),
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
            // A comment or a here-document hides nothing after it.
            "# don't touch the lockfile\nrm -rf src",
            "# it's broken upstream\ncp /tmp/fixed.py src/app.py",
            "cat > /tmp/c.txt <<'EOF'\nit's\nEOF\necho x > setup.py",
            // Shells inside the command, and what runs a program.
            "bash -c \"sed -i 's/a/b/' setup.py\"",
            "sh -ec 'echo x > setup.py'",
            "eval \"rm -rf src\"",
            "/bin/cp /tmp/x.py src/x.py",
            "env LC_ALL=C cp /tmp/x.py src/x.py",
            "sudo -E rm -rf src",
            "\\rm -rf src",
            "cp -t src /tmp/x.py",
            "echo x >| setup.py",
            "echo x >& setup.py",
            // Deleting, moving, touching and patching source files.
            "rm -f package-lock.json",
            "mv .npmrc /tmp/npmrc.bak",
            "touch src/__init__.py",
            "patch -p1 < /tmp/fix.diff",
            "curl -fsSLo gradle/wrapper/gradle-wrapper.jar https://example.invalid/x.jar",
            "wget -O setup.cfg https://example.invalid/x",
            "perl -0pi -e 's/a/b/' setup.py",
            "perl -lpi -e 's/a/b/' setup.py",
            "sed -i 's/a/b/' $(grep -rl collections.Mapping src)",
            "find . -name '*.py' -exec sed -i 's/a/b/' /dev/null {} +",
            "rm -rf /workspace/*",
            "rm -rf $PREFIX/",
            "cd /tmp && cd /workspace/repo/src && rm -rf .",
            "(cd /tmp && make) && rm -rf src",
            "find . -type f -delete",
            "find src -name '*.js' -exec rm -f {} +",
            "git ls-files | xargs rm -f",
            // Behind a shell keyword, in a loop, a substitution or a variable.
            "if [ -f package-lock.json ]; then rm -f package-lock.json; fi",
            "if [ ! -f setup.cfg ]; then cp /tmp/setup.cfg setup.cfg; fi",
            "while true; do rm -rf src; break; done",
            "for f in $(grep -rl collections.Mapping src); do sed -i 's/a/b/' \"$f\"; done",
            "grep -rl X src | while read -r f; do sed -i 's/a/b/' \"$f\"; done",
            "sed -i 's/a/b/' \"$PWD/setup.py\"",
            "echo x > \"${PWD}/setup.py\"",
            "echo \"$(rm -rf src)\"",
            "echo `cp /tmp/a src/a`",
            "X=1 docker ps",
            "time docker ps",
            "then reboot",
            "echo $(docker ps)",
            "echo \"`/usr/bin/podman ps`\"",
            "xargs -0 docker rm",
            // Continued lines, here-strings, `${#x}`.
            "cd /tmp && cp /tmp/p.py \\\n  /workspace/repo/src/app.py",
            "read -r v <<< \"$x\"\nrm -rf src",
            "echo ${#PATH}; rm -rf src",
            // Writers read from their options.
            "patch -p1 -i /tmp/fix.diff",
            "wget -qO gradle/wrapper/gradle-wrapper.jar https://example.invalid/x.jar",
            "cd gradle/wrapper && curl -fsSLO https://example.invalid/x.jar",
            "wget https://example.invalid/x.tgz",
            "tar xzf /tmp/x.tgz",
            "tar -xzf /tmp/x.tgz -C /workspace/repo/src",
            "rsync -a /tmp/fixed/ /workspace/repo/",
            "unlink setup.py",
            "git rm -f setup.py",
            "rm -rf /usr/*",
            "find . -name '*.pyc' -o -type f -delete",
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
            // Comments, here-documents and descriptors write nothing.
            "cat > /tmp/constraints.txt <<'EOF'\nsetuptools>=40,<70\nEOF",
            "# needs node >= 16\nnpm install -g node@16",
            "python3 - <<'EOF'\ndef f(x) -> None: pass\nEOF",
            "make > /tmp/make.log 2>&1",
            "wget -O- https://example.invalid/key | apt-key add -",
            // Relative paths after a `cd` are the directory's.
            "cd /tmp && rm -rf openssl-1.1.1w && tar xzf openssl.tgz",
            "cd /tmp/y && sed -i 's/a/b/' setup.py && pip install .",
            // Build products and environments, anywhere they are.
            "rm -rf build dist *.egg-info",
            "rm -rf packages/app/node_modules",
            "sed -i 's/a/b/' frontend/node_modules/x/index.js",
            "find . -name __pycache__ -prune -exec rm -rf {} +",
            "find /workspace/repo -name '*.pyc' -delete",
            "find /tmp/build -delete",
            "cd /tmp/x && ls | xargs rm -f",
            // Words that only contain a guarded name.
            "pip install docker",
            "cd docker && pip install -r requirements.txt",
            "npm install http-graceful-shutdown",
            "find /etc/apt -name '*.list' -exec sed -i 's/deb.debian.org/archive.debian.org/' {} +",
            "patch -d /tmp/dep -p1 < /tmp/fix.diff",
            "cp -t /usr/local/bin /tmp/tool",
            "command -v patch >/dev/null || apt-get install -y patch",
            "patch --version || apt-get install -y patch",
            "grep -rl deb.debian.org /etc/apt | xargs sed -i 's/deb.debian.org/archive.debian.org/'",
            "find . -name '*.pyc' | xargs rm -f",
            "cd \"$(mktemp -d)\" && tar xzf /tmp/p.tgz && cd p-1.0 && sed -i 's/-Werror//' Makefile",
            "cd /tmp/src && bash -c \"sed -i 's/a/b/' Makefile && make\"",
            "truncate -s 0 /var/log/x.log",
            "touch -d '2020-01-01' /tmp/stamp",
            "wget -qO- https://example.invalid/install.sh | sh",
            "cd /tmp && wget https://example.invalid/x.tgz && tar xzf x.tgz",
            "curl -fsSLo /tmp/x.jar https://example.invalid/x.jar",
            "sed -i 's/a/b/' \"$VIRTUAL_ENV/lib/python3.11/site-packages/x.py\"",
            "rm -rf /var/lib/apt/lists/*",
            "echo x | tee -a $HOME/.bashrc",
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
