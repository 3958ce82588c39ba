//! The node lines a project's CI tests: GitHub Actions workflows, Travis,
//! CircleCI and AppVeyor. A project that pins no node (`.nvmrc`,
//! `.node-version`, `volta`) and whose `engines.node` names no line still
//! says which nodes it runs on, in the matrix its CI runs its tests on.
//!
//! Read as a developer reads them: the values of the keys that name a node
//! (`node-version`, `node_js`, `nodejs_version`, a matrix's `node`) and the
//! node images a job runs in (`node:18`, `cimg/node:20.1`). An expression
//! (`${{ matrix.node }}`) names nothing; a value that follows the newest
//! release (`node`, `latest`, `lts/*`) means the CI runs whatever node is
//! newest, and so names no line to hold the project to.

use super::{pin_major, Files};
use std::collections::BTreeSet;

/// What one CI file says of node: the lines its matrices name (a key under
/// a `matrix`, or a list), and those it names one at a time (a job's
/// `node-version`, an image), each with whether one of them follows the
/// newest release.
#[derive(Debug, Default, PartialEq, Clone)]
pub(crate) struct FileNode {
    pub matrix: Said,
    pub single: Said,
    /// A step runs the tests (a `run`, `script` or `command` with a word
    /// `test…`, `t`, `jest`, `mocha`, `vitest`, `ava`, `tap`, `unit`,
    /// `coverage`, `check`, `spec` or `e2e`), or calls a workflow of the
    /// repository's own (`uses: ./…`), which may.
    pub runs_tests: bool,
}

/// Lines, and whether the newest release is among them.
#[derive(Debug, Default, PartialEq, Clone)]
pub(crate) struct Said {
    pub lines: BTreeSet<u32>,
    pub newest: bool,
}

impl Said {
    fn is_empty(&self) -> bool {
        self.lines.is_empty() && !self.newest
    }
}

/// What the CI files say of node, chosen from each file's: the files of
/// GitHub Actions where one names a node and runs the tests or has a
/// matrix (a `.travis.yml` beside them is most often left from before),
/// else the others where they name one; and of those, what their
/// matrices say where one has a matrix (the tests run there: a release or
/// lint job's single node is not what the tests run on), else each job's.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct CiNode {
    /// Each line (major) the chosen values name.
    pub lines: BTreeSet<u32>,
    /// A chosen value follows the newest release.
    pub newest: bool,
    /// The CI files the chosen values come from, each with its lines.
    pub files: Vec<(String, BTreeSet<u32>)>,
}

/// Keys whose value is a node version (or a list of them).
const NODE_KEYS: &[&str] = &[
    "node-version",
    "node-versions",
    "node_version",
    "node",
    "node_js",
    "nodejs",
    "nodejs_version",
    "nodejs-version",
];

/// Values that follow the newest release rather than name a line.
const NEWEST: &[&str] = &[
    "node",
    "latest",
    "current",
    "stable",
    "lts",
    "lts/*",
    "lts/latest",
    "*",
];

/// At most this many workflow files are read (a repository of hundreds of
/// workflows is not read to the end).
const MAX_WORKFLOWS: usize = 64;

/// The CI files other than GitHub Actions' workflows.
const OTHER_CI: &[&str] = &[
    ".travis.yml",
    ".circleci/config.yml",
    "appveyor.yml",
    ".appveyor.yml",
];

/// The CI files of the repository at `f` and what they say of node.
pub(crate) fn read(f: &Files) -> CiNode {
    // `read` follows no link out of the repository and caps the size.
    let said = |names: Vec<String>| -> Vec<(String, FileNode)> {
        names
            .into_iter()
            .filter_map(|name| {
                let text = f.read(&name)?;
                let n = read_yaml(&text);
                (!n.matrix.is_empty() || !n.single.is_empty()).then_some((name, n))
            })
            .collect()
    };
    let workflows = said(workflow_files(f));
    let others = said(OTHER_CI.iter().map(|s| s.to_string()).collect());
    choose(pick_files(workflows, others))
}

/// The files whose values count: the workflows where one names a node,
/// but the other CI files where they have a test matrix and no such
/// workflow runs the tests or has one (a `.travis.yml` test matrix beside a
/// workflow that only publishes, on one node).
fn pick_files(
    workflows: Vec<(String, FileNode)>,
    others: Vec<(String, FileNode)>,
) -> Vec<(String, FileNode)> {
    let tests_there = workflows
        .iter()
        .any(|(_, n)| n.runs_tests || !n.matrix.is_empty());
    let others_test = others.iter().any(|(_, n)| !n.matrix.is_empty());
    if workflows.is_empty() || (!tests_there && others_test) {
        others
    } else {
        workflows
    }
}

/// Of the files' values, the matrices' where one has a matrix, else the
/// single ones.
pub(crate) fn choose(files: Vec<(String, FileNode)>) -> CiNode {
    let any_matrix = files.iter().any(|(_, n)| !n.matrix.is_empty());
    let mut out = CiNode::default();
    for (name, n) in files {
        let s = if any_matrix { n.matrix } else { n.single };
        if s.is_empty() {
            continue;
        }
        out.newest |= s.newest;
        out.lines.extend(&s.lines);
        out.files.push((name, s.lines));
    }
    out
}

/// `.github/workflows/*.yml` and `*.yaml`, sorted; none where either
/// directory is a link (the repository is the user's, on the host).
fn workflow_files(f: &Files) -> Vec<String> {
    let real_dir = |rel: &str| {
        fs_err::symlink_metadata(f.root().join(rel)).is_ok_and(|m| m.file_type().is_dir())
    };
    if !real_dir(".github") || !real_dir(".github/workflows") {
        return vec![];
    }
    // host-owned: the user's repository on the host; only names are read
    // here, and each file through `Files::read`.
    let Ok(rd) = fs_err::read_dir(f.root().join(".github/workflows")) else {
        return vec![];
    };
    let mut out: Vec<String> = rd
        .flatten()
        .take(1024)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yml") || n.ends_with(".yaml"))
        .map(|n| format!(".github/workflows/{n}"))
        .collect();
    out.sort();
    out.truncate(MAX_WORKFLOWS);
    out
}

/// What one CI file (YAML) says of node: each of its documents, a key
/// given twice read as its last value (as CI services read it). A file that
/// does not parse says nothing.
pub(crate) fn read_yaml(text: &str) -> FileNode {
    let mut out = FileNode::default();
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
    };
    if let Ok(docs) = serde_saphyr::from_multiple_with_options::<serde_json::Value>(text, options) {
        docs.iter().for_each(|v| walk(v, false, &mut out));
    }
    out
}

fn walk(v: &serde_json::Value, in_matrix: bool, out: &mut FileNode) {
    // Travis runs `node_js`'s node; a file that names one uses its job
    // variables for something else (a build target).
    let env_too = v.get("node_js").is_none();
    walk_in(v, in_matrix, env_too, out);
}

fn walk_in(v: &serde_json::Value, in_matrix: bool, env_too: bool, out: &mut FileNode) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = k.to_ascii_lowercase();
                let in_matrix = in_matrix || key == "matrix";
                let to = if in_matrix || v.is_array() {
                    &mut out.matrix
                } else {
                    &mut out.single
                };
                if NODE_KEYS.contains(&key.as_str()) {
                    versions(v, to);
                } else if key == "env" && env_too {
                    env_lines(v, in_matrix, out);
                } else if matches!(key.as_str(), "image" | "container") {
                    images(v, to);
                } else if matches!(key.as_str(), "run" | "script" | "command") {
                    out.runs_tests |= runs_tests(v);
                } else if key == "uses" {
                    out.runs_tests |= v.as_str().is_some_and(|u| u.starts_with("./"));
                } else if key == "tag" && orb_node_executor(map) {
                    // CircleCI's node orb: `executor: { name: node/default,
                    // tag: '16.13' }` runs in `cimg/node:16.13`.
                    versions(v, to);
                } else if matches!(key.as_str(), "node/test" | "node/run") {
                    orb_job(v, in_matrix, out);
                }
                walk_in(v, in_matrix, env_too, out);
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|i| walk_in(i, in_matrix, env_too, out)),
        _ => {}
    }
}

/// A job of CircleCI's node orb (`node/test:`, `node/run:`): its `version`
/// parameter, or its matrix's, is the node it runs on (not a `version` of
/// another orb's step inside it).
fn orb_job(job: &serde_json::Value, in_matrix: bool, out: &mut FileNode) {
    if let Some(v) = job.get("version") {
        versions(
            v,
            if in_matrix {
                &mut out.matrix
            } else {
                &mut out.single
            },
        );
    }
    if let Some(v) = job.pointer("/matrix/parameters/version") {
        versions(v, &mut out.matrix);
    }
}

/// The node lines in Travis's job variables (`NAME=VALUE`, under a node
/// key's name): a list of them (or `env.matrix`, `env.jobs`) is a matrix,
/// `env.global` every job's.
fn env_lines(v: &serde_json::Value, in_matrix: bool, out: &mut FileNode) {
    use serde_json::Value;
    match v {
        Value::Array(items) => items.iter().for_each(|i| env_pairs(i, &mut out.matrix)),
        Value::Object(map) => {
            for (k, v) in map {
                let to = match k.as_str() {
                    "matrix" | "jobs" => &mut out.matrix,
                    _ if in_matrix => &mut out.matrix,
                    _ => &mut out.single,
                };
                env_pairs(v, to);
            }
        }
        _ => env_pairs(
            v,
            if in_matrix {
                &mut out.matrix
            } else {
                &mut out.single
            },
        ),
    }
}

fn env_pairs(v: &serde_json::Value, out: &mut Said) {
    use serde_json::Value;
    match v {
        Value::Array(items) => items.iter().for_each(|i| env_pairs(i, out)),
        Value::String(s) => {
            for pair in s.split_whitespace() {
                if let Some((name, value)) = pair.split_once('=') {
                    if NODE_KEYS.contains(&name.to_ascii_lowercase().as_str()) {
                        let value = value.trim_matches(|c| c == '"' || c == '\'');
                        versions(&Value::String(value.to_string()), out);
                    }
                }
            }
        }
        _ => {}
    }
}

/// Whether a step's command (or list of them) runs the tests.
fn runs_tests(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Array(items) => items.iter().any(runs_tests),
        serde_json::Value::String(s) => s
            .to_ascii_lowercase()
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| {
                w.starts_with("test")
                    || matches!(
                        w,
                        "t" | "jest"
                            | "mocha"
                            | "vitest"
                            | "ava"
                            | "tap"
                            | "unit"
                            | "coverage"
                            | "check"
                            | "spec"
                            | "e2e"
                    )
            }),
        _ => false,
    }
}

/// A map that names one of CircleCI's node orb executors (`node/default`).
fn orb_node_executor(map: &serde_json::Map<String, serde_json::Value>) -> bool {
    map.get("name")
        .and_then(|n| n.as_str())
        .is_some_and(|n| n.starts_with("node/"))
}

/// A version, or a list of them: `18`, `"20.x"`, `v16.20.2`, `lts/iron`.
fn versions(v: &serde_json::Value, out: &mut Said) {
    use serde_json::Value;
    let s = match v {
        Value::Array(items) => return items.iter().for_each(|i| versions(i, out)),
        Value::String(s) => s.trim().to_ascii_lowercase(),
        Value::Number(n) => n.to_string(),
        _ => return,
    };
    if s.contains('$') {
        return;
    }
    if NEWEST.contains(&s.as_str()) {
        out.newest = true;
        return;
    }
    // `0.10` is a version too: it names node 0, no line of today's.
    let digits_first = s
        .trim_start_matches('v')
        .starts_with(|c: char| c.is_ascii_digit());
    if digits_first || s.starts_with("lts/") {
        if let Some(m) = pin_major(&s) {
            out.lines.insert(m);
        }
    }
}

/// An image, or a list of them.
fn images(v: &serde_json::Value, out: &mut Said) {
    match v {
        serde_json::Value::Array(items) => items.iter().for_each(|i| images(i, out)),
        serde_json::Value::String(s) => image(s, out),
        _ => {}
    }
}

/// A job's image: `node:18`, `node:20-alpine`, `cimg/node:20.1`,
/// `circleci/node:10-browsers`, `node:iron`, `node:18@sha256:…`, `node`.
fn image(s: &str, out: &mut Said) {
    let s = s.split('@').next().unwrap_or(s);
    let (repo, tag) = s.rsplit_once(':').unwrap_or((s, "latest"));
    if repo != "node" && !repo.ends_with("/node") {
        return;
    }
    let tag = tag.split('-').next().unwrap_or(tag).to_ascii_lowercase();
    if tag.starts_with(|c: char| c.is_ascii_alphabetic()) {
        // An LTS line's name (`iron`, `hydrogen`) is a tag of its own; any
        // other word (`alpine`, `slim`, `bookworm`, `current`) is a variant
        // of the newest release.
        match pin_major(&format!("lts/{tag}")) {
            Some(m) => {
                out.lines.insert(m);
            }
            None => out.newest = true,
        }
        return;
    }
    versions(&serde_json::Value::String(tag), out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(text: &str) -> CiNode {
        choose(vec![("ci.yml".into(), read_yaml(text))])
    }

    fn lines(text: &str) -> Vec<u32> {
        said(text).lines.into_iter().collect()
    }

    #[test]
    fn a_workflow_matrix_names_the_lines_the_tests_run_on() {
        let wf = r#"
name: CI
on: [push, pull_request]
jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        node-version: [16.x, 18.x, '20']
        include:
          - node-version: 21
    steps:
      - uses: actions/setup-node@v4
        with:
          node-version: ${{ matrix.node-version }}
  publish:
    steps:
      - uses: actions/setup-node@v4
        with:
          node-version: lts/*
  docs:
    container: node:22
"#;
        // The release and docs jobs' single nodes are not the tests'.
        assert_eq!(lines(wf), vec![16, 18, 20, 21]);
        assert!(!said(wf).newest);
        // Without a matrix, each job's node.
        let single = "jobs:\n  t:\n    steps:\n      - with:\n          node-version: 20\n  l:\n    container: node:18\n";
        assert_eq!(lines(single), vec![18, 20]);
        assert!(
            said("jobs:\n  t:\n    steps:\n      - with:\n          node-version: lts/*\n").newest
        );
    }

    #[test]
    fn travis_circleci_and_appveyor_name_theirs() {
        assert_eq!(
            lines("language: node_js\nnode_js:\n  - \"6\"\n  - \"8\"\n  - \"10\"\n"),
            vec![6, 8, 10]
        );
        assert_eq!(lines("language: node_js\nnode_js: '11'\n"), vec![11]);
        assert_eq!(lines("node_js:\n  - 0.10\n  - 0.12\n"), vec![0]);
        assert_eq!(
            lines("jobs:\n  build:\n    docker:\n      - image: cimg/node:20.11.1\n      - image: circleci/node:10-browsers\n      - image: redis:7\n"),
            vec![10, 20]
        );
        assert_eq!(
            lines("environment:\n  matrix:\n    - nodejs_version: \"12\"\n    - nodejs_version: \"14\"\n"),
            vec![12, 14]
        );
        assert_eq!(
            lines("jobs:\n  t:\n    container: node:18-bullseye\n"),
            vec![18]
        );
        assert_eq!(
            lines("jobs:\n  t:\n    container: node:hydrogen-alpine\n"),
            vec![18]
        );
        assert_eq!(
            lines("jobs:\n  t:\n    container: node:20@sha256:abc\n"),
            vec![20]
        );
        assert_eq!(lines("node-version: lts/gallium\n"), vec![16]);
    }

    #[test]
    fn the_newest_release_expressions_and_other_keys_name_no_line() {
        let s = said("node_js:\n  - node\n  - '10'\n");
        assert!(s.newest);
        assert_eq!(s.lines.into_iter().collect::<Vec<_>>(), vec![10]);
        assert!(said("with:\n  node-version: lts/*\n").newest);
        assert!(said("container: node:latest\n").newest);
        assert!(said("container: node\n").newest);
        assert!(said("container: node:alpine\n").newest);
        assert!(said("image: circleci/node:current-browsers\n").newest);
        // Images a matrix runs are the matrix's.
        let m = "jobs:\n  t:\n    strategy:\n      matrix:\n        container: [node:16, node:20-slim]\n  r:\n    container: node:22\n";
        assert_eq!(lines(m), vec![16, 20]);
        assert_eq!(
            lines("with:\n  node-version: ${{ env.NODE }}\n  node-version-file: .nvmrc\n"),
            Vec::<u32>::new()
        );
        assert_eq!(lines("with:\n  node-version: lts/-1\n"), Vec::<u32>::new());
        assert_eq!(
            lines("python-version: ['3.11']\nversion: 18\nimage: python:3.12\n"),
            Vec::<u32>::new()
        );
        // A key given twice is read as its last value, as CI services
        // read it; every document of a file is read.
        assert_eq!(
            lines("node_js: ['8']\nnode_js: ['12', '14']\n"),
            vec![12, 14]
        );
        assert_eq!(
            lines("version: 2\n---\njobs:\n  t:\n    docker:\n      - image: node:16\n"),
            vec![16]
        );
        // CircleCI's node orb executor runs `cimg/node:TAG`; another
        // executor's tag is not a node.
        assert_eq!(
            lines("orbs:\n  node: circleci/node@5\njobs:\n  t:\n    executor:\n      name: node/default\n      tag: '16.13'\n"),
            vec![16]
        );
        // The orb's jobs take a `version` parameter, or a matrix of them.
        assert_eq!(
            lines(
                "workflows:\n  test:\n    jobs:\n      - node/test:\n          version: '16.13'\n"
            ),
            vec![16]
        );
        assert_eq!(
            lines("workflows:\n  t:\n    jobs:\n      - node/test:\n          matrix:\n            parameters:\n              version: ['14.21', '18.12']\n"),
            vec![14, 18]
        );
        // Travis's job variables.
        assert_eq!(
            lines("language: node_js\nenv:\n  - NODE_VERSION=12 DB=x\n  - NODE_VERSION=\"14\"\n"),
            vec![12, 14]
        );
        assert_eq!(
            lines("env:\n  global:\n    - NODEJS_VERSION=16\n    - OTHER=20\n"),
            vec![16]
        );
        // `env.matrix` is a matrix; a file with `node_js` runs that node.
        let s = said(
            "env:\n  global:\n    - A=1\n  matrix:\n    - NODE_VERSION=12\n    - NODE_VERSION=14\n",
        );
        assert_eq!(s.lines.into_iter().collect::<Vec<_>>(), vec![12, 14]);
        assert_eq!(
            lines("language: node_js\nnode_js: '10'\nenv:\n  - NODE_VERSION=12 TARGET=x\n"),
            vec![10]
        );
        // Another orb's `version` inside a node job is not the node.
        assert_eq!(
            lines("workflows:\n  t:\n    jobs:\n      - node/test:\n          version: '18.12'\n          post-steps:\n            - codecov/upload:\n                version: latest\n"),
            vec![18]
        );
        assert_eq!(
            lines("jobs:\n  t:\n    executor:\n      name: python/default\n      tag: '3.11'\n"),
            Vec::<u32>::new()
        );
        // Not YAML: nothing.
        assert_eq!(read_yaml("node_js: [10\n  : :"), FileNode::default());
    }

    #[test]
    fn workflows_win_over_a_travis_file_left_beside_them_and_links_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join(".github/workflows")).unwrap();
        std::fs::write(
            root.join(".github/workflows/ci.yml"),
            "jobs:\n  t:\n    strategy:\n      matrix:\n        node: [14, 16]\n",
        )
        .unwrap();
        std::fs::write(
            root.join(".github/workflows/release.yaml"),
            "jobs:\n  r:\n    steps:\n      - with:\n          node-version: 20\n",
        )
        .unwrap();
        std::fs::write(root.join(".github/workflows/lint.yml"), "jobs: {}\n").unwrap();
        std::fs::write(root.join(".travis.yml"), "node_js: [node, '8']\n").unwrap();
        let got = read(&Files::new(root));
        assert_eq!(got.lines.iter().copied().collect::<Vec<_>>(), vec![14, 16]);
        assert!(!got.newest);
        assert_eq!(got.files.len(), 1);
        assert_eq!(got.files[0].0, ".github/workflows/ci.yml");
        // Without workflows, the others.
        std::fs::remove_dir_all(root.join(".github")).unwrap();
        assert!(read(&Files::new(root)).newest);

        // A workflow that only publishes, on one node, beside a Travis test
        // matrix: the tests run on Travis.
        std::fs::create_dir_all(root.join(".github/workflows")).unwrap();
        let release = "jobs:\n  r:\n    steps:\n      - with:\n          node-version: 20\n      - run: npm publish\n";
        std::fs::write(root.join(".github/workflows/release.yml"), release).unwrap();
        std::fs::write(root.join(".travis.yml"), "node_js: ['10', '12']\n").unwrap();
        let lines_of = || {
            read(&Files::new(root))
                .lines
                .into_iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(lines_of(), vec![10, 12]);
        assert_eq!(read(&Files::new(root)).files[0].0, ".travis.yml");
        // A workflow that runs the tests on one node wins over a Travis
        // matrix left from before.
        std::fs::write(
            root.join(".github/workflows/release.yml"),
            release.replace("npm publish", "npm ci && npm test"),
        )
        .unwrap();
        assert_eq!(lines_of(), vec![20]);
        // A publishing workflow's node, where the other CI has no matrix
        // either: the workflow's.
        std::fs::write(root.join(".github/workflows/release.yml"), release).unwrap();
        std::fs::write(root.join(".travis.yml"), "node_js: '12'\n").unwrap();
        assert_eq!(lines_of(), vec![20]);
        // A reusable workflow of the repository's own may run the tests.
        std::fs::write(
            root.join(".github/workflows/release.yml"),
            format!("{release}  t:\n    uses: ./.github/workflows/test.yml\n"),
        )
        .unwrap();
        std::fs::write(root.join(".travis.yml"), "node_js: ['10', '12']\n").unwrap();
        assert_eq!(lines_of(), vec![20]);

        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outside.path().join("workflows")).unwrap();
        std::fs::write(outside.path().join("workflows/x.yml"), "node: [12]\n").unwrap();
        let linked = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), linked.path().join(".github")).unwrap();
        assert_eq!(read(&Files::new(linked.path())), CiNode::default());
    }
}
