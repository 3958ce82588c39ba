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

use crate::shell::Text;

/// At most this many scripts, shell files and make targets are read.
const MAX_READS: usize = 64;

/// How deep wrappers and shell files are read into.
const MAX_DEPTH: usize = 4;

/// At most this much work waits (a pattern may name every script).
const MAX_QUEUED: usize = 4 * MAX_READS;

/// The programs `pkg`'s test command runs, by name; `read` gives the text
/// of a file of the repository (shell scripts, the Makefile).
pub(super) fn test_programs(
    pkg: &Value,
    read: &dyn Fn(&str) -> Option<String>,
) -> BTreeSet<String> {
    let empty = Map::new();
    let scripts = pkg
        .get("scripts")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut r = Reader {
        scripts,
        read,
        queue: VecDeque::from([Work::Script("test".to_string())]),
        seen: BTreeSet::new(),
        programs: BTreeSet::new(),
        makefile: None,
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
                if let Some(text) = (r.read)(&path) {
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
    r.programs
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
}

/// Wrappers that run the command after their options and assignments.
const WRAPPERS: &[&str] = &[
    "cross-env",
    "cross-env-shell",
    "dotenv",
    "env-cmd",
    "nyc",
    "c8",
    "npx",
    "pnpx",
    "bunx",
    "nodemon",
    "with-env",
];

impl Reader<'_> {
    /// Queue `work`, as much of it as [`MAX_QUEUED`] leaves room for.
    fn push(&mut self, work: impl IntoIterator<Item = Work>) {
        let room = MAX_QUEUED.saturating_sub(self.queue.len());
        self.queue.extend(work.into_iter().take(room));
    }

    fn commands(&mut self, text: &str, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
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
                "sh" | "bash" | "dash" => match args.first().map(String::as_str) {
                    Some("-c") | Some("-ec") | Some("-ce") | Some("-euc") => {
                        if let Some(script) = args.get(1) {
                            self.commands(script, depth + 1);
                        }
                    }
                    Some(file) if !file.starts_with('-') => self.file(file),
                    _ => {}
                },
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
                w if WRAPPERS.contains(&w) => {
                    let rest: Vec<&String> = args
                        .iter()
                        .skip_while(|a| a.starts_with('-') || is_assignment(a))
                        .collect();
                    let joined = rest
                        .iter()
                        .map(|a| {
                            shlex::try_quote(a)
                                .map(|q| q.into_owned())
                                .unwrap_or_default()
                        })
                        .collect::<Vec<_>>()
                        .join(" ");
                    if w == "cross-env-shell" && rest.len() == 1 {
                        self.commands(rest[0], depth + 1);
                    } else {
                        self.commands(&joined, depth + 1);
                    }
                }
                _ if program_word.starts_with("./") || program_word.ends_with(".sh") => {
                    self.file(program_word);
                    self.programs.insert(prog);
                }
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
        // Another directory's scripts are not this package's.
        if args.iter().any(|a| {
            matches!(
                a.as_str(),
                "--prefix"
                    | "-C"
                    | "--dir"
                    | "--cwd"
                    | "-w"
                    | "--workspace"
                    | "-r"
                    | "--recursive"
                    | "--filter"
                    | "-F"
                    | "workspace"
                    | "workspaces"
            )
        }) {
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

    /// The scripts an npm-run-all pattern names (`test:*`, `lint:**`).
    fn scripts_matching(&mut self, pattern: &str) {
        let names: Vec<String> = self
            .scripts
            .keys()
            .filter(|name| glob_matches(pattern, name))
            .cloned()
            .collect();
        self.push(names.into_iter().map(Work::Script));
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

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
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

/// The recipe lines of `target` (the first target where `None`), their
/// `$(MAKE)` as `make`, and its prerequisites (targets of their own).
/// Variables and pattern rules are not expanded.
fn make_recipes(text: &str, target: Option<&str>) -> (Vec<String>, Vec<String>) {
    let mut out = Vec::new();
    let mut prereqs_out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if let Some(recipe) = line.strip_prefix('\t') {
            if inside {
                let recipe = recipe.trim_start_matches(['@', '-', '+']);
                out.push(recipe.replace("$(MAKE)", "make").replace("${MAKE}", "make"));
            }
            continue;
        }
        if line.trim().is_empty() || line.starts_with('#') {
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
            None => names
                .first()
                .is_some_and(|n| !n.starts_with('.') && !n.contains('%')),
        };
        if hit && out.is_empty() {
            inside = true;
            let prereqs = prereqs.split(';').next().unwrap_or_default();
            prereqs_out.extend(
                prereqs
                    .split_whitespace()
                    .filter(|p| !p.contains(['$', '%', '/', '.']))
                    .map(String::from),
            );
            if let Some((_, inline)) = line.split_once(';') {
                out.push(inline.to_string());
            }
        }
    }
    (out, prereqs_out)
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
                "test": "npm run unit && c8 --clean npm run cli",
                "unit": "cross-env NODE_ENV=test tap test/*.js",
                "cli": "run-s cli:*",
                "cli:a": "jq . package.json",
                "cli:b": "yarn helper",
                "helper": "zip -r out.zip .",
                "release": "gh release create"
            }}"#,
            &[],
        );
        assert_eq!(got, ["echo", "jq", "rsync", "tap", "xcopy", "zip"]);
    }

    #[test]
    fn shell_files_and_make_targets_are_read() {
        let makefile = "VAR := x\nall: build\n\nbuild:\n\tcc -o x x.c\n\ntest: build lint\n\t@$(MAKE) unit\n\trsync -a a b\nlint:\n\t-shellcheck *.sh\nunit:\n\tbats test\n";
        let got = programs(
            r#"{"scripts": {"test": "sh ./scripts/test.sh"}}"#,
            &[
                ("scripts/test.sh", "#!/bin/sh\nset -e\nmake test\n"),
                ("Makefile", makefile),
            ],
        );
        assert_eq!(got, ["bats", "cc", "make", "rsync", "set", "shellcheck"]);
    }

    #[test]
    fn concurrently_and_other_directories() {
        let got = programs(
            r#"{"scripts": {
                "test": "concurrently -n a,b \"npm:t:*\" \"lsof -i :3000\" && npm --prefix sub run x",
                "t:one": "unzip a.zip",
                "x": "never"
            }}"#,
            &[],
        );
        assert_eq!(got, ["lsof", "unzip"]);
    }

    #[test]
    fn loops_and_missing_scripts_end() {
        let got = programs(
            r#"{"scripts": {"test": "npm run a", "a": "npm test && npm run missing"}}"#,
            &[],
        );
        assert!(got.is_empty(), "{got:?}");
        assert!(programs(r#"{"name": "x"}"#, &[]).is_empty());
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
        // A pattern the project wrote takes no time to read.
        let long = format!("{}b", "*".repeat(5000));
        assert!(!glob_matches(&long, &"a".repeat(5000)));
        assert!(glob_matches(&"**".repeat(3000), &"a:".repeat(3000)));
    }

    #[test]
    fn a_pattern_naming_every_script_reads_a_bounded_number() {
        let mut scripts = serde_json::Map::new();
        scripts.insert("test".into(), Value::from("run-s ** && run-p **"));
        for i in 0..20_000 {
            scripts.insert(
                format!("s{i}"),
                Value::from(format!("npm run s{} && zip", i + 1)),
            );
        }
        let pkg = serde_json::json!({ "scripts": scripts });
        let started = std::time::Instant::now();
        let got = test_programs(&pkg, &|_: &str| None);
        assert!(got.contains("zip"), "{got:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
