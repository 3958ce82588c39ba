//! What the repository's Python files say: the project, its requirements,
//! its installer, its Python version hints, and whether its version comes
//! from git.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{conftest_imports, pytest_plugins, requirement_name, requirements, Files, PluginNeed};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PythonFacts {
    pub project_name: Option<String>,
    /// Importable top-level package, when it can be located.
    pub import_name: Option<String>,
    pub requires_python: Option<String>,
    /// Version hints from .python-version, Pipfile, tox envlist, classifiers.
    pub version_hints: Vec<String>,
    pub installer: PythonInstaller,
    pub installable: bool,
    pub requirement_files: Vec<String>,
    /// Requirements files that name paths relative to themselves, with the
    /// installer arguments that stand for them (see `requirements.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resolved_requirements: BTreeMap<String, Vec<String>>,
    pub extras: Vec<String>,
    /// Each extra's requirement names (normalised: `pyyaml`, `pytest-cov`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_requirements: BTreeMap<String, Vec<String>>,
    pub test_extras: Vec<String>,
    /// The test requirements of `[dependency-groups]` (or PDM's, uv's dev
    /// lists), installed with the project in one resolution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_groups: Option<super::test_groups::TestGroups>,
    pub dependencies: Vec<String>,
    /// `[project] dependencies` alone, normalised: what is installed with the
    /// project whatever its extras.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub core_dependencies: Vec<String>,
    pub needs_git: bool,
    /// The build backend compiles Rust (setuptools-rust, maturin in
    /// `build-system.requires`): cargo goes in the runtime block.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_rust: bool,
    /// What derives the version from git metadata (`pbr`, `setuptools-scm`,
    /// `versioneer`, `hatch-vcs`, `dunamai`, `git describe in setup.py`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcs_versioning: Option<String>,
    pub has_tox: bool,
    /// pytest plugins the test configuration names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test_plugins: Vec<PluginNeed>,
    /// Third-party modules the conftests import unconditionally, which
    /// collection needs (`conftest_imports.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conftest_imports: Vec<conftest_imports::ConftestImport>,
    /// The date dependencies are resolved as of (see `as_of.rs`); set by
    /// the build and `env plan`, not by the file analysis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolve_as_of: Option<crate::as_of::ResolveAsOf>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PythonInstaller {
    #[default]
    Pip,
    Poetry,
    Uv,
    Pipenv,
}

pub(super) fn python(
    f: &Files,
    frameworks: &mut BTreeSet<String>,
    warnings: &mut Vec<String>,
) -> Option<PythonFacts> {
    let pyproject = f.read("pyproject.toml");
    let setup_py = f.read("setup.py");
    let setup_cfg = f.read("setup.cfg");
    let pipfile = f.read("Pipfile");
    let req_files = requirement_files(f);
    if pyproject.is_none()
        && setup_py.is_none()
        && setup_cfg.is_none()
        && pipfile.is_none()
        && req_files.is_empty()
    {
        return None;
    }
    let mut py = PythonFacts::default();
    let mut deps: Vec<String> = Vec::new();
    let mut pytest_config = f.exists("pytest.ini") || f.exists("conftest.py");
    if let Some(text) = &pyproject {
        read_pyproject(text, &mut py, &mut deps, &mut pytest_config, warnings);
    }
    if f.exists("uv.lock") {
        py.installer = PythonInstaller::Uv;
    } else if f.exists("poetry.lock") {
        py.installer = PythonInstaller::Poetry;
    } else if pipfile.is_some() && pyproject.is_none() && setup_py.is_none() {
        py.installer = PythonInstaller::Pipenv;
    }
    if setup_py.is_some() || setup_cfg.is_some() {
        py.installable = true;
    }
    read_setup_files(
        setup_py.as_deref(),
        setup_cfg.as_deref(),
        &mut py,
        &mut pytest_config,
    );
    if py.project_name.is_none() {
        py.project_name = setup_name(setup_cfg.as_deref(), setup_py.as_deref());
    }
    // The tests' dependency groups, once the project's name is known from
    // any file (a self-reference `name[extra]` is the checkout). Only pip's
    // plan installs them: `uv sync` and `poetry install` take their own groups.
    if py.installer == PythonInstaller::Pip {
        pip_test_groups(pyproject.as_deref(), &mut py, &mut deps);
    }
    if let Some(text) = &setup_cfg {
        setup_cfg_extras(text, &mut py);
    }
    classifier_hints(
        [
            pyproject.as_deref(),
            setup_py.as_deref(),
            setup_cfg.as_deref(),
        ],
        &mut py,
    );
    if let Some(v) = f.read(".python-version") {
        if let Some(line) = v.lines().next() {
            py.version_hints
                .push(format!(".python-version {}", line.trim()));
        }
    }
    if let Some(text) = &pipfile {
        read_pipfile(text, &mut py, &mut deps);
    }
    if let Some(text) = f.read("tox.ini") {
        py.has_tox = true;
        if let Some(line) = text.lines().find(|l| l.trim_start().starts_with("envlist")) {
            py.version_hints.push(format!("tox {}", line.trim()));
        }
        pytest_config |= text.contains("[pytest]") || text.contains("pytest");
    }
    read_requirement_files(f, &req_files, &mut py, &mut deps, warnings);
    settle_dependencies(&mut py, &deps);
    let test_files = has_test_files(f);
    if pytest_config || py.dependencies.iter().any(|d| d == "pytest") || test_files {
        frameworks.insert("pytest".to_string());
    }
    // The importable package: src/<name>, <name>/ or <name>.py.
    if let Some(name) = &py.project_name {
        let module = name.to_ascii_lowercase().replace(['-', '.'], "_");
        if f.exists(&format!("src/{module}/__init__.py"))
            || f.exists(&format!("{module}/__init__.py"))
            || f.exists(&format!("{module}.py"))
        {
            py.import_name = Some(module);
        }
    }
    py.vcs_versioning =
        vcs_versioning(f, [&pyproject, &setup_py, &setup_cfg].into_iter().flatten());
    if py.vcs_versioning.is_some() {
        py.needs_git = true;
    }
    if frameworks.contains("pytest") {
        test_needs(f, &mut py);
    }
    Some(py)
}

/// The requirements files near the root, a compiled `.txt` superseding its `.in`.
fn requirement_files(f: &Files) -> Vec<String> {
    let mut req_files = f.find(1, &|p| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent_is_req = p
            .parent()
            .and_then(|d| d.file_name())
            .is_some_and(|d| d == "requirements");
        (name.starts_with("requirements") && (name.ends_with(".txt") || name.ends_with(".in")))
            || (parent_is_req && name.ends_with(".txt"))
    });
    // A compiled .txt supersedes its .in.
    let txts: BTreeSet<String> = req_files
        .iter()
        .filter(|r| r.ends_with(".txt"))
        .cloned()
        .collect();
    req_files.retain(|r| !(r.ends_with(".in") && txts.contains(&r.replace(".in", ".txt"))));
    req_files
}

/// What `pyproject.toml` says, or a warning when it is not valid TOML.
fn read_pyproject(
    text: &str,
    py: &mut PythonFacts,
    deps: &mut Vec<String>,
    pytest_config: &mut bool,
    warnings: &mut Vec<String>,
) {
    match text.parse::<toml::Table>() {
        Ok(t) => pyproject_table(&t, text, py, deps, pytest_config),
        Err(e) => warnings.push(format!(
            "pyproject.toml is not valid TOML ({}); it is ignored",
            e.message()
        )),
    }
}

/// What a parsed `pyproject.toml` (`t`, parsed from `text`) says.
fn pyproject_table(
    t: &toml::Table,
    text: &str,
    py: &mut PythonFacts,
    deps: &mut Vec<String>,
    pytest_config: &mut bool,
) {
    let project = t.get("project").and_then(|p| p.as_table());
    pyproject_project(project, py, deps);
    let tool = t.get("tool").and_then(|x| x.as_table());
    if let Some(poetry) = tool
        .and_then(|x| x.get("poetry"))
        .and_then(|x| x.as_table())
    {
        poetry_section(poetry, py, deps);
    }
    if tool.is_some_and(|x| x.contains_key("pytest")) {
        *pytest_config = true;
    }
    if tool.is_some_and(|x| x.contains_key("setuptools_scm") || x.contains_key("hatch"))
        && text.contains("vcs")
        || tool.is_some_and(|x| x.contains_key("setuptools_scm"))
    {
        py.needs_git = true;
    }
    // A Rust extension built by setuptools-rust or maturin needs
    // cargo in the container (bcrypt: "can't find Rust compiler").
    if let Some(req) = t
        .get("build-system")
        .and_then(|b| b.get("requires"))
        .and_then(|r| r.as_array())
    {
        let names: Vec<String> = req
            .iter()
            .filter_map(|r| r.as_str())
            .filter_map(requirement_name)
            .collect();
        if names
            .iter()
            .any(|n| n == "setuptools-rust" || n == "maturin")
        {
            py.needs_rust = true;
        }
    }
    py.installable = t.contains_key("build-system")
        || project.is_some()
        || py.installer == PythonInstaller::Poetry;
}

/// The `[project]` table: name, requires-python, dependencies and extras.
fn pyproject_project(project: Option<&toml::Table>, py: &mut PythonFacts, deps: &mut Vec<String>) {
    py.project_name = project
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .map(String::from);
    py.requires_python = project
        .and_then(|p| p.get("requires-python"))
        .and_then(|n| n.as_str())
        .map(String::from);
    if let Some(list) = project
        .and_then(|p| p.get("dependencies"))
        .and_then(|d| d.as_array())
    {
        deps.extend(list.iter().filter_map(|d| d.as_str()).map(String::from));
        py.core_dependencies = list
            .iter()
            .filter_map(|d| d.as_str())
            .filter_map(requirement_name)
            .collect();
    }
    if let Some(extras) = project
        .and_then(|p| p.get("optional-dependencies"))
        .and_then(|d| d.as_table())
    {
        for (k, v) in extras {
            py.extras.push(k.clone());
            if let Some(a) = v.as_array() {
                let reqs: Vec<&str> = a.iter().filter_map(|d| d.as_str()).collect();
                py.extra_requirements.insert(
                    k.clone(),
                    reqs.iter().filter_map(|r| requirement_name(r)).collect(),
                );
                deps.extend(reqs.into_iter().map(String::from));
            }
        }
    }
}

/// The `[tool.poetry]` table: name, dependencies, groups; the installer is Poetry.
fn poetry_section(poetry: &toml::Table, py: &mut PythonFacts, deps: &mut Vec<String>) {
    if py.project_name.is_none() {
        py.project_name = poetry
            .get("name")
            .and_then(|n| n.as_str())
            .map(String::from);
    }
    for section in ["dependencies", "dev-dependencies"] {
        if let Some(d) = poetry.get(section).and_then(|d| d.as_table()) {
            deps.extend(d.keys().filter(|k| *k != "python").cloned());
            if let Some(v) = d.get("python").and_then(|v| v.as_str()) {
                py.version_hints.push(format!("poetry python {v}"));
            }
        }
    }
    if let Some(groups) = poetry.get("group").and_then(|g| g.as_table()) {
        for g in groups.values() {
            if let Some(d) = g.get("dependencies").and_then(|d| d.as_table()) {
                deps.extend(d.keys().cloned());
            }
        }
    }
    py.installer = PythonInstaller::Poetry;
}

/// What `setup.py` and `setup.cfg` say of requires-python, git and pytest.
fn read_setup_files(
    setup_py: Option<&str>,
    setup_cfg: Option<&str>,
    py: &mut PythonFacts,
    pytest_config: &mut bool,
) {
    let rx_python_requires = regex::Regex::new(r#"python_requires\s*=\s*['"]?([^'"\n,)]+)"#).ok();
    for text in [setup_py, setup_cfg].into_iter().flatten() {
        if py.requires_python.is_none() {
            if let Some(c) = rx_python_requires.as_ref().and_then(|r| r.captures(text)) {
                // `python_requires=PYTHON_REQUIRES` (a variable of setup.py)
                // is no specifier: only one that starts with an operator is.
                let v = c[1].trim();
                if v.starts_with(['<', '>', '=', '!', '~']) {
                    py.requires_python = Some(v.to_string());
                }
            }
        }
        if text.contains("setuptools_scm") || text.contains("use_scm_version") {
            py.needs_git = true;
        }
        if text.contains("pytest") {
            *pytest_config |= text.contains("[tool:pytest]");
        }
    }
}

/// The test dependency groups of `pyproject.toml`, for pip's plan.
fn pip_test_groups(pyproject: Option<&str>, py: &mut PythonFacts, deps: &mut Vec<String>) {
    let own = py.project_name.as_deref().and_then(requirement_name);
    if let Some(t) = pyproject.and_then(|t| t.parse::<toml::Table>().ok()) {
        if let Some(g) = super::test_groups::read(&t, own.as_deref()) {
            if g.requirements.iter().any(|r| r.contains("git+")) {
                py.needs_git = true;
            }
            deps.extend(g.requirements.iter().cloned());
            py.test_groups = Some(g);
        }
    }
}

/// The extras of `setup.cfg`'s `[options.extras_require]`.
fn setup_cfg_extras(text: &str, py: &mut PythonFacts) {
    if let Some(extras) = text.split("[options.extras_require]").nth(1) {
        let mut current: Option<String> = None;
        for line in extras.lines().skip(1) {
            if line.starts_with('[') {
                break;
            }
            if let Some((k, v)) = line.split_once('=') {
                if !line.starts_with(char::is_whitespace) && !k.trim().is_empty() {
                    py.extras.push(k.trim().to_string());
                    current = Some(k.trim().to_string());
                    if let Some(name) = requirement_name(v) {
                        py.extra_requirements
                            .entry(k.trim().to_string())
                            .or_default()
                            .push(name);
                    }
                    continue;
                }
            }
            // A continuation line: one more requirement of the extra above.
            if line.starts_with(char::is_whitespace) {
                if let (Some(k), Some(name)) = (&current, requirement_name(line)) {
                    py.extra_requirements
                        .entry(k.clone())
                        .or_default()
                        .push(name);
                }
            }
        }
    }
}

/// The Python versions the trove classifiers of `texts` name, as version hints.
fn classifier_hints(texts: [Option<&str>; 3], py: &mut PythonFacts) {
    // "Programming Language :: Python :: 3.12": the versions the project says it supports.
    if let Ok(rx) = regex::Regex::new(r"Programming Language :: Python :: (3\.\d+)\b") {
        let mut seen = BTreeSet::new();
        for text in texts.into_iter().flatten() {
            for c in rx.captures_iter(text) {
                if seen.insert(c[1].to_string()) {
                    py.version_hints.push(format!("classifier {}", &c[1]));
                }
            }
        }
    }
}

/// The Pipfile's python version hint and its package names.
fn read_pipfile(text: &str, py: &mut PythonFacts, deps: &mut Vec<String>) {
    if let Some(c) = regex::Regex::new(r#"python_version\s*=\s*"([^"]+)""#)
        .ok()
        .and_then(|r| r.captures(text))
    {
        py.version_hints
            .push(format!("Pipfile python_version {}", &c[1]));
    }
    for line in text.lines() {
        if let Some((k, _)) = line.split_once('=') {
            let k = k.trim().trim_matches('"');
            if !k.is_empty()
                && !line.starts_with('[')
                && !matches!(k, "url" | "verify_ssl" | "name" | "python_version")
            {
                deps.push(k.to_string());
            }
        }
    }
}

/// Read the requirements files into `deps`, noting git needs and resolved files.
fn read_requirement_files(
    f: &Files,
    req_files: &[String],
    py: &mut PythonFacts,
    deps: &mut Vec<String>,
    warnings: &mut Vec<String>,
) {
    let txt_files: Vec<String> = req_files
        .iter()
        .filter(|r| r.ends_with(".txt"))
        .cloned()
        .collect();
    // The project is installed from the checkout: a requirements file's pin
    // of the project itself (pip-compile writes one) cannot be met with it.
    let own = py
        .installable
        .then(|| py.project_name.as_deref().and_then(requirement_name))
        .flatten();
    for rf in requirements::read_all(f, req_files, own.as_deref(), warnings) {
        if rf.lines.iter().any(|l| l.contains("git+")) {
            py.needs_git = true;
        }
        deps.extend(rf.lines);
        if !rf.resolved.is_empty() && txt_files.contains(&rf.path) {
            py.resolved_requirements.insert(rf.path, rf.resolved);
        }
    }
    py.requirement_files = txt_files;
}

/// The dependency names, the sorted extras and the test extras.
fn settle_dependencies(py: &mut PythonFacts, deps: &[String]) {
    let mut names: BTreeSet<String> = deps.iter().filter_map(|d| requirement_name(d)).collect();
    names.remove("python");
    py.dependencies = names.into_iter().collect();
    py.extras.sort();
    py.extras.dedup();
    py.test_extras = py
        .extras
        .iter()
        .filter(|e| matches!(e.as_str(), "test" | "tests" | "testing" | "dev" | "develop"))
        .cloned()
        .collect();
    // A test group that asks for the project's own extras (`pdm[pytest]`).
    if let Some(g) = &py.test_groups {
        for e in &g.own_extras {
            let key = super::normalise_name(e);
            if let Some(x) = py.extras.iter().find(|x| super::normalise_name(x) == key) {
                if !py.test_extras.contains(x) {
                    py.test_extras.push(x.clone());
                }
            }
        }
    }
}

/// Whether the repository holds test files pytest would collect.
fn has_test_files(f: &Files) -> bool {
    // Deep enough for src/<pkg>/tests and namespace packages
    // (src/zope/interface/tests, lib/Crypto/SelfTest/Cipher): unittest
    // suites with no pytest config are collected by pytest too.
    !f.find(5, &|p| {
        let n = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        (n.starts_with("test_") || n.ends_with("_test.py")) && n.ends_with(".py")
    })
    .is_empty()
}

/// The pytest plugins and conftest imports the tests need.
fn test_needs(f: &Files, py: &mut PythonFacts) {
    let import_name = py.import_name.clone();
    let is_local = |m: &str| super::is_local_module(f.root(), import_name.as_deref(), m);
    py.test_plugins = pytest_plugins::needed(f, &is_local);
    let mut declared: BTreeSet<String> = py.dependencies.iter().cloned().collect();
    declared.extend(
        py.test_plugins
            .iter()
            .filter_map(|n| super::requirement_name(&n.distribution)),
    );
    if let Some(n) = py.project_name.as_deref().and_then(super::requirement_name) {
        declared.insert(n);
    }
    py.conftest_imports = conftest_imports::needed(f, &declared, &is_local);
}

/// What derives the project's version from git, when something does.
fn vcs_versioning<'a>(f: &Files, texts: impl Iterator<Item = &'a String>) -> Option<String> {
    let all: String = texts.map(String::as_str).collect::<Vec<_>>().join("\n");
    let has = |needle: &str| all.contains(needle);
    let found =
        if has("pbr=True") || has("pbr = True") || has("[pbr]") || has("\"pbr\"") || has("'pbr'") {
            "pbr"
        } else if has("setuptools_scm") || has("setuptools-scm") || has("use_scm_version") {
            "setuptools-scm"
        } else if has("hatch-vcs")
            || has("hatch_vcs")
            || (has("[tool.hatch.version]") && has("source = \"vcs\""))
        {
            "hatch-vcs"
        } else if has("versioneer") || f.exists("versioneer.py") {
            "versioneer"
        } else if has("poetry-dynamic-versioning") || has("dunamai") {
            "dunamai"
        } else if has("git describe") || (has("git") && (has("'describe'") || has("\"describe\"")))
        {
            "git describe in setup.py"
        } else if has("setuptools-git-versioning") || has("setuptools_git_versioning") {
            "setuptools-git-versioning"
        } else {
            return None;
        };
    Some(found.to_string())
}

/// The distribution name from `setup.cfg`'s `[metadata]` or a literal
/// `name=` in `setup.py`.
fn setup_name(setup_cfg: Option<&str>, setup_py: Option<&str>) -> Option<String> {
    if let Some(meta) = setup_cfg.and_then(|t| t.split("[metadata]").nth(1)) {
        for line in meta.lines().skip(1) {
            if line.starts_with('[') {
                break;
            }
            if let Some((k, v)) = line.split_once('=') {
                let v = v.trim();
                if k.trim() == "name" && !v.is_empty() && !v.contains(['%', '{', ':']) {
                    return Some(v.to_string());
                }
            }
        }
    }
    let rx = regex::Regex::new(r#"\bname\s*=\s*['"]([A-Za-z0-9][A-Za-z0-9._-]*)['"]"#).ok()?;
    rx.captures(setup_py?).map(|c| c[1].to_string())
}
