//! The programs a node project's test command runs: its `pretest`, `test`
//! and `posttest` scripts, read as the shell reads them, and what they run
//! by name (`npm run x`, `yarn x`, `pnpm x`, `run-s`, `npm-run-all`,
//! `concurrently "npm:x"`), what they wrap (`cross-env A=1 x`, `nyc x`),
//! the shell scripts of the repository they run (`sh scripts/test.sh`),
//! and the recipes of a `make` target. A developer's machine has the
//! system tools among them (`rsync`, `make`, `jq`); the image gets them
//! too, so that the test command runs as the developer types it.

use std::collections::{BTreeSet, VecDeque};

use serde_json::{Map, Value};

use crate::shell::{is_assignment, Text};

/// At most this many scripts, shell files and make targets are read.
const MAX_READS: usize = 64;

/// How deep wrappers and shell files are read into.
const MAX_DEPTH: usize = 4;

/// At most this much work waits (a pattern may name every script).
const MAX_QUEUED: usize = 4 * MAX_READS;

/// A text longer than this is no script (and is not read); at most
/// [`MAX_BYTES`] are read in all.
pub(super) const MAX_TEXT: usize = 256 << 10;
const MAX_BYTES: usize = 4 << 20;

/// Patterns and script names longer than this are not matched, and at most
/// [`MAX_MATCHES`] matches are tried in all: a pattern is the project's text.
const MAX_PATTERN: usize = 128;
const MAX_MATCHES: usize = 100_000;

/// The programs `pkg`'s test command runs, by name; `read` gives the text
/// of a file of the repository (shell scripts, the Makefile).
pub(super) fn test_programs(
    pkg: &Value,
    read: &dyn Fn(&str) -> Option<String>,
) -> BTreeSet<String> {
    read_all(pkg, read).programs
}

fn read_all<'a>(pkg: &'a Value, read: &'a dyn Fn(&str) -> Option<String>) -> Reader<'a> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    let empty = EMPTY.get_or_init(Map::new);
    let scripts = pkg
        .get("scripts")
        .and_then(Value::as_object)
        .unwrap_or(empty);
    let mut r = Reader {
        scripts,
        read,
        queue: VecDeque::from([Work::Script("test".to_string())]),
        seen: BTreeSet::new(),
        programs: BTreeSet::new(),
        makefile: None,
        bytes: 0,
        matches: 0,
    };
    while let Some(work) = r.queue.pop_front() {
        if r.seen.len() >= MAX_READS || !r.seen.insert(work.clone()) {
            continue;
        }
        match work {
            Work::Script(name) => {
                // npm and yarn classic run a script's `pre` and `post` hooks.
                for hook in [format!("pre{name}"), name.clone(), format!("post{name}")] {
                    if let Some(text) = r.scripts.get(&hook).and_then(Value::as_str) {
                        r.commands(text, 0);
                    }
                }
            }
            Work::File(path) => {
                if let Some(text) = (r.read)(&path).filter(|t| is_shell(&path, t)) {
                    r.commands(&text, 1);
                }
            }
            Work::Make(target) => {
                let read = r.read;
                let text = r.makefile.get_or_insert_with(|| {
                    ["GNUmakefile", "makefile", "Makefile"]
                        .iter()
                        .find_map(|m| read(m))
                        .unwrap_or_default()
                });
                let (recipes, prereqs) = make_recipes(text, target.as_deref());
                r.push(prereqs.into_iter().map(|p| Work::Make(Some(p))));
                for recipe in recipes {
                    r.commands(&recipe, 1);
                }
            }
        }
    }
    r
}

/// Whether a file a script runs is a shell script: `.sh`, or a `#!` line
/// naming a shell (`./bin/cli.js` and `./gradlew`'s Java are not read).
fn is_shell(path: &str, text: &str) -> bool {
    let first = text.lines().next().unwrap_or_default();
    match first.strip_prefix("#!") {
        Some(shebang) => shebang
            .split(['/', ' '])
            .any(|w| matches!(w, "sh" | "bash" | "dash")),
        None => path.ends_with(".sh"),
    }
}

/// At most this many of the project's own source files are read for the
/// commands they run.
const MAX_SOURCES: usize = 300;

/// The programs the project's own code runs by name: a string that starts
/// a command line with an option (`'lsof -i -P'`, `` `rsync -a ${x}` ``), or
/// the program of `spawn('jq', …)`, `execFile("rsync", …)`, in its
/// `.js`/`.cjs`/`.mjs`/`.ts` files four directories deep (not
/// `node_modules`). kill-port runs `lsof`, and its tests with it.
pub(super) fn source_programs(
    files: &[String],
    read: &dyn Fn(&str) -> Option<String>,
    known: &dyn Fn(&str) -> bool,
) -> BTreeSet<String> {
    static COMMAND: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let Some(re) = COMMAND
        .get_or_init(|| {
            regex::Regex::new(
                r#"(?:(?:spawn|spawnSync|execFile|execFileSync|execa|execaSync)\s*\(\s*['"`]([a-z][a-z0-9_-]*)['"`])|(?:['"`]([a-z][a-z0-9_-]*) +--?[A-Za-z])"#,
            )
            .ok()
        })
        .as_ref()
    else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    for path in files.iter().take(MAX_SOURCES) {
        let Some(text) = read(path).filter(|t| t.len() <= MAX_TEXT) else {
            continue;
        };
        for cap in re.captures_iter(&text) {
            if let Some(m) = cap.get(1).or_else(|| cap.get(2)) {
                if known(m.as_str()) {
                    out.insert(m.as_str().to_string());
                }
            }
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Work {
    /// A package.json script, with its hooks.
    Script(String),
    /// A shell file of the repository.
    File(String),
    /// A make target (`None`: the default one).
    Make(Option<String>),
}

struct Reader<'a> {
    scripts: &'a Map<String, Value>,
    read: &'a dyn Fn(&str) -> Option<String>,
    queue: VecDeque<Work>,
    seen: BTreeSet<Work>,
    programs: BTreeSet<String>,
    /// The Makefile's text, read once (empty where there is none).
    makefile: Option<String>,
    /// Bytes of text read, and patterns matched against a name, so far.
    bytes: usize,
    matches: usize,
}

/// The options of nyc and c8 that take a value (the two share most).
const COVERAGE_OPTIONS: &[&str] = &[
    "-r",
    "--reporter",
    "-n",
    "--include",
    "-x",
    "--exclude",
    "--extension",
    "-e",
    "--temp-dir",
    "--temp-directory",
    "-t",
    "--report-dir",
    "--reports-dir",
    "-o",
    "--require",
    "-i",
    "--cwd",
    "--src",
    "--exclude-after-remap",
];

/// Wrappers that run the command after their options and assignments, and
/// their options that take a value (`dotenv -e .env jest`, `c8 -r lcov x`).
const WRAPPERS: &[(&str, &[&str])] = &[
    ("cross-env", &[]),
    ("cross-env-shell", &[]),
    ("dotenv", &["-e", "-c", "-v"]),
    (
        "env-cmd",
        &["-f", "--file", "-e", "--environments", "-r", "--rc-file"],
    ),
    ("nyc", COVERAGE_OPTIONS),
    ("c8", COVERAGE_OPTIONS),
    ("npx", &["-p", "--package", "-c", "--call"]),
    ("pnpx", &[]),
    ("bunx", &[]),
    ("with-env", &[]),
    (
        "xvfb-run",
        &[
            "-n",
            "--server-num",
            "-e",
            "--error-file",
            "-f",
            "--auth-file",
            "-p",
            "--xauth-protocol",
            "-s",
            "--server-args",
            "-w",
            "--wait",
        ],
    ),
];

/// What the shell runs itself: no program to install.
const SHELL_BUILTINS: &[&str] = &[
    "set", "cd", "export", "echo", "exit", "true", "false", "test", "[", "[[", "shift", "source",
    ".", "trap", "unset", "local", "read", "wait", "return", "printf", "pwd", "ulimit", "umask",
    "for", "case", "esac", "fi", "done", "in",
];

impl Reader<'_> {
    /// Queue `work`, as much of it as [`MAX_QUEUED`] leaves room for.
    fn push(&mut self, work: impl IntoIterator<Item = Work>) {
        let room = MAX_QUEUED.saturating_sub(self.queue.len());
        self.queue.extend(work.into_iter().take(room));
    }

    fn commands(&mut self, text: &str, depth: usize) {
        if depth > MAX_DEPTH || text.len() > MAX_TEXT || self.bytes + text.len() > MAX_BYTES {
            return;
        }
        self.bytes += text.len();
        for cmd in Text::read(text).commands() {
            let Some((i, prog)) = cmd.program() else {
                continue;
            };
            let args = cmd.words.get(i + 1..).unwrap_or_default();
            let program_word = cmd.words.get(i).map(String::as_str).unwrap_or_default();
            match prog.as_str() {
                "npm" | "pnpm" | "yarn" | "bun" => self.package_manager(&prog, args),
                "run-s" | "run-p" | "npm-run-all" | "npm-run-all2" => {
                    for pattern in operands(args, &["--max-parallel", "--npm-path"]) {
                        self.scripts_matching(pattern);
                    }
                }
                "concurrently" => {
                    const TAKES: &[&str] = &[
                        "-n",
                        "--names",
                        "-c",
                        "--prefix-colors",
                        "-p",
                        "--prefix",
                        "-s",
                        "--success",
                        "-m",
                        "--max-processes",
                        "-t",
                        "--timestamp-format",
                        "-l",
                        "--prefix-length",
                        "--restart-tries",
                        "--restart-after",
                    ];
                    for arg in operands(args, TAKES) {
                        match arg.split_once(':') {
                            Some(("npm" | "yarn" | "pnpm" | "bun", script)) => {
                                self.scripts_matching(script)
                            }
                            _ => self.commands(arg, depth + 1),
                        }
                    }
                }
                "sh" | "bash" | "dash" => {
                    // `bash -e -c '…'`, `sh -xc '…'`, `sh -x f.sh`.
                    let options: Vec<&String> =
                        args.iter().take_while(|a| a.starts_with('-')).collect();
                    let rest = args.get(options.len());
                    let inline = options
                        .iter()
                        .any(|o| !o.starts_with("--") && o.contains('c'));
                    match rest {
                        Some(script) if inline => self.commands(script, depth + 1),
                        Some(file) => self.file(file),
                        None => {}
                    }
                }
                "nodemon" => {
                    // `nodemon --exec "mocha …"`; else it runs a node file.
                    if let Some(i) = args.iter().position(|a| a == "--exec" || a == "-x") {
                        if let Some(cmd) = args.get(i + 1) {
                            self.commands(cmd, depth + 1);
                        }
                    }
                }
                "make" | "gmake" => {
                    self.programs.insert("make".to_string());
                    let targets = operands(args, &["-C", "-f", "-j", "-l", "-o", "-W"])
                        .filter(|t| !t.contains('='))
                        .map(|t| Work::Make(Some(t.to_string())))
                        .collect::<Vec<_>>();
                    // `-C dir` and `-f file` read a Makefile elsewhere.
                    if !args
                        .iter()
                        .any(|a| a.starts_with("-C") || a.starts_with("-f"))
                    {
                        if targets.is_empty() {
                            self.push([Work::Make(None)]);
                        }
                        self.push(targets);
                    }
                }
                w if WRAPPERS.iter().any(|(name, _)| *name == w) => {
                    let takes = WRAPPERS
                        .iter()
                        .find(|(name, _)| *name == w)
                        .map(|(_, t)| *t)
                        .unwrap_or_default();
                    if w == "xvfb-run" {
                        self.programs.insert(prog.clone());
                    }
                    let rest = wrapped(args, takes);
                    let joined = rest
                        .iter()
                        .map(|a| {
                            shlex::try_quote(a)
                                .map(|q| q.into_owned())
                                .unwrap_or_default()
                        })
                        .collect::<Vec<_>>()
                        .join(" ");
                    if let (true, [one]) = (w == "cross-env-shell", rest.as_slice()) {
                        self.commands(one, depth + 1);
                    } else {
                        self.commands(&joined, depth + 1);
                    }
                }
                _ if program_word.starts_with("./")
                    && !program_word.starts_with("./node_modules/")
                    || program_word.ends_with(".sh") =>
                {
                    self.file(program_word);
                    self.programs.insert(prog);
                }
                _ if SHELL_BUILTINS.contains(&prog.as_str()) => {}
                _ => {
                    self.programs.insert(prog);
                }
            }
        }
    }

    /// `npm run x`, `npm test`, `yarn x`, `pnpm run x`, `bun run x`.
    fn package_manager(&mut self, pm: &str, args: &[String]) {
        let mut ops = operands(
            args,
            &["--prefix", "-C", "--dir", "--cwd", "--filter", "-F"],
        );
        let Some(first) = ops.next() else {
            return;
        };
        // Another directory's scripts are not this package's
        // (`--prefix sub`, `--workspace=a`, `pnpm -r`, `yarn workspace a`).
        if args.iter().any(|a| {
            let option = a.split('=').next().unwrap_or(a);
            matches!(
                option,
                "--prefix"
                    | "-C"
                    | "--dir"
                    | "--cwd"
                    | "-w"
                    | "--workspace"
                    | "--workspaces"
                    | "-ws"
                    | "-r"
                    | "--recursive"
                    | "--filter"
                    | "-F"
            )
        }) || matches!(first, "workspace" | "workspaces")
        {
            return;
        }
        let script = match (pm, first) {
            (_, "run" | "run-script" | "rum" | "urn") => ops.next(),
            ("npm" | "pnpm" | "yarn", "test" | "t" | "tst") => Some("test"),
            ("npm" | "pnpm" | "yarn", "start") => Some("start"),
            // `yarn x` and `pnpm x` run the script `x` where it is one.
            ("yarn" | "pnpm", name) if self.scripts.contains_key(name) => Some(name),
            _ => None,
        };
        if let Some(s) = script {
            self.push([Work::Script(s.to_string())]);
        }
    }

    /// The scripts an npm-run-all pattern names (`test:*`, `lint:**`),
    /// while there is room to queue them and matches left to try.
    fn scripts_matching(&mut self, pattern: &str) {
        if !pattern.contains('*') {
            self.push([Work::Script(pattern.to_string())]);
            return;
        }
        if pattern.len() > MAX_PATTERN {
            return;
        }
        let mut names = Vec::new();
        for name in self.scripts.keys() {
            if self.queue.len() + names.len() >= MAX_QUEUED
                || self.seen.len() >= MAX_READS
                || self.matches >= MAX_MATCHES
            {
                break;
            }
            self.matches += 1;
            if name.len() <= MAX_PATTERN && glob_matches(pattern, name) {
                names.push(Work::Script(name.clone()));
            }
        }
        self.push(names);
    }

    /// A shell file of the repository (`./scripts/test.sh`).
    fn file(&mut self, path: &str) {
        let rel = path.trim_start_matches("./");
        if !rel.is_empty() && !rel.starts_with('/') && !rel.contains('$') {
            self.push([Work::File(rel.to_string())]);
        }
    }
}

/// The arguments that are not options, nor the values of the options in
/// `takes`, up to a `--`'s end of options (what follows is the script's).
fn operands<'a>(args: &'a [String], takes: &'a [&str]) -> impl Iterator<Item = &'a str> + 'a {
    let mut skip = false;
    args.iter()
        .take_while(|a| a.as_str() != "--")
        .filter_map(move |a| {
            if std::mem::take(&mut skip) {
                return None;
            }
            if a.starts_with('-') {
                skip = takes.contains(&a.as_str());
                return None;
            }
            Some(a.as_str())
        })
}

/// The command a wrapper runs: what follows its `--`, else its words past
/// its options (and the values of those in `takes`) and assignments.
fn wrapped<'a>(args: &'a [String], takes: &[&str]) -> Vec<&'a String> {
    if let Some(i) = args.iter().position(|a| a == "--") {
        return args.iter().skip(i + 1).collect();
    }
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if a.starts_with('-') {
            i += if takes.contains(&a.as_str()) { 2 } else { 1 };
        } else if is_assignment(a) {
            i += 1;
        } else {
            break;
        }
    }
    args.iter().skip(i).collect()
}

/// npm-run-all's patterns: `*` within one `:`-separated part, `**` across.
/// In time linear in the pattern times the name (the pattern is the
/// project's text).
fn glob_matches(pattern: &str, name: &str) -> bool {
    enum Tok {
        Byte(u8),
        Part,
        Any,
    }
    let p = pattern.as_bytes();
    let mut toks = Vec::with_capacity(p.len());
    let mut i = 0;
    while let Some(&c) = p.get(i) {
        if c == b'*' {
            let any = p.get(i + 1) == Some(&b'*');
            toks.push(if any { Tok::Any } else { Tok::Part });
            i += if any { 2 } else { 1 };
        } else {
            toks.push(Tok::Byte(c));
            i += 1;
        }
    }
    let n = name.as_bytes();
    // `at[j]`: the tokens so far match the name's first `j` bytes.
    let mut at = vec![false; n.len() + 1];
    at[0] = true;
    for tok in &toks {
        let mut next = vec![false; n.len() + 1];
        match tok {
            Tok::Byte(c) => {
                for j in 0..n.len() {
                    next[j + 1] = at[j] && n[j] == *c;
                }
            }
            Tok::Part | Tok::Any => {
                let mut reach = false;
                for j in 0..=n.len() {
                    reach |= at[j];
                    next[j] = reach;
                    if matches!(tok, Tok::Part) && n.get(j) == Some(&b':') {
                        reach = false;
                    }
                }
            }
        }
        at = next;
    }
    at[n.len()]
}

/// The recipe lines of `target` (the first rule's where `None`), their
/// `$(MAKE)` as `make`, and its prerequisites (targets of their own).
/// Lines continued with `\` are joined; variables and pattern rules are
/// not expanded, and a conditional inside a recipe keeps it going.
fn make_recipes(text: &str, target: Option<&str>) -> (Vec<String>, Vec<String>) {
    let mut recipes = Vec::new();
    let mut prereqs_out = Vec::new();
    let mut inside = false;
    let mut first_rule_seen = false;
    let mut lines = text.lines();
    while let Some(mut line) = lines.next().map(String::from) {
        while line.ends_with('\\') {
            line.pop();
            match lines.next() {
                Some(more) => line.push_str(more),
                None => break,
            }
        }
        if let Some(recipe) = line.strip_prefix('\t') {
            if inside {
                let recipe = recipe.trim_start_matches(['@', '-', '+']);
                recipes.push(recipe.replace("$(MAKE)", "make").replace("${MAKE}", "make"));
            }
            continue;
        }
        let trimmed = line.trim();
        let conditional = ["ifeq", "ifneq", "ifdef", "ifndef", "else", "endif"]
            .iter()
            .any(|k| trimmed.split_whitespace().next() == Some(k));
        if trimmed.is_empty() || trimmed.starts_with('#') || conditional {
            continue;
        }
        inside = false;
        let Some((targets, prereqs)) = line.split_once(':') else {
            continue;
        };
        // `A := x` and `A ::= x` assign; `a: b` is a rule.
        if prereqs.starts_with('=') || targets.contains('=') || targets.contains('$') {
            continue;
        }
        let names: Vec<&str> = targets.split_whitespace().collect();
        let hit = match target {
            Some(t) => names.contains(&t),
            // The default goal: the first rule whose target is not special.
            None => {
                let first = !first_rule_seen
                    && names
                        .first()
                        .is_some_and(|n| !n.starts_with('.') && !n.contains('%'));
                first_rule_seen |= first;
                first
            }
        };
        if hit {
            inside = true;
            let (prereqs, inline) = match prereqs.split_once(';') {
                Some((p, inline)) => (p, Some(inline)),
                None => (prereqs, None),
            };
            prereqs_out.extend(
                prereqs
                    .split_whitespace()
                    .filter(|p| !p.contains(['$', '%', '/', '.']))
                    .map(String::from),
            );
            recipes.extend(inline.map(String::from));
        }
    }
    (recipes, prereqs_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programs(pkg: &str, files: &[(&str, &str)]) -> Vec<String> {
        let pkg: Value = serde_json::from_str(pkg).unwrap();
        let read = |p: &str| {
            files
                .iter()
                .find(|(n, _)| *n == p)
                .map(|(_, t)| t.to_string())
        };
        test_programs(&pkg, &read).into_iter().collect()
    }

    #[test]
    fn the_test_scripts_hooks_and_what_they_run_by_name() {
        // fastify-cli's pretest copies the package with rsync.
        let got = programs(
            r#"{"scripts": {
                "pretest": "xcopy /e /k /i . \"..\\node_modules\\fastify-cli\" || rsync -r --exclude=node_modules ./ node_modules/fastify-cli || echo 'this is fine'",
                "test": "npm run unit && c8 -r lcov --clean npm run cli",
                "unit": "cross-env NODE_ENV=test tap test/*.js",
                "cli": "run-s cli:*",
                "cli:a": "jq . package.json",
                "cli:b": "yarn helper",
                "helper": "zip -r out.zip .",
                "release": "gh release create"
            }}"#,
            &[],
        );
        assert_eq!(got, ["jq", "rsync", "tap", "xcopy", "zip"]);
    }

    #[test]
    fn wrappers_are_read_past_their_options_and_values() {
        let got = programs(
            r#"{"scripts": {
                "test": "dotenv -e .env.test -- mocha && env-cmd -f .env lsof -i && nodemon --exec 'bats t' && bash -e -c 'unzip x.zip' && xvfb-run -a --server-args '-screen 0' npm run e2e",
                "e2e": "FOO=1 npx -p pkg cypress run"
            }}"#,
            &[],
        );
        assert_eq!(
            got,
            ["bats", "cypress", "lsof", "mocha", "unzip", "xvfb-run"]
        );
    }

    #[test]
    fn shell_files_and_make_targets_are_read() {
        let makefile = "VAR := x\n.PHONY: test\nall: build\n\nbuild:\n\tcc -o x x.c\n\ntest: build \\\n  lint\n\t@$(MAKE) unit\nifeq ($(CI),1)\n\trsync -a a b\nendif\nlint:\n\t-shellcheck *.sh\nunit: ; bats test\ndeploy:\n\tscp x y\n";
        let got = programs(
            r#"{"scripts": {"test": "sh ./scripts/test.sh && ./bin/cli.js --help"}}"#,
            &[
                ("scripts/test.sh", "#!/bin/sh\nset -e\nmake test\n"),
                ("bin/cli.js", "#!/usr/bin/env node\nfoo().then(compare)\n"),
                ("Makefile", makefile),
            ],
        );
        assert_eq!(got, ["bats", "cc", "cli.js", "make", "rsync", "shellcheck"]);
        // `make` alone: the first rule (`all`), not the ones after it.
        let got = programs(
            r#"{"scripts": {"test": "make"}}"#,
            &[("Makefile", makefile)],
        );
        assert_eq!(got, ["cc", "make"]);
    }

    #[test]
    fn concurrently_and_other_directories() {
        let got = programs(
            r#"{"scripts": {
                "test": "concurrently -n a,b \"npm:t:*\" \"lsof -i :3000\" && npm --prefix sub run x && npm run x --workspace=a && yarn workspace a x && pnpm --filter=web x",
                "t:one": "unzip a.zip",
                "x": "never"
            }}"#,
            &[],
        );
        assert_eq!(got, ["lsof", "unzip"]);
    }

    #[test]
    fn loops_and_missing_scripts_end() {
        let pkg = serde_json::json!({"scripts": {"test": "npm run a", "a": "npm test && npm run missing && jq"}});
        let r = read_all(&pkg, &|_: &str| None);
        assert_eq!(r.programs.into_iter().collect::<Vec<_>>(), ["jq"]);
        // `test`, `a` and `missing` once each.
        assert_eq!(r.seen.len(), 3);
        assert!(programs(r#"{"name": "x"}"#, &[]).is_empty());
    }

    #[test]
    fn the_commands_the_projects_own_code_runs_are_found() {
        let files = [
            ("index.js", "const sh = require('shell-exec')\nsh('lsof -i -P')\nsh(`rsync -a ${a} ${b}`)\nthrow new Error('file not found')\nconst s = 'make sure -- it works'"),
            ("lib/x.ts", "spawn('jq', ['.'])\nexecFile(\"zip\", args)\nexec('tree')"),
        ];
        let names: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
        let read = |p: &str| {
            files
                .iter()
                .find(|(n, _)| *n == p)
                .map(|(_, t)| t.to_string())
        };
        let known = |p: &str| crate::repair::program_packages(p).is_some();
        let got: Vec<String> = source_programs(&names, &read, &known).into_iter().collect();
        // Not `file` or `make` of prose, nor `tree` with no option.
        assert_eq!(got, ["jq", "lsof", "rsync", "zip"]);
    }

    #[test]
    fn patterns_match_as_npm_run_all_reads_them() {
        assert!(glob_matches("test:*", "test:unit"));
        assert!(!glob_matches("test:*", "test:unit:fast"));
        assert!(glob_matches("test:**", "test:unit:fast"));
        assert!(glob_matches("lint", "lint"));
        assert!(!glob_matches("lint", "lint:js"));
        assert!(glob_matches("*:*", "a:b") && !glob_matches("*", "a:b"));
        assert!(glob_matches("t*t", "test") && !glob_matches("t*t", "tes"));
    }

    #[test]
    fn the_projects_text_buys_bounded_work() {
        // Many patterns against many scripts: the matches tried stop at the
        // budget, and the reads at theirs.
        let mut scripts = serde_json::Map::new();
        let patterns = "** ".repeat(20_000);
        scripts.insert("test".into(), Value::from(format!("run-s {patterns}")));
        for i in 0..20_000 {
            scripts.insert(format!("s{i}"), Value::from("zip"));
        }
        let pkg = serde_json::json!({ "scripts": scripts });
        let r = read_all(&pkg, &|_: &str| None);
        assert!(r.matches <= MAX_MATCHES, "{}", r.matches);
        assert!(r.seen.len() <= MAX_READS && r.queue.is_empty());
        assert!(r.programs.contains("zip"));
        // A long pattern is not matched; a long text is not read.
        let long = format!("run-s {}b", "a*".repeat(MAX_PATTERN));
        let pkg = serde_json::json!({"scripts": {"test": long, "ab": "zip"}});
        assert_eq!(read_all(&pkg, &|_: &str| None).matches, 0);
        let huge = format!("zip {}", "x ".repeat(MAX_TEXT));
        let pkg = serde_json::json!({ "scripts": { "test": huge } });
        let r = read_all(&pkg, &|_: &str| None);
        assert!(r.programs.is_empty() && r.bytes == 0);
    }
}
