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

/// What the CI files say of node.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct CiNode {
    /// Each line (major) a CI file names.
    pub lines: BTreeSet<u32>,
    /// A CI file follows the newest release.
    pub newest: bool,
    /// The CI files that name a node, relative to the repository.
    pub files: Vec<String>,
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
const MAX_FILES: usize = 64;

/// The CI files of the repository at `f` and what they say of node.
pub(crate) fn read(f: &Files) -> CiNode {
    let mut out = CiNode::default();
    let mut names: Vec<String> = [
        ".travis.yml",
        ".circleci/config.yml",
        "appveyor.yml",
        ".appveyor.yml",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.extend(workflow_files(f));
    for name in names.into_iter().take(MAX_FILES) {
        // `read` follows no link out of the repository and caps the size.
        let Some(text) = f.read(&name) else { continue };
        let before = (out.lines.len(), out.newest);
        read_yaml(&text, &mut out);
        if (out.lines.len(), out.newest) != before {
            out.files.push(name);
        }
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
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yml") || n.ends_with(".yaml"))
        .map(|n| format!(".github/workflows/{n}"))
        .collect();
    out.sort();
    out
}

/// Adds what one CI file (YAML) says of node to `out`. A file that does
/// not parse says nothing.
pub(crate) fn read_yaml(text: &str, out: &mut CiNode) {
    if let Ok(v) = serde_saphyr::from_str::<serde_json::Value>(text) {
        walk(&v, out);
    }
}

fn walk(v: &serde_json::Value, out: &mut CiNode) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = k.to_ascii_lowercase();
                if NODE_KEYS.contains(&key.as_str()) {
                    versions(v, out);
                }
                if matches!(key.as_str(), "image" | "container") {
                    if let Some(s) = v.as_str() {
                        image(s, out);
                    }
                }
                walk(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
        _ => {}
    }
}

/// A version, or a list of them: `18`, `"20.x"`, `v16.20.2`, `lts/iron`.
fn versions(v: &serde_json::Value, out: &mut CiNode) {
    use serde_json::Value;
    let s = match v {
        Value::Array(items) => return items.iter().for_each(|i| versions(i, out)),
        Value::String(s) => s.trim().to_ascii_lowercase(),
        Value::Number(n) => n.to_string(),
        _ => return,
    };
    if s.contains("${{") || s.contains('$') {
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

/// A job's image: `node:18`, `node:20-alpine`, `cimg/node:20.1`,
/// `circleci/node:10-browsers`, `node:lts`.
fn image(s: &str, out: &mut CiNode) {
    let Some((repo, tag)) = s.rsplit_once(':') else {
        return;
    };
    if repo != "node" && !repo.ends_with("/node") {
        return;
    }
    let tag = tag.split('-').next().unwrap_or(tag);
    versions(&serde_json::Value::String(tag.to_string()), out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(text: &str) -> CiNode {
        let mut out = CiNode::default();
        read_yaml(text, &mut out);
        out
    }

    fn lines(text: &str) -> Vec<u32> {
        said(text).lines.into_iter().collect()
    }

    #[test]
    fn a_workflow_matrix_and_setup_node_name_their_lines() {
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
          node-version: 14
"#;
        assert_eq!(lines(wf), vec![14, 16, 18, 20, 21]);
        assert!(!said(wf).newest);
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
        assert_eq!(lines("node-version: lts/gallium\n"), vec![16]);
    }

    #[test]
    fn the_newest_release_expressions_and_other_keys_name_no_line() {
        let s = said("node_js:\n  - node\n  - '10'\n");
        assert!(s.newest);
        assert_eq!(s.lines.into_iter().collect::<Vec<_>>(), vec![10]);
        assert!(said("with:\n  node-version: lts/*\n").newest);
        assert!(said("container: node:latest\n").newest);
        assert_eq!(
            lines("with:\n  node-version: ${{ env.NODE }}\n  node-version-file: .nvmrc\n"),
            Vec::<u32>::new()
        );
        assert_eq!(lines("with:\n  node-version: lts/-1\n"), Vec::<u32>::new());
        assert_eq!(
            lines("python-version: ['3.11']\nversion: 18\nimage: python:3.12\n"),
            Vec::<u32>::new()
        );
        // Not YAML: nothing.
        assert_eq!(said("node_js: [10\n  : :"), CiNode::default());
    }

    #[test]
    fn files_are_read_from_the_repository_and_a_linked_workflows_dir_is_not() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join(".github/workflows")).unwrap();
        std::fs::write(
            root.join(".github/workflows/ci.yml"),
            "jobs:\n  t:\n    strategy:\n      matrix:\n        node: [14, 16]\n",
        )
        .unwrap();
        std::fs::write(
            root.join(".github/workflows/lint.yaml"),
            "jobs:\n  l:\n    runs-on: ubuntu-latest\n",
        )
        .unwrap();
        std::fs::write(root.join(".travis.yml"), "node_js: ['8']\n").unwrap();
        let got = read(&Files::new(root));
        assert_eq!(got.lines.into_iter().collect::<Vec<_>>(), vec![8, 14, 16]);
        assert_eq!(got.files, vec![".travis.yml", ".github/workflows/ci.yml"]);

        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outside.path().join("workflows")).unwrap();
        std::fs::write(outside.path().join("workflows/x.yml"), "node: [12]\n").unwrap();
        let linked = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), linked.path().join(".github")).unwrap();
        assert_eq!(read(&Files::new(linked.path())), CiNode::default());
    }
}
