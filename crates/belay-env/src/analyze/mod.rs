//! Deterministic, file-based repository analysis. No network, no Docker, no
//! model: the same tree always gives the same `context.json`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::EnvError;

mod ci_node;
pub mod commands;
mod conftest_imports;
mod pytest_plugins;
mod python;
mod requirements;
mod script_tools;
mod test_groups;

pub use conftest_imports::{
    own_files_imported_by, third_party_imports_of, third_party_imports_of_package_file,
    ConftestImport,
};
pub use pytest_plugins::PluginNeed;
pub use python::{PythonFacts, PythonInstaller};
pub use requirements::RequirementFile;
pub use test_groups::TestGroups;

/// What belay learned about a repository, written as `context.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RepoContext {
    pub repo_path: PathBuf,
    pub repo_name: String,
    /// Languages in planning order (the primary one first).
    pub languages: Vec<Language>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rust: Option<RustFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go: Option<GoFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub java: Option<JavaFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub native: Option<NativeFacts>,
    pub test_frameworks: Vec<String>,
    /// Marker files found, relative to the repo root.
    pub markers: Vec<String>,
    /// Things the planner should know that it cannot fix.
    pub warnings: Vec<String>,
    /// Facts read from the real base image by the container preflight (build only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_notes: Option<crate::preflight::RuntimeNotes>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Node,
    Rust,
    Go,
    Java,
}

impl Language {
    pub fn as_str(&self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Rust => "rust",
            Language::Go => "go",
            Language::Java => "java",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeFacts {
    pub package_manager: String,
    /// The version `packageManager` pins (`pnpm@9.2.0+sha512…` gives `9.2.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_manager_version: Option<String>,
    /// The integrity hash `packageManager` pins with it, as corepack reads
    /// it (`sha512.<hex>`), when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_manager_hash: Option<String>,
    /// Yarn 2 or later (`.yarnrc.yml`, or `packageManager: yarn@2…`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub yarn_berry: bool,
    /// Yarn 2 or later linking with Plug'n'Play, yarn's own default: its
    /// `.yarnrc.yml` names no other `nodeLinker`. The install keeps it, as
    /// the project's CI does (a `node_modules` tree can change what its
    /// tools see: flow checks one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub yarn_pnp: bool,
    /// The directory a clone of the project has: its repository's name
    /// (`package.json` `repository`), else its package's without the scope.
    /// A test that reaches the project as `../mqemitter` finds it only
    /// there. Letters, digits, `.`, `_` and `-`; never a name belay mounts at
    /// (`belay_sandbox::layout::reserved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkout_name: Option<String>,
    /// The node version the project pins (`.nvmrc`, `.node-version`,
    /// `volta.node`), when it pins one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_pin: Option<String>,
    /// The node line the project runs on, where it names one: its pin's
    /// major (`.nvmrc` `16`, `lts/gallium`), else the newest major an
    /// `engines.node` with an upper bound admits (`14.x`, `>=12 <17`).
    /// Installed as it is, older or newer than the distribution's (see
    /// [`node_line`]); `required_major` is only a floor. The build also
    /// sets it to a line of the project's CI older than 18, or to the
    /// line of a date before 18's LTS (`as_of::apply_node_era`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_line: Option<u32>,
    /// The node lines the project's CI tests (see `ci_node`), where it
    /// pins none and `engines.node` names none: those `engines.node`
    /// admits, from [`OLDEST_NODE_LINE`] to the newest released, none
    /// where a CI file follows the newest release. The build settles them
    /// against the project's date (`as_of::apply_node_era`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ci_node_lines: Vec<u32>,
    /// The CI files those lines come from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ci_node_files: Vec<String>,
    /// Of those lines, the one installed where none of them runs (see
    /// `as_of::settle_ci_lines`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_node_install: Option<u32>,
    pub lockfile: Option<String>,
    pub engines_node: Option<String>,
    pub required_major: Option<u32>,
    pub test_script: Option<String>,
    pub has_dependencies: bool,
    /// A native addon compiles at install (the project's own `binding.gyp`,
    /// or node-gyp and the helpers addons build with among its packages).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub native_addons: bool,
    /// The date an install without a lockfile resolves as of (npm's
    /// `--before`; see `as_of.rs`); set by the build, not by the analysis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolve_as_of: Option<crate::as_of::ResolveAsOf>,
    /// Why `required_major`, or `node_line` for a date before 18's LTS,
    /// is the node of the project's date (see `as_of::apply_node_era`),
    /// when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_era: Option<String>,
    /// The pnpm major that writes the lockfile's `lockfileVersion`, for a
    /// project that pins no pnpm: a newer pnpm refuses an older lockfile
    /// under `--frozen-lockfile` (pnpm 9 reads no v5 lockfile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockfile_pnpm_major: Option<u32>,
    /// The `lockfileVersion` of an npm lockfile (`package-lock.json`,
    /// `npm-shrinkwrap.json`): 2 and 3 are npm 7's and later, which the
    /// project's developers ran on node 15 or newer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npm_lockfile_version: Option<u32>,
    /// A test snapshot that holds a colour terminal's escape codes (jest's
    /// `__snapshots__/*.snap`): the tests were recorded, and pass, where
    /// their output is coloured, as in the developer's terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colour_snapshot: Option<String>,
    /// The system programs the test command's scripts run (`rsync` in a
    /// `pretest`, `make` for `make test`, `jq`) that Debian packages give:
    /// a developer's machine has them, and so does the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script_tools: Vec<String>,
}

/// At most this many snapshot files are read for colour codes.
const MAX_SNAPSHOTS: usize = 200;

/// The first jest snapshot under the repository (four directories deep)
/// whose text holds an ANSI escape sequence (`ESC [`).
fn colour_snapshot(f: &Files) -> Option<String> {
    let snapshots = f.find(4, &|p: &Path| {
        p.extension().is_some_and(|e| e == "snap")
            && p.parent()
                .and_then(|d| d.file_name())
                .is_some_and(|d| d == "__snapshots__")
    });
    snapshots
        .into_iter()
        .take(MAX_SNAPSHOTS)
        .find(|rel| f.read(rel).is_some_and(|t| t.contains("\u{1b}[")) && !colours_itself(f, rel))
}

/// Whether the test file a snapshot belongs to (`dir/__snapshots__/x.test.js.snap`
/// is `dir/x.test.js`'s) makes its colour codes itself: a test of ANSI
/// handling stores them on purpose, whatever the terminal was.
fn colours_itself(f: &Files, snapshot: &str) -> bool {
    let path = Path::new(snapshot);
    let test = path
        .parent()
        .and_then(Path::parent)
        .zip(path.file_stem())
        .map(|(dir, stem)| dir.join(stem));
    let Some(text) = test.and_then(|t| f.read(&t.to_string_lossy())) else {
        return false;
    };
    const COLOUR_MARKERS: &[&str] = &[
        "\\u001b",
        "\\u001B",
        "\\x1b",
        "\\x1B",
        "\\033",
        "\u{1b}",
        "chalk",
        "FORCE_COLOR",
        "supports-color",
        "supportsColor",
        "ansi",
    ];
    COLOUR_MARKERS.iter().any(|m| text.contains(m))
}

impl NodeFacts {
    /// Whether the project's lockfile is npm's (`package-lock.json`,
    /// `npm-shrinkwrap.json`).
    pub fn has_npm_lockfile(&self) -> bool {
        matches!(
            self.lockfile.as_deref(),
            Some("package-lock.json" | "npm-shrinkwrap.json")
        )
    }

    /// The line to install where the CI's lines settle the node and none
    /// of them runs.
    pub fn ci_line(&self) -> Option<u32> {
        self.ci_node_install
            .or_else(|| lts_first(&self.ci_node_lines, true))
    }
}

/// The newest (or the oldest) LTS (even) line of `lines`, else the newest
/// (or oldest) line.
pub(crate) fn lts_first(lines: &[u32], newest: bool) -> Option<u32> {
    let even: Vec<u32> = lines.iter().copied().filter(|m| m % 2 == 0).collect();
    let from = if even.is_empty() { lines } else { &even };
    if newest {
        from.iter().max().copied()
    } else {
        from.iter().min().copied()
    }
}

/// The pnpm major whose lockfile format `text` (a `pnpm-lock.yaml`) is:
/// 5.0 to 5.2 pnpm 5, 5.3 pnpm 6, 5.4 pnpm 7, 6.x pnpm 8, 7.0 and 9.0
/// pnpm 9 (which pnpm 10 writes too; 9 reads it and builds dependencies'
/// scripts as the project's pnpm did before 10).
fn pnpm_major_of_lockfile(text: &str) -> Option<u32> {
    // A top-level key: first from pnpm 6 on, after `devDependencies` in
    // pnpm 5's (whose keys are sorted).
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("lockfileVersion:"))?
        .trim()
        .trim_matches(|c| c == '\'' || c == '"');
    let (major, minor) = v.split_once('.').unwrap_or((v, "0"));
    let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
    Some(match (major, minor) {
        (5, 0..=2) => 5,
        (5, 3) => 6,
        (5, _) => 7,
        (6, _) => 8,
        (7.., _) => 9,
        _ => return None,
    })
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RustFacts {
    pub toolchain: Option<String>,
    pub rust_version: Option<String>,
    pub workspace: bool,
    pub has_dependencies: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GoFacts {
    pub module: Option<String>,
    pub go_version: Option<String>,
    pub has_dependencies: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JavaFacts {
    pub build_tool: String,
    pub wrapper: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NativeFacts {
    pub build_systems: Vec<String>,
    pub primary: bool,
}

/// Analyse the repository at `repo`.
pub fn analyze(repo: &Path) -> Result<RepoContext, EnvError> {
    let meta = fs_err::metadata(repo).map_err(|e| EnvError::RepoMissing {
        path: repo.to_path_buf(),
        reason: e.to_string(),
    })?;
    if !meta.is_dir() {
        return Err(EnvError::RepoMissing {
            path: repo.to_path_buf(),
            reason: "it is not a directory".into(),
        });
    }
    let repo = repo
        .canonicalize()
        .map_err(|e| EnvError::io("cannot resolve", repo, e))?;
    let f = Files::new(&repo);
    let mut ctx = RepoContext {
        repo_name: repo
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "repo".into()),
        repo_path: repo.clone(),
        ..Default::default()
    };
    let mut frameworks = BTreeSet::new();

    if let Some(py) = python::python(&f, &mut frameworks, &mut ctx.warnings) {
        ctx.languages.push(Language::Python);
        ctx.python = Some(py);
    }
    if let Some(n) = node(&f, &mut frameworks, &mut ctx.warnings)? {
        ctx.languages.push(Language::Node);
        ctx.node = Some(n);
    }
    if let Some(r) = rust(&f) {
        frameworks.insert("cargo-test".to_string());
        ctx.languages.push(Language::Rust);
        ctx.rust = Some(r);
    }
    if let Some(g) = go(&f) {
        frameworks.insert("go-test".to_string());
        ctx.languages.push(Language::Go);
        ctx.go = Some(g);
    }
    if let Some(j) = java(&f) {
        frameworks.insert("junit".to_string());
        ctx.languages.push(Language::Java);
        ctx.java = Some(j);
    }
    let native = native(&f, ctx.languages.is_empty());
    if let Some(n) = &native {
        if n.primary {
            if f.exists("CMakeLists.txt") {
                frameworks.insert("ctest".to_string());
            } else {
                frameworks.insert("make-check".to_string());
            }
        }
    }
    ctx.native = native;
    ctx.test_frameworks = frameworks.into_iter().collect();
    ctx.markers = f.markers();
    if ctx.languages.is_empty() && ctx.native.is_none() {
        ctx.warnings.push(
            "no known project manifest found (pyproject.toml, package.json, Cargo.toml, go.mod, pom.xml, CMakeLists.txt...); only system packages are planned".into(),
        );
    }
    Ok(ctx)
}

/// Whether `module` is the project's own package (installing it from PyPI
/// would install a stranger's): its import name, or a package or module at
/// the root or under `src/`, `lib/`, `lib3/` or `python/`.
pub fn is_local_module(root: &Path, import_name: Option<&str>, module: &str) -> bool {
    if import_name == Some(module) {
        return true;
    }
    ["", "src", "lib", "lib3", "python"].iter().any(|d| {
        let base = if d.is_empty() {
            root.to_path_buf()
        } else {
            root.join(d)
        };
        base.join(module).join("__init__.py").is_file()
            || base.join(format!("{module}.py")).is_file()
    })
}

/// Reads of the repository's top-level files.
pub(crate) struct Files {
    root: PathBuf,
}

const MARKERS: &[&str] = &[
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "Pipfile",
    "Pipfile.lock",
    "poetry.lock",
    "uv.lock",
    "tox.ini",
    ".python-version",
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    ".nvmrc",
    ".node-version",
    ".yarnrc.yml",
    "Cargo.toml",
    "Cargo.lock",
    "rust-toolchain",
    "rust-toolchain.toml",
    "go.mod",
    "go.sum",
    "pom.xml",
    "build.gradle",
    "build.gradle.kts",
    "gradlew",
    "mvnw",
    "CMakeLists.txt",
    "Makefile",
    "meson.build",
    "configure",
    "pytest.ini",
    "conftest.py",
];

impl Files {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }
    pub(crate) fn exists(&self, rel: &str) -> bool {
        self.root.join(rel).exists()
    }
    /// A project file: links followed only inside the repository (a cloned
    /// project's `pyproject.toml -> ~/.netrc` is not read), at most 16 MiB.
    pub(crate) fn read(&self, rel: &str) -> Option<String> {
        let bytes = belay_sandbox::hostfs::read_in_tree(&self.root, rel, 16 << 20).ok()??;
        String::from_utf8(bytes).ok()
    }
    /// The file's text where it is at most `max` bytes (a longer one costs
    /// `max + 1` bytes read, not its length).
    pub(crate) fn read_at_most(&self, rel: &str, max: usize) -> Option<String> {
        let bytes = belay_sandbox::hostfs::read_in_tree(&self.root, rel, max as u64 + 1).ok()??;
        if bytes.len() > max {
            return None;
        }
        String::from_utf8(bytes).ok()
    }
    fn markers(&self) -> Vec<String> {
        MARKERS
            .iter()
            .filter(|m| self.exists(m))
            .map(|m| m.to_string())
            .collect()
    }
    /// Top-level and one-level-deep file names matching `pred` (sorted).
    pub(crate) fn find(&self, max_depth: usize, pred: &dyn Fn(&Path) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![(self.root.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            // host-owned: the user's repository on the host; builds get a copy, never a mount.
            let Ok(rd) = fs_err::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || SKIP_DIRS.contains(&name.as_str()) {
                    continue;
                }
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() {
                    if depth < max_depth {
                        stack.push((p, depth + 1));
                    }
                } else if pred(&p) {
                    if let Ok(rel) = p.strip_prefix(&self.root) {
                        out.push(rel.to_string_lossy().into_owned());
                    }
                }
            }
        }
        out.sort();
        out
    }
}

const SKIP_DIRS: &[&str] = &[
    "node_modules",
    "target",
    "venv",
    "build",
    "dist",
    "__pycache__",
    "vendor",
];

/// PEP 503's normal form: lower case, each run of `-`, `_` and `.` one `-`.
pub fn normalise_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// The distribution name at the start of a PEP 508 requirement.
pub fn requirement_name(req: &str) -> Option<String> {
    let req = req.trim();
    if req.is_empty() || req.starts_with('#') || req.starts_with('-') {
        return None;
    }
    let name: String = req
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    (!name.is_empty()).then(|| name.to_ascii_lowercase().replace('_', "-"))
}

/// The directory name a clone of the project has ([`NodeFacts::checkout_name`]):
/// the last part of `repository` (`user/repo`, `github:user/repo`,
/// `git+https://host/user/repo.git`, `{ "url": … }`), else `name` without
/// its scope. None where that is not a plain directory name.
/// The files yarn's Plug'n'Play writes at the project's root that a run's
/// sandbox carries (`belay_sandbox::envimage::ENV_FILES` and the map's data
/// file); a project that keeps Plug'n'Play must ignore them all.
const PNP_MAPS: [&str; 4] = [".pnp.cjs", ".pnp.js", ".pnp.loader.mjs", ".pnp.data.json"];

/// Whether a root `.gitignore` ignores the file `name` at the root: its last
/// pattern that matches decides (`!` re-includes). Only what can be judged
/// is judged: a pattern with `[`, `\`, or a `/` inside (other than a
/// leading one) is passed over, `*` and `?` match within the name.
fn gitignore_ignores_at_root(text: &str, name: &str) -> bool {
    let mut ignored = false;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (negate, pat) = match line.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, line),
        };
        let pat = pat.strip_prefix('/').unwrap_or(pat);
        if pat.is_empty() || pat.contains(['/', '[', '\\']) {
            continue;
        }
        if glob_name(pat.as_bytes(), name.as_bytes()) {
            ignored = !negate;
        }
    }
    ignored
}

/// `*` and `?` matching of one path component.
fn glob_name(pat: &[u8], name: &[u8]) -> bool {
    match pat.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob_name(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && glob_name(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && glob_name(rest, &name[1..]),
    }
}

/// The `nodeLinker` a `.yarnrc.yml` names (`pnp`, `node-modules`, `pnpm`),
/// when it parses and names one.
fn yarnrc_node_linker(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_saphyr::from_str(text).ok()?;
    v.get("nodeLinker")?.as_str().map(str::to_string)
}

fn checkout_name(pkg: &serde_json::Value) -> Option<String> {
    let repo = pkg.get("repository");
    let url = repo
        .and_then(|r| r.as_str())
        .or_else(|| repo.and_then(|r| r.get("url")).and_then(|u| u.as_str()));
    let from_url = url.and_then(|u| {
        let u = u.split('#').next().unwrap_or(u).trim_end_matches('/');
        let last = u.rsplit(['/', ':']).next()?;
        Some(last.strip_suffix(".git").unwrap_or(last).to_string())
    });
    let from_name = pkg
        .get("name")
        .and_then(|n| n.as_str())
        .map(|n| n.rsplit('/').next().unwrap_or(n).to_string());
    let plain = |s: &String| {
        !s.is_empty()
            && s.len() <= 100
            && !s.starts_with(['.', '-'])
            && !belay_sandbox::layout::reserved(s)
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    from_url.filter(plain).or(from_name.filter(plain))
}

fn node(
    f: &Files,
    frameworks: &mut BTreeSet<String>,
    warnings: &mut Vec<String>,
) -> Result<Option<NodeFacts>, EnvError> {
    let Some(text) = f.read("package.json") else {
        return Ok(None);
    };
    let pkg: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return Err(EnvError::BadManifest {
                path: f.root.join("package.json"),
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            })
        }
    };
    let mut n = NodeFacts::default();
    let (pm, lock) = if f.exists("pnpm-lock.yaml") {
        ("pnpm", Some("pnpm-lock.yaml"))
    } else if f.exists("yarn.lock") {
        ("yarn", Some("yarn.lock"))
    } else if f.exists("package-lock.json") {
        ("npm", Some("package-lock.json"))
    } else if f.exists("npm-shrinkwrap.json") {
        ("npm", Some("npm-shrinkwrap.json"))
    } else {
        ("npm", None)
    };
    let pinned = pkg
        .get("packageManager")
        .and_then(|p| p.as_str())
        .and_then(|p| p.split_once('@'))
        .filter(|(name, _)| matches!(*name, "npm" | "yarn" | "pnpm"));
    n.package_manager = pinned.map(|(name, _)| name).unwrap_or(pm).to_string();
    // `9.2.0+sha512.abc…`: the version, without the integrity hash corepack
    // reads (which no registry knows as a version).
    n.package_manager_version = pinned
        .map(|(_, v)| v.split('+').next().unwrap_or(v).trim().to_string())
        .filter(|v| {
            // A version goes into the plan's shell script: digits first, and
            // only what a version holds.
            v.chars().next().is_some_and(|c| c.is_ascii_digit())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        });
    n.package_manager_hash = pinned
        .and_then(|(_, v)| v.split_once('+'))
        .map(|(_, h)| h.trim())
        .filter(|h| {
            h.split_once('.').is_some_and(|(alg, hex)| {
                matches!(alg, "sha1" | "sha224" | "sha256" | "sha384" | "sha512")
                    && !hex.is_empty()
                    && hex.chars().all(|c| c.is_ascii_hexdigit())
            })
        })
        .map(String::from);
    n.checkout_name = checkout_name(&pkg);
    n.colour_snapshot = colour_snapshot(f);
    n.yarn_berry = n.package_manager == "yarn"
        && (f.exists(".yarnrc.yml")
            || n.package_manager_version
                .as_deref()
                .and_then(min_major)
                .is_some_and(|m| m >= 2));
    // Plug'n'Play only where the project's git ignores its map and does not
    // track one: every mode's sandbox mounts the image's `.pnp.cjs` over the
    // work tree, and the mount point the engine leaves there must be nothing
    // git (belay's, or an agent's in its container) would commit.
    n.yarn_pnp = n.yarn_berry
        && f.read(".yarnrc.yml")
            .as_deref()
            .and_then(yarnrc_node_linker)
            .is_none_or(|l| l == "pnp")
        && !PNP_MAPS.iter().any(|m| f.exists(m))
        && f.read(".gitignore")
            .is_some_and(|g| PNP_MAPS.iter().all(|m| gitignore_ignores_at_root(&g, m)));
    n.lockfile = lock.map(String::from);
    // Read once: the pnpm it names and the native helpers it holds.
    let lock_text = lock.and_then(|l| f.read(l));
    if n.package_manager == "pnpm"
        && n.package_manager_version.is_none()
        && lock == Some("pnpm-lock.yaml")
    {
        n.lockfile_pnpm_major = lock_text.as_deref().and_then(pnpm_major_of_lockfile);
    }
    if n.has_npm_lockfile() {
        // Only the one key: a lockfile can be megabytes.
        #[derive(serde::Deserialize)]
        struct Lock {
            #[serde(rename = "lockfileVersion")]
            version: Option<u32>,
        }
        n.npm_lockfile_version = lock_text
            .as_deref()
            .and_then(|t| serde_json::from_str::<Lock>(t).ok())
            .and_then(|l| l.version);
    }
    n.engines_node = pkg
        .pointer("/engines/node")
        .and_then(|v| v.as_str())
        .map(String::from);
    // A pinned version: what the project's developers run.
    n.node_pin = [".nvmrc", ".node-version"]
        .iter()
        .find_map(|name| f.read(name))
        .map(|s| {
            s.lines()
                .next()
                .unwrap_or("")
                .trim()
                .trim_start_matches('v')
                .to_string()
        })
        .or_else(|| {
            pkg.pointer("/volta/node")
                .and_then(|v| v.as_str())
                .map(String::from)
        })
        .filter(|s| !s.is_empty());
    n.node_line = node_line(n.node_pin.as_deref(), n.engines_node.as_deref());
    if n.node_pin.is_none() && n.node_line.is_none() {
        // Settled against the project's date by the build and the plan
        // (`as_of::apply_node_era`).
        let ci = ci_node::read(f);
        if !ci.newest {
            let engines = n.engines_node.as_deref();
            let floor = engines.and_then(min_major).unwrap_or(0);
            n.ci_node_lines = ci
                .lines
                .into_iter()
                .filter(|l| {
                    (OLDEST_NODE_LINE.max(floor)..=crate::as_of::NEWEST_NODE_MAJOR).contains(l)
                        && engines.is_none_or(|r| crate::as_of::allows_major(r, *l))
                })
                .collect();
            n.ci_node_files = ci
                .files
                .into_iter()
                .filter(|(_, lines)| n.ci_node_lines.iter().any(|l| lines.contains(l)))
                .map(|(name, _)| name)
                .collect();
        }
    }
    if n.engines_node.is_none() {
        n.engines_node = n.node_pin.clone();
    }
    // The newest of what the range asks for at least and what the pin says.
    n.required_major = [
        n.engines_node.as_deref().and_then(min_major),
        n.node_pin.as_deref().and_then(min_major),
    ]
    .into_iter()
    .flatten()
    .max();
    n.test_script = pkg
        .pointer("/scripts/test")
        .and_then(|v| v.as_str())
        .filter(|s| !s.contains("no test specified"))
        .map(String::from);
    let known = |p: &str| crate::repair::program_packages(p).is_some();
    let sources = f.find(4, &|p: &Path| {
        p.extension()
            .is_some_and(|e| e == "js" || e == "cjs" || e == "mjs" || e == "ts")
    });
    let read = |p: &str| f.read_at_most(p, script_tools::MAX_TEXT);
    let mut tools = script_tools::test_programs(&pkg, &read);
    tools.retain(|p| known(p));
    tools.extend(script_tools::source_programs(&sources, &read, &known));
    n.script_tools = tools.into_iter().collect();
    let mut all_deps = BTreeSet::new();
    for section in ["dependencies", "devDependencies", "optionalDependencies"] {
        if let Some(obj) = pkg.get(section).and_then(|d| d.as_object()) {
            all_deps.extend(obj.keys().cloned());
        }
    }
    n.has_dependencies = !all_deps.is_empty();
    n.native_addons = f.exists("binding.gyp")
        || all_deps
            .iter()
            .any(|d| NATIVE_BUILD_HELPERS.contains(&d.as_str()))
        || lock_text
            .as_deref()
            .is_some_and(names_a_native_build_helper);
    let script = n.test_script.clone().unwrap_or_default();
    for (dep, fw) in [
        ("jest", "jest"),
        ("mocha", "mocha"),
        ("vitest", "vitest"),
        ("ava", "ava"),
        ("tap", "tap"),
    ] {
        if all_deps.contains(dep) || script.split_whitespace().next() == Some(dep) {
            frameworks.insert(fw.to_string());
        }
    }
    if script.contains("node --test") {
        frameworks.insert("node-test".to_string());
    }
    if n.has_dependencies && n.lockfile.is_none() {
        warnings.push(
            "package.json has dependencies but no lockfile: versions are resolved at build time"
                .into(),
        );
    }
    Ok(Some(n))
}

/// The packages native addons compile with at install: node-gyp itself,
/// the headers addons include (nan, node-addon-api) and the installers that
/// fall back to compiling when no prebuilt binary is found.
const NATIVE_BUILD_HELPERS: &[&str] = &[
    "node-gyp",
    "node-gyp-build",
    "nan",
    "node-addon-api",
    "prebuild-install",
    "node-pre-gyp",
    "@mapbox/node-pre-gyp",
    "cmake-js",
];

/// Whether a lockfile (npm's, yarn's or pnpm's) holds a package only native
/// addons use: `"node_modules/nan"`, `nan@^2.17.0:`, `/nan@2.17.0:`,
/// `'@mapbox/node-pre-gyp@1.0.11':`. Not node-gyp itself, which npm's own
/// tooling (`@npmcli/run-script`, under lerna, pacote and the Angular CLI)
/// brings to projects with no addon, and never a scoped namesake
/// (`@npmcli/node-gyp`).
fn names_a_native_build_helper(lock: &str) -> bool {
    static RE: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        let names: Vec<String> = NATIVE_BUILD_HELPERS
            .iter()
            .filter(|n| **n != "node-gyp")
            .map(|n| regex::escape(n))
            .collect();
        regex::Regex::new(&format!(
            r#"(?m)(?:^\s*/?|["']|node_modules/)(?:{})(?:@[\w^~.<>=*-]|["':])"#,
            names.join("|")
        ))
        .ok()
    })
    .as_ref()
    .is_some_and(|re| re.is_match(lock))
}

/// The oldest node line belay installs for a project that names one: the
/// npm registry's `node` package goes back further, but npm 5 (node 4's)
/// is the oldest npm that installs from a registry of today, and node 4
/// the oldest LTS line. A project that names an older one gets the
/// distribution's node, as one that names none does.
pub const OLDEST_NODE_LINE: u32 = 4;

/// The node line a project names (see [`NodeFacts::node_line`]): its pin's
/// major, else the newest major its `engines.node` admits when the range
/// has an upper bound. None where neither says one, where the pin is
/// outside `engines.node`, or where the line is older than
/// [`OLDEST_NODE_LINE`].
pub fn node_line(pin: Option<&str>, engines: Option<&str>) -> Option<u32> {
    let capped = |range: &str| {
        use crate::as_of::allows_major;
        // A range that admits a node far in the future has no upper bound.
        if allows_major(range, 99) {
            return None;
        }
        // The newest released line it admits, an LTS (even) one first: a
        // bound past every release (`<30`) names the newest there is.
        let newest = crate::as_of::NEWEST_NODE_MAJOR;
        let admitted = |even: bool| {
            (0..=newest)
                .rev()
                .find(|m| (!even || m % 2 == 0) && allows_major(range, *m))
        };
        admitted(true).or_else(|| admitted(false))
    };
    let line = pin
        .and_then(pin_major)
        .or_else(|| engines.and_then(capped))?;
    (line >= OLDEST_NODE_LINE && engines.is_none_or(|r| crate::as_of::allows_major(r, line)))
        .then_some(line)
}

/// The major of a node pin as nvm reads it: `16`, `v16.20.2`, `16.x`, or an
/// LTS line's name (`lts/gallium`). `lts/*`, `node` and `stable` name no
/// line of their own.
pub(crate) fn pin_major(pin: &str) -> Option<u32> {
    const LTS: &[(&str, u32)] = &[
        ("argon", 4),
        ("boron", 6),
        ("carbon", 8),
        ("dubnium", 10),
        ("erbium", 12),
        ("fermium", 14),
        ("gallium", 16),
        ("hydrogen", 18),
        ("iron", 20),
        ("jod", 22),
        ("krypton", 24),
    ];
    let pin = pin.trim().to_ascii_lowercase();
    if let Some(name) = pin.strip_prefix("lts/") {
        return LTS.iter().find(|(n, _)| *n == name).map(|(_, m)| *m);
    }
    let digits: String = pin
        .trim_start_matches('v')
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// The smallest major version a simple engines range allows (">=18", "^20.1",
/// "18.x", "v20"). Complex ranges give their first bound.
pub fn min_major(range: &str) -> Option<u32> {
    let r = regex::Regex::new(r"(\d+)").ok()?;
    let first = range.split("||").next()?;
    r.captures(first)?.get(1)?.as_str().parse().ok()
}

fn rust(f: &Files) -> Option<RustFacts> {
    let text = f.read("Cargo.toml")?;
    let mut r = RustFacts::default();
    if let Ok(t) = text.parse::<toml::Table>() {
        r.workspace = t.contains_key("workspace");
        r.rust_version = t
            .get("package")
            .and_then(|p| p.get("rust-version"))
            .and_then(|v| v.as_str())
            .map(String::from);
        r.has_dependencies = ["dependencies", "dev-dependencies", "build-dependencies"]
            .iter()
            .any(|s| {
                t.get(*s)
                    .and_then(|d| d.as_table())
                    .is_some_and(|d| !d.is_empty())
            })
            || r.workspace;
    }
    r.toolchain = f
        .read("rust-toolchain.toml")
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| {
            t.get("toolchain")?
                .get("channel")?
                .as_str()
                .map(String::from)
        })
        .or_else(|| f.read("rust-toolchain").map(|s| s.trim().to_string()));
    Some(r)
}

fn go(f: &Files) -> Option<GoFacts> {
    let text = f.read("go.mod")?;
    let mut g = GoFacts::default();
    for line in text.lines() {
        let l = line.trim();
        if let Some(m) = l.strip_prefix("module ") {
            g.module = Some(m.trim().to_string());
        } else if let Some(v) = l.strip_prefix("go ") {
            g.go_version = Some(v.trim().to_string());
        } else if l.starts_with("require") {
            g.has_dependencies = true;
        }
    }
    Some(g)
}

fn java(f: &Files) -> Option<JavaFacts> {
    if f.exists("pom.xml") {
        Some(JavaFacts {
            build_tool: "maven".into(),
            wrapper: f.exists("mvnw"),
        })
    } else if f.exists("build.gradle") || f.exists("build.gradle.kts") {
        Some(JavaFacts {
            build_tool: "gradle".into(),
            wrapper: f.exists("gradlew"),
        })
    } else {
        None
    }
}

fn native(f: &Files, no_language: bool) -> Option<NativeFacts> {
    let mut systems = Vec::new();
    if f.exists("CMakeLists.txt") {
        systems.push("cmake".to_string());
    }
    if f.exists("meson.build") {
        systems.push("meson".to_string());
    }
    if f.exists("configure") {
        systems.push("autotools".to_string());
    }
    if f.exists("Makefile") || f.exists("makefile") {
        systems.push("make".to_string());
    }
    let has_c = !f
        .find(2, &|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("c" | "cc" | "cpp" | "cxx" | "h" | "hpp")
            )
        })
        .is_empty();
    if systems.is_empty() && !has_c {
        return None;
    }
    // A Makefile in a Python repo is usually a task runner, not a native build.
    let primary = no_language && (has_c || systems.iter().any(|s| s != "make"));
    if !primary && !has_c {
        return None;
    }
    Some(NativeFacts {
        build_systems: systems,
        primary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_root_gitignore_ignores_the_plug_n_play_map() {
        for (text, ignored) in [
            (".pnp.*\n", true),
            ("/.pnp.*\n", true),
            (".pnp.cjs\n", true),
            (".pnp*\n", true),
            ("*.cjs\n", true),
            ("# .pnp.*\n", false),
            (".pnp.*\n!.pnp.cjs\n", false),
            ("!.pnp.cjs\n.pnp.*\n", true),
            ("sub/.pnp.*\n", false),
            ("[.]pnp.*\n", false),
            (".pnp.js\n", false),
            ("", false),
        ] {
            assert_eq!(
                gitignore_ignores_at_root(text, ".pnp.cjs"),
                ignored,
                "{text:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn a_name_ignores_itself_and_no_pattern_panics(name in "[a-z.]{1,12}", text in "\\PC{0,80}") {
            proptest::prop_assert!(gitignore_ignores_at_root(&name, &name));
            let _ = gitignore_ignores_at_root(&text, &name);
        }
    }

    #[test]
    fn requirement_names() {
        assert_eq!(
            requirement_name("Django>=4 ; python_version>'3'").as_deref(),
            Some("django")
        );
        assert_eq!(
            requirement_name("typing_extensions").as_deref(),
            Some("typing-extensions")
        );
        assert_eq!(requirement_name("-r base.txt"), None);
        assert_eq!(requirement_name("# c"), None);
    }

    #[test]
    fn engines_major() {
        assert_eq!(min_major(">=18.0.0"), Some(18));
        assert_eq!(min_major("^20.1 || ^22"), Some(20));
        assert_eq!(min_major("v16"), Some(16));
        assert_eq!(min_major("lts/*"), None);
    }

    #[test]
    fn a_pin_or_a_capped_engines_names_the_node_line() {
        let line = |pin: Option<&str>, engines: Option<&str>| node_line(pin, engines);
        // A pin is the line its developers run, older or newer than Debian's.
        assert_eq!(line(Some("16"), None), Some(16));
        assert_eq!(line(Some("v14.21.3"), None), Some(14));
        assert_eq!(line(Some("16.x"), None), Some(16));
        assert_eq!(line(Some("lts/gallium"), None), Some(16));
        assert_eq!(line(Some("lts/Erbium"), None), Some(12));
        assert_eq!(line(Some("22"), Some(">=18")), Some(22));
        // No line of its own: the newest LTS, or whatever is installed.
        assert_eq!(line(Some("lts/*"), None), None);
        assert_eq!(line(Some("node"), None), None);
        // An engines range with an upper bound names its newest major.
        assert_eq!(line(None, Some("14.x")), Some(14));
        assert_eq!(line(None, Some(">=12 <17")), Some(16));
        assert_eq!(line(None, Some("^12 || ^14")), Some(14));
        // An LTS line before an odd one; a prerelease bound of zeros is
        // below its major; no line past the newest released.
        assert_eq!(line(None, Some("<18")), Some(16));
        assert_eq!(line(None, Some(">=18 <20")), Some(18));
        assert_eq!(line(None, Some(">=15 <16")), Some(15));
        assert_eq!(line(None, Some(">=14.0.0 <17.0.0-0")), Some(16));
        assert_eq!(
            line(None, Some(">=20 <30")),
            Some(crate::as_of::NEWEST_NODE_MAJOR)
        );
        // A floor names none: the distribution's node or a newer one runs.
        assert_eq!(line(None, Some(">=10")), None);
        assert_eq!(line(None, Some("^18.17.0 || >=20.5.0")), None);
        // A pin engines.node excludes is no line; nor is a line older than
        // node 4, whose npm 5 is the oldest that installs today.
        assert_eq!(line(Some("16"), Some(">=18")), None);
        assert_eq!(line(Some("8"), None), Some(8));
        assert_eq!(line(Some("lts/argon"), None), Some(4));
        assert_eq!(line(None, Some("0.10.x")), None);
        assert_eq!(line(Some("0.12"), None), None);
        // Read from the files: `.nvmrc` below Debian's node is now a line.
        let n = node_facts(&[("package.json", "{}"), (".nvmrc", "lts/gallium\n")]);
        assert_eq!((n.node_line, n.required_major), (Some(16), None));
        let n = node_facts(&[("package.json", r#"{"engines": {"node": "14.x"}}"#)]);
        assert_eq!((n.node_line, n.required_major), (Some(14), Some(14)));
    }

    #[test]
    fn node_pins_and_package_manager_versions() {
        // engines is a floor; a pin says what the developers run: the newer.
        let n = node_facts(&[
            ("package.json", r#"{"engines": {"node": ">=18"}}"#),
            (".nvmrc", "v20.11.1\n"),
        ]);
        assert_eq!(
            (n.node_pin.as_deref(), n.required_major),
            (Some("20.11.1"), Some(20))
        );
        let n = node_facts(&[("package.json", "{}"), (".node-version", "22\n")]);
        assert_eq!(n.required_major, Some(22));
        let n = node_facts(&[("package.json", r#"{"volta": {"node": "21.2.0"}}"#)]);
        assert_eq!(n.required_major, Some(21));
        // corepack's integrity hash is no version; yarn 2+ is berry.
        let n = node_facts(&[(
            "package.json",
            r#"{"packageManager": "pnpm@9.2.0+sha512.98a80fd11c2e7096747762304106432b3ddc67dcf54b5a8c01c93f68a2cd5e05e6821eb8ad2b5d7ad08b4d5a1fd35d6d4da5b4fa3e1b55bd7b8e2f8fc3f2a8a1"}"#,
        )]);
        assert_eq!(
            (
                n.package_manager.as_str(),
                n.package_manager_version.as_deref()
            ),
            ("pnpm", Some("9.2.0"))
        );
        assert!(n
            .package_manager_hash
            .as_deref()
            .is_some_and(|h| h.starts_with("sha512.98a80fd1") && h.ends_with("a8a1")));
        let n = node_facts(&[
            ("package.json", r#"{"packageManager": "yarn@4.1.0"}"#),
            ("yarn.lock", ""),
        ]);
        assert!(n.yarn_berry && n.lockfile.as_deref() == Some("yarn.lock"));
        // Plug'n'Play is yarn's default, kept where git ignores its map.
        assert!(!n.yarn_pnp);
        let n = node_facts(&[
            ("package.json", r#"{"packageManager": "yarn@4.1.0"}"#),
            ("yarn.lock", ""),
            (".gitignore", "node_modules\n.yarn/*\n.pnp.*\n"),
        ]);
        assert!(n.yarn_pnp);
        // A map the project tracks (zero-install) is not mounted over.
        let n = node_facts(&[
            ("package.json", r#"{"packageManager": "yarn@4.1.0"}"#),
            ("yarn.lock", ""),
            (".gitignore", ".pnp.*\n"),
            (".pnp.cjs", ""),
        ]);
        assert!(!n.yarn_pnp);
        for (rc, pnp) in [
            ("enableGlobalCache: false\n", true),
            ("nodeLinker: pnp\n", true),
            ("nodeLinker: \"node-modules\"\n", false),
            ("nodeLinker: pnpm\n", false),
            ("{not yaml", true),
        ] {
            let n = node_facts(&[
                ("package.json", "{}"),
                ("yarn.lock", ""),
                (".yarnrc.yml", rc),
                (".gitignore", "/.pnp.*\n"),
            ]);
            assert!(n.yarn_berry && n.yarn_pnp == pnp, "{rc}");
        }
        let n = node_facts(&[("package.json", r#"{"packageManager": "yarn@1.22.19"}"#)]);
        assert!(!n.yarn_pnp);
        let n = node_facts(&[
            ("package.json", "{}"),
            ("yarn.lock", ""),
            (".yarnrc.yml", "nodeLinker: node-modules\n"),
        ]);
        assert!(n.yarn_berry);
        let n = node_facts(&[("package.json", r#"{"packageManager": "yarn@1.22.19"}"#)]);
        assert!(!n.yarn_berry);
        // Nothing but a version reaches the plan's script.
        let n = node_facts(&[(
            "package.json",
            r#"{"packageManager": "pnpm@9'; touch /pwned; '"}"#,
        )]);
        assert_eq!(n.package_manager_version, None);
        let n = node_facts(&[(
            "package.json",
            r#"{"packageManager": "pnpm@9.2.0+sha512.ab'; touch /pwned; '"}"#,
        )]);
        assert_eq!(n.package_manager_version.as_deref(), Some("9.2.0"));
        assert_eq!(n.package_manager_hash, None);
    }

    #[test]
    fn a_clone_is_named_after_the_repository_else_the_package() {
        let name = |pkg: &str| node_facts(&[("package.json", pkg)]).checkout_name;
        for (pkg, want) in [
            (
                r#"{"name": "mqemitter", "repository": {"type": "git", "url": "git+https://github.com/mcollina/mqemitter.git"}}"#,
                Some("mqemitter"),
            ),
            (
                r#"{"name": "@pnpm/tabtab", "repository": "pnpm/tabtab"}"#,
                Some("tabtab"),
            ),
            (
                r#"{"name": "x", "repository": "github:user/the-repo#main"}"#,
                Some("the-repo"),
            ),
            (
                r#"{"name": "x", "repository": "git@host.example:user/other.git"}"#,
                Some("other"),
            ),
            (r#"{"name": "@scope/pkg"}"#, Some("pkg")),
            // Nothing a directory name cannot hold, nor belay's own.
            (
                r#"{"name": "x", "repository": "user/a b;touch y"}"#,
                Some("x"),
            ),
            // Nor a name belay mounts at: the pipeline's artifacts would
            // land in the checkout through the link.
            (r#"{"name": "repo"}"#, None),
            (r#"{"name": "artifacts"}"#, None),
            (r#"{"name": "x", "repository": "user/more"}"#, Some("x")),
            (r#"{"name": ".."}"#, None),
            (r#"{"name": "$(id)"}"#, None),
            (r#"{}"#, None),
        ] {
            assert_eq!(name(pkg).as_deref(), want, "{pkg}");
        }
    }

    #[test]
    fn a_pnpm_lockfile_names_the_pnpm_that_reads_it() {
        for (v, major) in [
            ("5.2", Some(5)),
            ("'5.3'", Some(6)),
            ("5.4", Some(7)),
            ("'6.0'", Some(8)),
            ("'6.1'", Some(8)),
            ("'9.0'", Some(9)),
            ("4", None),
            ("nine", None),
        ] {
            assert_eq!(
                super::pnpm_major_of_lockfile(&format!("lockfileVersion: {v}\n\nimporters:\n")),
                major,
                "{v}"
            );
        }
        let n = node_facts(&[
            ("package.json", "{}"),
            (
                "pnpm-lock.yaml",
                "dependencies:\n  debug: 4.3.1\n  enquirer: 2.3.6\n  minimist: 1.2.5\n  untildify: 4.0.0\ndevDependencies:\n  mocha: 8.2.1\nlockfileVersion: 5.2\npackages:\n  /debug/4.3.1:\n",
            ),
        ]);
        assert_eq!(n.lockfile_pnpm_major, Some(5));
        let n = node_facts(&[
            ("package.json", r#"{"packageManager": "pnpm@8.15.0"}"#),
            ("pnpm-lock.yaml", "lockfileVersion: 5.2\n"),
        ]);
        assert_eq!(n.lockfile_pnpm_major, None, "the pin wins");
    }

    /// The node facts of a directory holding `files`.
    fn node_facts(files: &[(&str, &str)]) -> NodeFacts {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        analyze(dir.path()).unwrap().node.unwrap()
    }

    #[test]
    fn the_system_programs_the_test_scripts_run_are_found() {
        let n = node_facts(&[
            (
                "package.json",
                r#"{"scripts": {"pretest": "rsync -r ./ node_modules/x || echo fine", "test": "make check", "lint": "shellcheck x.sh"}}"#,
            ),
            ("Makefile", "check:\n\tjq . package.json && tap test/*.js\n"),
        ]);
        // `echo` and `tap` are no Debian package's; `lint` is not the test's.
        assert_eq!(n.script_tools, ["jq", "make", "rsync"]);
        let none = node_facts(&[("package.json", r#"{"scripts": {"test": "node --test"}}"#)]);
        assert!(none.script_tools.is_empty(), "{:?}", none.script_tools);
        // The project's own code, read only where a file is script-sized.
        let call = "sh('lsof -i -P')\n";
        let big = format!("{call}{}", "x".repeat(script_tools::MAX_TEXT));
        let pkg = ("package.json", r#"{"name": "x"}"#);
        assert_eq!(
            node_facts(&[pkg, ("index.js", call)]).script_tools,
            ["lsof"]
        );
        assert!(node_facts(&[pkg, ("index.js", &big)])
            .script_tools
            .is_empty());
    }

    #[test]
    fn snapshots_recorded_on_a_colour_terminal_are_seen() {
        let pkg = ("package.json", r#"{"devDependencies": {"jest": "23"}}"#);
        let plain = "exports[`x 1`] = `\"expect(received).toBeTruthy()\"`;\n";
        let coloured =
            "exports[`x 1`] = `\"\u{1b}[2mexpect(\u{1b}[22m\u{1b}[31mreceived\u{1b}[39m\"`;\n";
        let n = node_facts(&[pkg, ("src/__snapshots__/a.test.js.snap", plain)]);
        assert_eq!(n.colour_snapshot, None);
        let n = node_facts(&[
            pkg,
            ("src/__snapshots__/a.test.js.snap", plain),
            ("src/__snapshots__/b.test.js.snap", coloured),
        ]);
        assert_eq!(
            n.colour_snapshot.as_deref(),
            Some("src/__snapshots__/b.test.js.snap")
        );
        // A test that makes the codes itself (a test of ANSI handling)
        // stores them whatever the terminal was.
        let n = node_facts(&[
            pkg,
            ("src/__snapshots__/b.test.js.snap", coloured),
            (
                "src/b.test.js",
                "const chalk = require('chalk');\nchalk.level = 1;\n",
            ),
        ]);
        assert_eq!(n.colour_snapshot, None);
        let n = node_facts(&[
            pkg,
            ("src/__snapshots__/b.test.js.snap", coloured),
            (
                "src/b.test.js",
                "expect(() => expect(false).toBeTruthy()).toThrowErrorMatchingSnapshot();\n",
            ),
        ]);
        assert_eq!(
            n.colour_snapshot.as_deref(),
            Some("src/__snapshots__/b.test.js.snap")
        );
        // Only a snapshot counts, and none under node_modules.
        let n = node_facts(&[
            pkg,
            ("src/fixtures/coloured.txt", coloured),
            ("node_modules/x/__snapshots__/a.snap", coloured),
        ]);
        assert_eq!(n.colour_snapshot, None);
    }

    #[test]
    fn native_addons_are_seen_in_the_manifest_the_lockfile_or_a_binding_gyp() {
        let n = node_facts(&[("package.json", r#"{"dependencies": {"left-pad": "1"}}"#)]);
        assert!(!n.native_addons);
        let n = node_facts(&[("package.json", r#"{"dependencies": {"nan": "^2"}}"#)]);
        assert!(n.native_addons);
        let n = node_facts(&[("package.json", "{}"), ("binding.gyp", "{}")]);
        assert!(n.native_addons);
        for (lock, text, native) in [
            (
                "package-lock.json",
                r#"{"packages": {"node_modules/nan": {"version": "2.17.0"}}}"#,
                true,
            ),
            (
                "package-lock.json",
                r#"{"packages": {"node_modules/banana": {"version": "1.0.0"}}}"#,
                false,
            ),
            (
                "yarn.lock",
                "node-addon-api@^7.0.0:\n  version \"7.1.0\"\n",
                true,
            ),
            (
                "yarn.lock",
                "\"@mapbox/node-pre-gyp@^1.0.0\":\n  version \"1.0.11\"\n",
                true,
            ),
            (
                "pnpm-lock.yaml",
                "packages:\n  /prebuild-install@7.1.1:\n    resolution: {}\n",
                true,
            ),
            (
                "pnpm-lock.yaml",
                "packages:\n  /nanoid@3.3.7:\n    resolution: {}\n",
                false,
            ),
            (
                "pnpm-lock.yaml",
                "packages:\n  nan@2.17.0:\n    resolution: {}\n",
                true,
            ),
            (
                "package-lock.json",
                r#"{"packages": {"node_modules/@npmcli/node-gyp": {}, "node_modules/node-gyp": {}}}"#,
                false,
            ),
            (
                "yarn.lock",
                "\"@npmcli/run-script@^7.0.0\":\n  dependencies:\n    node-gyp \"^10.0.0\"\n",
                false,
            ),
        ] {
            let n = node_facts(&[
                ("package.json", r#"{"dependencies": {"x": "1"}}"#),
                (lock, text),
            ]);
            assert_eq!(n.native_addons, native, "{lock}: {text}");
        }
    }

    #[test]
    fn bad_package_json_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("package.json"),
            "{\n  \"name\": \"x\",\n  oops\n}\n",
        )
        .unwrap();
        let err = analyze(dir.path()).unwrap_err().to_string();
        assert!(err.contains("package.json:3:"), "{err}");
    }

    #[test]
    fn each_extras_requirements_are_kept_by_name() {
        for (file, text) in [
            (
                "pyproject.toml",
                "[project]\nname = \"calc\"\nversion = \"1\"\n[project.optional-dependencies]\nyaml = [\"PyYAML>=5.1\", \"ruamel.yaml\"]\nmsgpack = [\"msgpack>=1.0.5 ; python_version >= '3.8'\"]\n",
            ),
            (
                "setup.cfg",
                "[metadata]\nname = calc\n\n[options.extras_require]\nyaml = PyYAML>=5.1\n    ruamel.yaml\nmsgpack =\n    msgpack>=1.0.5\n\n[flake8]\nmax-line-length = 99\n",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(file), text).unwrap();
            let py = analyze(dir.path()).unwrap().python.unwrap();
            assert_eq!(py.extras, ["msgpack", "yaml"], "{file}");
            assert_eq!(py.extra_requirements["yaml"], ["pyyaml", "ruamel.yaml"], "{file}");
            assert_eq!(py.extra_requirements["msgpack"], ["msgpack"], "{file}");
        }
    }

    /// click's own pip-compiled `requirements/dev.txt` pins click 8.1.3 while
    /// the checkout is 8.1.7: one resolver call with both cannot be met.
    #[test]
    fn a_requirements_pin_of_the_project_itself_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let w = |p: &str, t: &str| {
            let p = dir.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, t).unwrap();
        };
        w(
            "setup.cfg",
            "[metadata]\nname = click\nversion = 8.1.7\n\n[options]\npython_requires = >=3.7\n",
        );
        w(
            "setup.py",
            "from setuptools import setup\nsetup(name=\"click\")\n",
        );
        w("requirements/dev.txt", "click==8.1.3\ncolorama==0.4.6\n");
        let ctx = analyze(dir.path()).unwrap();
        let py = ctx.python.unwrap();
        assert_eq!(py.project_name.as_deref(), Some("click"));
        assert_eq!(
            py.resolved_requirements
                .get("requirements/dev.txt")
                .map(Vec::as_slice),
            Some(&["colorama==0.4.6".to_string()][..]),
            "{:?}",
            py.resolved_requirements
        );
        assert!(
            ctx.warnings
                .iter()
                .any(|m| m.contains("pins the project itself")),
            "{:?}",
            ctx.warnings
        );
    }

    /// simplejson's `setup(python_requires=PYTHON_REQUIRES)`: a variable, not a
    /// specifier, so the planner must not refuse the project over it.
    #[test]
    fn a_python_requires_variable_is_not_a_specifier() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("setup.py"),
            "PYTHON_REQUIRES = '>=2.5'\nsetup(name='simplejson', python_requires=PYTHON_REQUIRES)\n",
        )
        .unwrap();
        let py = analyze(dir.path()).unwrap().python.unwrap();
        assert_eq!(py.requires_python, None);
        assert_eq!(py.project_name.as_deref(), Some("simplejson"));
    }

    #[test]
    fn missing_repo_is_a_clear_error() {
        let err = analyze(Path::new("/definitely/not/here"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/definitely/not/here"), "{err}");
    }

    proptest! {
        #[test]
        fn manifest_parsing_never_panics(pyproject in ".{0,200}", pkg in ".{0,200}", gomod in ".{0,100}") {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("pyproject.toml"), pyproject).unwrap();
            std::fs::write(dir.path().join("package.json"), pkg).unwrap();
            std::fs::write(dir.path().join("go.mod"), gomod).unwrap();
            let _ = analyze(dir.path());
        }
    }
}
