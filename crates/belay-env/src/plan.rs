//! The rules planner: ordered setup blocks, each a shell script with a
//! validation command, from the repository context and the runtime notes.
//!
//! Block ids follow the seed (FORMATS.md §1): `00-preflight`,
//! `10-system-packages`, `20-<lang>-runtime`, `30-<lang>-deps`,
//! `40-native-build-config`, `50-test-tooling`; a second language takes `21-`
//! and `31-`; three or more share `20-runtime-toolchain` and
//! `30-project-dependencies`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::analyze::{Language, NativeFacts, PythonFacts, PythonInstaller, RepoContext};
use crate::preflight::RuntimeNotes;
use crate::EnvError;

pub use crate::{REPO_DIR, SCRIPTS_DIR};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BlockStatus {
    Planned,
    Running,
    Succeeded,
    Failed,
    Repaired,
    Skipped,
}

/// Time spent on a block, for the harness-overhead figure.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BlockTiming {
    /// Wall time from block start to its checkpoint being committed.
    pub total_s: f64,
    /// The block script's own run time.
    pub script_s: f64,
    /// The validation command's own run time.
    pub validation_s: f64,
    /// Committing the checkpoint.
    pub checkpoint_s: f64,
}

/// One setup block, as written to `blocks/<id>.json` and listed in the manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Block {
    pub id: String,
    pub title: String,
    pub goal: String,
    pub script: String,
    pub order: u32,
    pub validation_command: String,
    pub status: BlockStatus,
    pub last_error: Option<String>,
    pub baseline_checkpoint: Option<String>,
    pub success_checkpoint: Option<String>,
    pub repair_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<BlockTiming>,
    /// The block's checkpoint came from the cache; the block did not run.
    #[serde(default)]
    pub cached: bool,
    /// The block reads nothing of the repository (a toolchain): when it leads
    /// the plan, it runs before the repository is copied in, so that its
    /// checkpoint is shared by every project on the same base
    /// (`build/toolchain.rs`). Only the rules planner sets it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_workspace: bool,
}

impl Block {
    /// A planned block from its parts (the script is rendered with the standard header).
    pub fn planned(id: &str, title: &str, goal: &str, body: &[String], validation: &str) -> Self {
        Self::new(id, title, goal, body, validation)
    }

    fn new(id: &str, title: &str, goal: &str, body: &[String], validation: &str) -> Self {
        Block {
            id: id.to_string(),
            title: title.to_string(),
            goal: goal.to_string(),
            script: render_script(id, title, goal, body),
            order: 0,
            validation_command: validation.to_string(),
            status: BlockStatus::Planned,
            last_error: None,
            baseline_checkpoint: None,
            success_checkpoint: None,
            repair_attempts: 0,
            timing: None,
            cached: false,
            before_workspace: false,
        }
    }

    fn before_workspace(mut self) -> Self {
        self.before_workspace = true;
        self
    }

    /// Path of this block's script inside the container.
    pub fn container_script_path(&self) -> String {
        format!("{SCRIPTS_DIR}/{}.sh", self.id)
    }
}

/// The text of a block script.
pub fn render_script(id: &str, title: &str, goal: &str, body: &[String]) -> String {
    let mut s = format!(
        "#!/usr/bin/env bash\n# belay block {id}: {title}\n# Goal: {goal}\nset -euo pipefail\nexport DEBIAN_FRONTEND=noninteractive\ncd {REPO_DIR}\n\n"
    );
    for line in body {
        s.push_str(line);
        s.push('\n');
    }
    s
}

/// What one language contributes to the plan.
#[derive(Default)]
struct Part {
    lang: &'static str,
    runtime: Vec<String>,
    /// The runtime lines read the repository (a build tool's wrapper script):
    /// the block cannot run before the copy.
    runtime_reads_repo: bool,
    runtime_validation: Vec<String>,
    deps: Vec<String>,
    deps_validation: Vec<String>,
    test: Vec<String>,
    test_validation: Vec<String>,
}

/// Native packages that Python distributions commonly build against when no
/// wheel fits. A starting table; the repair rules carry the full error-text map.
const PY_NATIVE_HINTS: &[(&str, &[&str])] = &[
    ("psycopg2", &["libpq-dev", "python3-dev", "build-essential"]),
    (
        "mysqlclient",
        &[
            "default-libmysqlclient-dev",
            "pkg-config",
            "python3-dev",
            "build-essential",
        ],
    ),
    (
        "python-ldap",
        &[
            "libldap2-dev",
            "libsasl2-dev",
            "python3-dev",
            "build-essential",
        ],
    ),
    (
        "pycairo",
        &[
            "libcairo2-dev",
            "pkg-config",
            "python3-dev",
            "build-essential",
        ],
    ),
    (
        "pygobject",
        &[
            "libgirepository1.0-dev",
            "libcairo2-dev",
            "pkg-config",
            "python3-dev",
            "build-essential",
        ],
    ),
    (
        "dbus-python",
        &[
            "libdbus-1-dev",
            "libglib2.0-dev",
            "pkg-config",
            "python3-dev",
            "build-essential",
        ],
    ),
    (
        "pyaudio",
        &["portaudio19-dev", "python3-dev", "build-essential"],
    ),
    ("gssapi", &["libkrb5-dev", "python3-dev", "build-essential"]),
];

/// `args` installed, and should that fail, `message` on stderr and then
/// `fallback` (which may be empty: the failure is then only reported).
fn install_else(py: &PythonFacts, args: &str, message: &str, fallback: Vec<String>) -> Vec<String> {
    let indent = |l: String| format!("  {l}");
    let mut out = vec!["if ! {".to_string()];
    out.extend(py_install(py, args).into_iter().map(indent));
    out.push("}; then".to_string());
    out.push(format!("  echo {} >&2", q(message)));
    out.extend(fallback.into_iter().map(indent));
    out.push("fi".to_string());
    out
}

/// What the log says when the tests' dependency groups do not install.
const GROUPS_LEFT_OUT: &str =
    "belay: the tests' dependency groups do not resolve with the project: installing without them";

fn q(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./=:@+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn apt_install(pkgs: &BTreeSet<String>) -> String {
    let list: Vec<&str> = pkgs.iter().map(String::as_str).collect();
    format!(
        "apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 {}",
        list.join(" ")
    )
}

/// Plan blocks for `ctx` on an image described by `notes`.
pub fn plan_rules(ctx: &RepoContext, notes: &RuntimeNotes) -> Result<Vec<Block>, EnvError> {
    check_package_manager(notes)?;
    let mut system: BTreeSet<String> = BTreeSet::new();
    let mut parts: Vec<Part> = Vec::new();
    for lang in &ctx.languages {
        let part = match lang {
            Language::Python => python_part(ctx, notes, &mut system),
            Language::Node => node_part(ctx, notes),
            Language::Rust => rust_part(ctx, notes),
            Language::Go => go_part(ctx, notes),
            Language::Java => java_part(ctx, notes),
        };
        parts.push(part);
    }
    let mut blocks = vec![preflight_block()];

    // Native build systems.
    let native_primary = ctx.native.as_ref().filter(|n| n.primary);
    if let Some(n) = &ctx.native {
        native_system_packages(n, &mut system);
    }
    developer_tools(notes, &mut system);
    if let Some(n) = &ctx.node {
        script_tools(n, notes, &mut system);
    }
    blocks.push(system_block(&system));

    language_blocks(&parts, &mut blocks);

    if let Some(n) = native_primary {
        blocks.push(native_config_block(n));
    }

    if let Some(b) = test_block(&parts) {
        blocks.push(b);
    }
    for (i, b) in blocks.iter_mut().enumerate() {
        b.order = i as u32;
    }
    Ok(blocks)
}

/// An error unless the base image installs with apt.
fn check_package_manager(notes: &RuntimeNotes) -> Result<(), EnvError> {
    if let Some(pm) = &notes.package_manager {
        if pm != "apt" {
            return Err(EnvError::Plan(format!(
                "the base image ({}) uses {pm}; the rules planner writes apt-based setup. \
                 Use a Debian or Ubuntu base image (the default `belay image bootstrap` image works)",
                notes.os_pretty
            )));
        }
    } else {
        return Err(EnvError::Plan(format!(
            "the base image ({}) has no package manager belay knows (apt-get). \
             Use a Debian or Ubuntu base image",
            notes.os_pretty
        )));
    }
    Ok(())
}

/// The `00-preflight` block: a writable workspace and room to build.
fn preflight_block() -> Block {
    Block::new(
        "00-preflight",
        "Preflight",
        "Check that the workspace is writable and that there is room to build",
        &[
            "test -w . || { echo '/workspace/repo is not writable'; exit 1; }".into(),
            "mkdir -p /belay".into(),
            "free_kb=$(df -Pk . | awk 'NR==2 {print $4}')".into(),
            "echo \"free disk under /workspace: $((free_kb / 1024)) MiB\"".into(),
            "if [ \"${free_kb:-0}\" -lt 1048576 ]; then echo 'less than 1 GiB free in the container: free disk on the Docker host (docker system df)'; exit 1; fi".into(),
        ],
        "test -w /workspace/repo",
    )
    .before_workspace()
}

/// Add the system packages the native build systems `n` need to `system`.
fn native_system_packages(n: &NativeFacts, system: &mut BTreeSet<String>) {
    system.insert("build-essential".into());
    for s in &n.build_systems {
        match s.as_str() {
            "cmake" => {
                system.insert("cmake".into());
            }
            "meson" => {
                system.extend(["meson".to_string(), "ninja-build".to_string()]);
            }
            "autotools" => {
                system.extend([
                    "autoconf".to_string(),
                    "automake".to_string(),
                    "libtool".to_string(),
                ]);
            }
            _ => {}
        }
    }
    system.insert("pkg-config".into());
}

/// What a developer types in the final image, whether or not the build
/// needs it (a check that starts the project's server and fetches a page,
/// a `make test`, `ps`, a clone over ssh): the ones the base lacks, and the
/// CA bundle. A developer's machine and a CI runner have an ssh client, and
/// tests use it (ssh2's run OpenSSH against their own server, on loopback).
const DEVELOPER_TOOLS: &[(&str, &str)] = &[
    ("git", "git"),
    ("make", "make"),
    ("curl", "curl"),
    ("ps", "procps"),
    ("ssh", "openssh-client"),
];

fn developer_tools(notes: &RuntimeNotes, system: &mut BTreeSet<String>) {
    for (tool, package) in DEVELOPER_TOOLS {
        if !notes.has(tool) {
            system.insert((*package).to_string());
        }
    }
    system.insert("ca-certificates".into());
}

/// The Debian packages of the system programs the node project's test
/// scripts run (`NodeFacts::script_tools`) that the base lacks.
fn script_tools(
    n: &crate::analyze::NodeFacts,
    notes: &RuntimeNotes,
    system: &mut BTreeSet<String>,
) {
    for tool in &n.script_tools {
        if !notes.has(tool) {
            if let Some(pkgs) = crate::repair::program_packages(tool) {
                system.extend(pkgs.split_whitespace().map(String::from));
            }
        }
    }
}

/// The `10-system-packages` block installing `system`.
fn system_block(system: &BTreeSet<String>) -> Block {
    let mut sys_body = vec!["apt-get update -q".to_string()];
    let validation = if system.is_empty() {
        sys_body.push("# No system packages beyond the language runtimes are needed.".into());
        "apt-cache policy bash | grep -q Candidate".to_string()
    } else {
        sys_body.push(apt_install(system));
        let list: Vec<&str> = system.iter().map(String::as_str).collect();
        format!("dpkg -s {} >/dev/null", list.join(" "))
    };
    Block::new(
        "10-system-packages",
        "System packages",
        "Refresh the package index and install the system packages the project needs",
        &sys_body,
        &validation,
    )
    .before_workspace()
}

/// Push the runtime and dependency blocks of the languages' `parts`.
fn language_blocks(parts: &[Part], blocks: &mut Vec<Block>) {
    let and = |v: &[String]| v.join(" && ");
    match parts.len() {
        0 => {}
        1 | 2 => {
            for (i, p) in parts.iter().enumerate() {
                let mut b = Block::new(
                    &format!("{}-{}-runtime", 20 + i, p.lang),
                    &format!("{} runtime", title_case(p.lang)),
                    &format!("Install the {} toolchain", p.lang),
                    &p.runtime,
                    &and(&p.runtime_validation),
                );
                b.before_workspace = !p.runtime_reads_repo;
                blocks.push(b);
            }
            for (i, p) in parts.iter().enumerate() {
                if p.deps.is_empty() {
                    continue;
                }
                blocks.push(Block::new(
                    &format!("{}-{}-deps", 30 + i, p.lang),
                    &format!("{} dependencies", title_case(p.lang)),
                    &format!("Install the project's {} dependencies", p.lang),
                    &p.deps,
                    &and(&p.deps_validation),
                ));
            }
        }
        _ => {
            let merge = |f: &dyn Fn(&Part) -> &Vec<String>| -> Vec<String> {
                parts
                    .iter()
                    .filter(|p| !f(p).is_empty())
                    .flat_map(|p| {
                        std::iter::once(format!("# --- {} ---", p.lang)).chain(f(p).iter().cloned())
                    })
                    .collect()
            };
            let mergev = |f: &dyn Fn(&Part) -> &Vec<String>| -> String {
                parts
                    .iter()
                    .flat_map(|p| f(p).iter().cloned())
                    .collect::<Vec<_>>()
                    .join(" && ")
            };
            let mut b = Block::new(
                "20-runtime-toolchain",
                "Runtime toolchains",
                "Install every language toolchain the project uses",
                &merge(&|p| &p.runtime),
                &mergev(&|p| &p.runtime_validation),
            );
            b.before_workspace = !parts.iter().any(|p| p.runtime_reads_repo);
            blocks.push(b);
            blocks.push(Block::new(
                "30-project-dependencies",
                "Project dependencies",
                "Install the project's dependencies for every language",
                &merge(&|p| &p.deps),
                &mergev(&|p| &p.deps_validation),
            ));
        }
    }
}

/// The `40-native-build-config` block for the primary native build `n`.
fn native_config_block(n: &NativeFacts) -> Block {
    let (body, val): (Vec<String>, &str) = if n.build_systems.iter().any(|s| s == "cmake") {
        (
            vec!["cmake -S . -B build".into()],
            "cmake --build build -j\"$(nproc)\"",
        )
    } else if n.build_systems.iter().any(|s| s == "meson") {
        (vec!["meson setup build".into()], "meson compile -C build")
    } else if n.build_systems.iter().any(|s| s == "autotools") {
        (vec!["./configure".into()], "make -n >/dev/null")
    } else {
        (vec!["make -n >/dev/null".into()], "make -n >/dev/null")
    };
    Block::new(
        "40-native-build-config",
        "Native build configuration",
        "Configure the native build",
        &body,
        val,
    )
}

/// The `50-test-tooling` block, when a language has test tooling to set up.
fn test_block(parts: &[Part]) -> Option<Block> {
    let tests: Vec<&Part> = parts.iter().filter(|p| !p.test.is_empty()).collect();
    if tests.is_empty() {
        return None;
    }
    let body: Vec<String> = tests.iter().flat_map(|p| p.test.iter().cloned()).collect();
    let val: Vec<String> = tests
        .iter()
        .flat_map(|p| p.test_validation.iter().cloned())
        .collect();
    Some(Block::new(
        "50-test-tooling",
        "Test tooling",
        "Make the project's test runner available and able to collect the tests",
        &body,
        &val.join(" && "),
    ))
}

fn title_case(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

const VENV_PY: &str = ".venv/bin/python";

fn python_part(ctx: &RepoContext, notes: &RuntimeNotes, system: &mut BTreeSet<String>) -> Part {
    let Some(py) = &ctx.python else {
        return Part::default();
    };
    let mut p = Part {
        lang: "python",
        ..Default::default()
    };
    python_runtime(ctx, notes, py, system, &mut p);
    python_deps(py, &mut p.deps);
    p.deps_validation.push(match &py.import_name {
        Some(m) => format!("{VENV_PY} -c 'import {m}'"),
        None => format!("{VENV_PY} -m pip check"),
    });
    if ctx.test_frameworks.iter().any(|f| f == "pytest") {
        python_test(py, &mut p.test);
        p.test_validation.push(format!(
            "{{ {VENV_PY} -m pytest --collect-only -q; rc=$?; [ \"$rc\" -eq 0 ] || [ \"$rc\" -eq 5 ]; }}"
        ));
    }
    p
}

/// The Python runtime lines of `p` (venv, uv), and the system packages `py` needs.
fn python_runtime(
    ctx: &RepoContext,
    notes: &RuntimeNotes,
    py: &PythonFacts,
    system: &mut BTreeSet<String>,
    p: &mut Part,
) {
    let mut apt: BTreeSet<String> = BTreeSet::new();
    if !notes.has("python3") || !notes.python_venv {
        apt.extend(["python3".to_string(), "python3-venv".to_string()]);
    }
    for dep in &py.dependencies {
        if let Some((_, pkgs)) = PY_NATIVE_HINTS.iter().find(|(d, _)| d == dep) {
            system.extend(pkgs.iter().map(|s| s.to_string()));
        }
    }
    if ctx.native.is_some() {
        system.insert("python3-dev".into());
    }
    if py.needs_git {
        system.insert("git".into());
    }
    if !apt.is_empty() {
        p.runtime.push(apt_install(&apt));
    }
    if py.needs_git {
        // The same line for every project, so that runtimes are shared
        // (`build/toolchain.rs`); the deps block names the tool.
        p.runtime.push(format!(
            "git config --global --add safe.directory {REPO_DIR}"
        ));
    }
    if py.needs_rust && !notes.has("cargo") && ctx.rust.is_none() {
        p.runtime.push(
            "# The build backend compiles Rust (setuptools-rust or maturin): cargo is needed."
                .to_string(),
        );
        p.runtime.push(rust_toolchain());
    }
    p.runtime.push(format!(
        "if [ ! -x {VENV_PY} ]; then python3 -m venv .venv; fi"
    ));
    p.runtime.push(format!("{VENV_PY} --version"));
    p.runtime.push(
        "# uv resolves and installs (pip when it cannot be had); it lives in its own virtualenv, never in the project's."
            .to_string(),
    );
    // uv's wheel is kept in pip's cache directory and installed from there:
    // pip's HTTP cache keeps nothing behind a proxy that strips cache headers.
    p.runtime.extend([
        format!("if [ ! -x {UV} ]; then"),
        "  wheels=\"${PIP_CACHE_DIR:-$HOME/.cache/pip}/belay-wheels\"".to_string(),
        "  python3 -m venv /opt/belay/uv \\".to_string(),
        "    && { ls \"$wheels\"/uv-*.whl >/dev/null 2>&1 || /opt/belay/uv/bin/pip download --disable-pip-version-check --progress-bar off --no-deps --only-binary :all: -d \"$wheels\" uv; } \\".to_string(),
        "    && /opt/belay/uv/bin/pip install --disable-pip-version-check --no-index --find-links \"$wheels\" uv \\".to_string(),
        "    || echo 'belay: uv could not be installed; pip installs instead' >&2".to_string(),
        "fi".to_string(),
    ]);
    p.runtime_validation.push(format!("test -x {VENV_PY}"));
}

/// The lines that install the project's Python dependencies with its installer.
fn python_deps(py: &PythonFacts, deps: &mut Vec<String>) {
    let tool = |name: &str, pkg: &str| -> Vec<String> {
        vec![
            format!("# {name} runs from its own virtualenv so that it never lands in the project's."),
            format!("if [ ! -x /opt/belay/{name}/bin/{name} ]; then python3 -m venv /opt/belay/{name} && /opt/belay/{name}/bin/pip install --disable-pip-version-check -q {pkg}; fi"),
        ]
    };
    if let (true, Some(v)) = (py.needs_git, &py.vcs_versioning) {
        deps.push(format!(
            "# The version comes from git metadata ({v}): git must run on the checkout."
        ));
    }
    match py.installer {
        PythonInstaller::Poetry => {
            deps.extend(tool("poetry", "poetry"));
            deps.push(format!(
                "VIRTUAL_ENV={REPO_DIR}/.venv POETRY_VIRTUALENVS_CREATE=false /opt/belay/poetry/bin/poetry install --no-interaction"
            ));
        }
        PythonInstaller::Uv => {
            deps.extend(tool("uv", "uv"));
            deps.push(format!(
                "UV_PROJECT_ENVIRONMENT={REPO_DIR}/.venv UV_PYTHON_DOWNLOADS=never /opt/belay/uv/bin/uv sync --frozen --all-extras --python {REPO_DIR}/{VENV_PY}"
            ));
        }
        PythonInstaller::Pipenv => {
            deps.extend(tool("pipenv", "pipenv"));
            deps.push(format!(
                "PIPENV_VENV_IN_PROJECT=1 PIPENV_IGNORE_VIRTUALENVS=1 /opt/belay/pipenv/bin/pipenv install --dev --python {REPO_DIR}/{VENV_PY}"
            ));
        }
        PythonInstaller::Pip => pip_deps(py, deps),
    }
}

/// What pip's plan passes to the installer: one argument string per
/// requirements file, the test groups and the project.
struct PipArgs {
    /// The installer arguments, in order, none empty.
    parts: Vec<String>,
    /// The test groups' arguments, when they are among `parts`.
    group_part: Option<String>,
    /// How many requirements files there are.
    files: usize,
}

/// The dependency lines of pip's plan: one resolver call, with fallbacks.
fn pip_deps(py: &PythonFacts, deps: &mut Vec<String>) {
    let PipArgs {
        parts,
        group_part,
        files,
    } = pip_args(py, deps);
    let together = parts.join(" ");
    if files > 1 {
        // Files written for different uses (tests, docs, CI) can pin
        // one package at different versions, which no single
        // resolution satisfies. Then each goes in on its own, in
        // order, a later file's pin winning, as running them one by
        // one would.
        deps.push(
            "# The requirement files resolve together; should they pin a package differently, one at a time (a later pin wins)."
                .to_string(),
        );
        let mut one_by_one = Vec::new();
        for a in &parts {
            if Some(a) == group_part.as_ref() {
                one_by_one.extend(install_else(py, a, GROUPS_LEFT_OUT, Vec::new()));
            } else {
                one_by_one.extend(py_install(py, a));
            }
        }
        deps.extend(install_else(
            py,
            &together,
            "belay: the requirement files do not resolve together: installing them one at a time",
            one_by_one,
        ));
    } else if let Some(g) = &group_part {
        let without: Vec<&str> = parts
            .iter()
            .filter(|a| *a != g)
            .map(String::as_str)
            .collect();
        let fallback = if without.is_empty() {
            Vec::new()
        } else {
            py_install(py, &without.join(" "))
        };
        deps.extend(install_else(py, &together, GROUPS_LEFT_OUT, fallback));
    } else if !together.is_empty() {
        deps.extend(py_install(py, &together));
    }
}

/// The installer arguments of pip's plan, with their comment lines pushed to `deps`.
fn pip_args(py: &PythonFacts, deps: &mut Vec<String>) -> PipArgs {
    if let Some(a) = &py.resolve_as_of {
        deps.push(format!(
            "# Dependencies resolve as of {}: {}. `--resolve-as-of latest` takes the newest.",
            a.at, a.from
        ));
    }
    // One resolver call for the requirements and the project: two
    // calls let the second backtrack through every version of a
    // loosely pinned dependency the first already chose.
    let mut files = py.requirement_files.clone();
    files.sort_by_key(|f| (f != "requirements.txt", f.clone()));
    // What each file and the project pass to the installer.
    let mut parts: Vec<String> = Vec::new();
    for f in &files {
        match py.resolved_requirements.get(f) {
            Some(resolved) => {
                deps.push(format!(
                    "# {f} names paths relative to itself, or pins the project itself: its lines are passed, paths resolved and that pin left out."
                ));
                parts.push(resolved.iter().map(|a| q(a)).collect::<Vec<_>>().join(" "));
            }
            None => parts.push(format!("-r {}", q(f))),
        }
    }
    // The tests' dependency groups: in the same resolution, but a
    // group that does not resolve (a dev group's tools pinned against
    // the project) does not stop the project from installing.
    let mut group_part: Option<String> = None;
    if let Some(g) = &py.test_groups {
        if !g.requirements.is_empty() {
            deps.push(format!(
                "# The tests' requirements of {} resolve with the project; should they not, the project goes in without them.",
                g.source
            ));
            let part = g
                .requirements
                .iter()
                .map(|r| q(r))
                .collect::<Vec<_>>()
                .join(" ");
            parts.push(part.clone());
            group_part = Some(part);
        }
    }
    if py.installable {
        let target = if py.test_extras.is_empty() {
            ".".to_string()
        } else {
            format!(".[{}]", py.test_extras.join(","))
        };
        parts.push(format!("-e {}", q(&target)));
    }
    parts.retain(|a| !a.is_empty());
    PipArgs {
        parts,
        group_part,
        files: files.len(),
    }
}

/// The test tooling lines for pytest: pytest, its plugins and the conftests' imports.
fn python_test(py: &PythonFacts, test: &mut Vec<String>) {
    if py.test_plugins.is_empty() {
        test.push(format!(
            "if ! {VENV_PY} -m pytest --version >/dev/null 2>&1; then"
        ));
        test.extend(
            py_install(py, "pytest")
                .into_iter()
                .map(|l| format!("  {l}")),
        );
        test.push("fi".to_string());
    } else {
        // The plugins the test configuration names: without them
        // collection fails with "unrecognized arguments".
        for need in &py.test_plugins {
            test.push(format!("# {} needs {}", need.because, need.distribution));
        }
        let mut pkgs = vec!["pytest".to_string()];
        pkgs.extend(py.test_plugins.iter().map(|n| q(&n.distribution)));
        test.extend(py_install(py, &pkgs.join(" ")));
    }
    if !py.conftest_imports.is_empty() {
        conftest_install(py, test);
    }
}

/// The lines that install what the conftests import and is missing.
fn conftest_install(py: &PythonFacts, test: &mut Vec<String>) {
    // pytest imports every conftest before collecting: what they
    // import unconditionally must be there. Only a module that does
    // not import already is installed; should one not install, the
    // rest go in one by one, and collection names what is missing.
    for need in &py.conftest_imports {
        test.push(format!("# {} needs {}", need.because, need.distribution));
    }
    let pairs: Vec<String> = py
        .conftest_imports
        .iter()
        .map(|n| format!("{}:{}", n.module, n.distribution))
        .collect();
    test.push("missing=''".to_string());
    test.push(format!(
        "for m in {}; do {VENV_PY} -c \"import ${{m%%:*}}\" 2>/dev/null || missing=\"$missing ${{m#*:}}\"; done",
        pairs.join(" ")
    ));
    test.push("if [ -n \"$missing\" ]; then".to_string());
    test.push("  if ! {".to_string());
    test.extend(
        py_install(py, "$missing")
            .into_iter()
            .map(|l| format!("    {l}")),
    );
    test.push("  }; then".to_string());
    test.push("    for d in $missing; do".to_string());
    test.extend(
        py_install(py, "\"$d\"")
            .into_iter()
            .map(|l| format!("      {l}")),
    );
    test.push("    done || true".to_string());
    test.push("  fi".to_string());
    test.push("fi".to_string());
}

/// Where belay's own uv lives in build containers (never in the project's venv).
pub const UV: &str = "/opt/belay/uv/bin/uv";

/// Lines that install `args` into the project's venv with one resolver call:
/// uv when the runtime block could install it, pip otherwise (and the log
/// says which).
/// With a cut-off date, uv resolves as of it (`--exclude-newer`); pip has no
/// such option, and its log says the date was not applied.
/// Should nothing resolve as of the date (an index without upload times, a
/// requirement newer than the commit), the newest versions are tried, and
/// the log says so.
fn py_install(py: &PythonFacts, args: &str) -> Vec<String> {
    let uv =
        format!("UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=copy {UV} pip install --python {VENV_PY}");
    let mut out = vec![format!("if [ -x {UV} ]; then")];
    let pip_note = match &py.resolve_as_of {
        Some(a) => {
            out.push(format!("  {uv} --exclude-newer {} {args} || {{", a.at));
            out.push(format!(
                "    echo 'belay: nothing resolves as of {}: resolving with the newest versions' >&2",
                a.at
            ));
            out.push(format!("    {uv} {args}"));
            out.push("  }".to_string());
            format!(
                "; pip cannot resolve as of {}, so the newest versions are installed",
                a.at
            )
        }
        None => {
            out.push(format!("  {uv} {args}"));
            String::new()
        }
    };
    out.extend([
        "else".to_string(),
        format!("  echo 'belay: uv is not available; pip installs instead{pip_note}' >&2"),
        format!("  {VENV_PY} -m pip install --disable-pip-version-check {args}"),
        "fi".to_string(),
    ]);
    out
}

/// Coloured output without a terminal (chalk, supports-color, kleur and
/// node's own `util.inspect` read it), for tests recorded on a colour
/// terminal (`NodeFacts::colour_snapshot`).
pub const COLOUR_TESTS: &str = "export FORCE_COLOR=1";

/// The variables that turn off the binary downloads of node packages'
/// install scripts.
const BINARY_DOWNLOADS_OFF: &str = "export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 PUPPETEER_SKIP_DOWNLOAD=1 PUPPETEER_SKIP_CHROMIUM_DOWNLOAD=1 CHROMEDRIVER_SKIP_DOWNLOAD=true GECKODRIVER_SKIP_DOWNLOAD=true ELECTRON_SKIP_BINARY_DOWNLOAD=1 CYPRESS_INSTALL_BINARY=0";

/// Native addons build against the headers of the node that runs them, where
/// that node's prefix has them (Debian's node with libnode-dev: `/usr`; the
/// npm registry's `node` package: its `node-linux-<arch>` package beside
/// the binary): node-gyp would otherwise download them, which a closed
/// network refuses, and Debian's node-gyp would take Debian's node 18
/// headers for another node (the runtime block gives such a node npm's
/// own npm, whose node-gyp reads `npm_config_nodedir`).
const NODE_HEADERS: &str = r#"nd=$(dirname "$(dirname "$(readlink -f "$(command -v node)")")"); for d in "$nd" "$nd"/node_modules/node-linux-*; do if [ -f "$d/include/node/common.gypi" ]; then export npm_config_nodedir="$d"; break; fi; done"#;

/// Made by the `lockfile-stale` repair: the lockfile no longer matches
/// `package.json`, so the install resolves what it lacks (without writing
/// the lockfile where the package manager can) instead of failing as a
/// frozen install does.
pub const LOCKFILE_STALE: &str = "/etc/belay/lockfile-stale";

/// The install's words for a lockfile that holds (`frozen`), or those for
/// one a repair found stale ([`LOCKFILE_STALE`]).
fn unless_stale(frozen: &str, stale: &str) -> String {
    format!("$([ -e {LOCKFILE_STALE} ] && echo '{stale}' || echo '{frozen}')")
}

/// The packages whose install scripts a repair turned off, one name a line
/// (rules `npm-`, `pnpm-` and `yarn-install-script-download`).
const NPM_SKIP_SCRIPTS: &str = "/etc/belay/npm-skip-scripts";

/// The names of the installed packages (not the project) with an install
/// script, but those in [`NPM_SKIP_SCRIPTS`], from `npm query`'s JSON (npm
/// reads the tree npm, yarn classic and pnpm lay out alike).
const NPM_SCRIPTED_BUT_SKIPPED: &str = r#""use strict";const fs=require("fs");const skip=new Set(fs.readFileSync("/etc/belay/npm-skip-scripts","utf8").split(/\s+/).filter(Boolean));const q=JSON.parse(fs.readFileSync("/dev/stdin","utf8"));console.log(Array.from(new Set(q.filter(p=>p.location&&!skip.has(p.name)).map(p=>p.name))).join(" "))"#;

/// What `npm query` of the scripted packages prints, for an npm without
/// `query` (before 8.16: npm 5 to 7, on node lines older than 14): every
/// package in the nested `node_modules` tree with an install script. Both
/// scripts are ES2015 as node 4 runs it: strict, no spread, no fd 0.
const NPM_SCRIPTED_WALK: &str = r#""use strict";const fs=require("fs"),p=require("path");const out=[];const walk=d=>{let es=[];try{es=fs.readdirSync(d)}catch(e){return}for(let e of es){if(e.startsWith("."))continue;const x=p.join(d,e);if(e.startsWith("@")){walk(x);continue}try{const j=JSON.parse(fs.readFileSync(p.join(x,"package.json"),"utf8"));const s=j.scripts||{};if(s.preinstall||s.install||s.postinstall)out.push({name:j.name,location:x})}catch(e){}walk(p.join(x,"node_modules"))}};walk("node_modules");console.log(JSON.stringify(out))"#;

/// The same for pnpm's tree, where `npm query` sees only the direct
/// dependencies: every package under `node_modules/.pnpm` with an install
/// script or a `binding.gyp` (node-gyp's implicit install), but the skipped.
const PNPM_SCRIPTED_BUT_SKIPPED: &str = r#"const fs=require("fs"),p=require("path");const skip=new Set(fs.readFileSync("/etc/belay/npm-skip-scripts","utf8").split(/\s+/).filter(Boolean));const root="node_modules/.pnpm";const out=new Set();for(const d of fs.existsSync(root)?fs.readdirSync(root):[]){const nm=p.join(root,d,"node_modules");if(!fs.existsSync(nm))continue;for(const e of fs.readdirSync(nm)){const names=e.startsWith("@")?fs.readdirSync(p.join(nm,e)).map(x=>e+"/"+x):[e];for(const n of names){try{const j=JSON.parse(fs.readFileSync(p.join(nm,n,"package.json"),"utf8"));const s=j.scripts||{};if((s.preinstall||s.install||s.postinstall||fs.existsSync(p.join(nm,n,"binding.gyp")))&&!skip.has(j.name))out.add(j.name)}catch(e){}}}}console.log([...out].join(" "))"#;

/// npm's install `cmd`, leaving out the install scripts of the packages a
/// repair named (their script downloads from a host this network refuses):
/// every script skipped, then the other packages' run (`npm rebuild`) and
/// the project's own.
fn npm_install(cmd: &str) -> String {
    install_skipping_scripts(cmd, false)
}

/// A package manager's install `cmd` without the named packages' install
/// scripts, the others' run after it: `pnpm rebuild` over pnpm's tree
/// (`pnpm`), `npm rebuild` over npm's and yarn classic's. Yarn 2+ is not
/// covered: its build logs go to files of their own, which no rule reads.
fn install_skipping_scripts(cmd: &str, pnpm: bool) -> String {
    let (list, rebuild) = if pnpm {
        (
            format!("node -e '{PNPM_SCRIPTED_BUT_SKIPPED}'"),
            "pnpm rebuild",
        )
    } else {
        // npm 6 prints its usage on stdout for `query` and fails.
        (format!("q=$(npm query ':attr(scripts, [preinstall]), :attr(scripts, [install]), :attr(scripts, [postinstall])' 2>/dev/null) || q=$(node -e '{NPM_SCRIPTED_WALK}'); printf '%s' \"$q\" | node -e '{NPM_SCRIPTED_BUT_SKIPPED}'"), "npm rebuild")
    };
    format!(
        "if [ -s {NPM_SKIP_SCRIPTS} ]; then {cmd} --ignore-scripts && pkgs=$({list}) && {{ [ -z \"$pkgs\" ] || {rebuild} $pkgs; }} && npm run preinstall --if-present && npm run install --if-present && npm run postinstall --if-present; else {cmd}; fi"
    )
}

/// Yarn 1 does not lock its cache: two builds that unpack one package into
/// the shared cache at once leave it half there ("Extracting tar content
/// of undefined failed, the file appears to be corrupt: ENOENT … chmod").
/// Yarn runs one at a time on a cache, through its own file mutex beside it
/// (`/tmp` when the build has no shared cache).
const YARN_MUTEX: &str = "--mutex file:${YARN_CACHE_FOLDER:-/tmp}/.belay-yarn-mutex";

/// yarn 2 and later, where the project names a linker other than
/// Plug'n'Play (`node-modules`, or `pnpm`, whose symlinked store the final
/// image's layers need not keep), link a `node_modules` tree: at the install
/// and in the final image's `ENV`, where every later `yarn run` (`yarn
/// test`) reads it and would otherwise find the project "not installed" for
/// want of a `.pnp.cjs`.
pub const YARN_NODE_MODULES: &str = "export YARN_NODE_LINKER=node-modules";

/// Node before 20 connects to the first address a name has (20 tries the
/// others too: `autoSelectFamily`), and with IPv6 on the loopback glibc gives
/// `::1` first for `localhost`: a server that listens on 0.0.0.0 only
/// (fastify-cli does so in a container) then refuses a client on node 18
/// (`ECONNREFUSED ::1`). So an image whose node is older than 20 gets
/// glibc's address order with IPv4 first (RFC 6724's table, as Debian's own
/// `gai.conf` suggests for sites that prefer it), in the image itself; a
/// lookup for IPv6 alone still finds `::1`. Node 20 and later keep glibc's
/// own order, as a developer's machine has it (a test that covers the
/// IPv6 branch of `server.address()` reaches it only so).
pub const IPV4_FIRST_BEFORE_NODE_20: &str = r#"[ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ] || printf '%s\n' '# belay: node before 20 takes the first address: IPv4 first' 'precedence ::1/128 50' 'precedence ::/0 40' 'precedence 2002::/16 30' 'precedence ::/96 20' 'precedence ::ffff:0:0/96 100' > /etc/gai.conf"#;

/// yarn 2 and later with Plug'n'Play (the project's own, or yarn's default)
/// run from the zip archives `.pnp.cjs` names and the packages it unplugs,
/// and `yarn run` reads the install state. All three go under
/// `/opt/belay/yarn`, in the image: not in yarn's global cache under `HOME`
/// (a sandbox's is a fresh tmpfs), not in belay's shared package cache
/// (`YARN_CACHE_FOLDER`, mounted at build time only), and not in the
/// project's `.yarn`, which every mode's sandbox hides under its work tree
/// (envimage carries `.pnp.cjs` itself there).
/// The final image's `ENV` keeps the settings, so that a `yarn run` or a
/// `yarn install` there finds them.
pub const YARN_PNP: &str = "export YARN_ENABLE_GLOBAL_CACHE=false YARN_CACHE_FOLDER=/opt/belay/yarn/cache YARN_PNP_UNPLUGGED_FOLDER=/opt/belay/yarn/unplugged YARN_INSTALL_STATE_PATH=/opt/belay/yarn/install-state.gz";

/// Where corepack keeps the releases it installs: in the image (the final
/// image's `ENV` names it), not under a `HOME` a sandbox replaces.
pub const COREPACK_HOME: &str = "/usr/local/share/corepack";

/// npm's install without a lockfile: as of the source's date when it has
/// one (`--before`, the comment saying why), the newest versions should
/// nothing resolve as of it (a dependency pinned to a later release).
/// yarn and pnpm have no such option.
fn npm_install_as_of(n: &crate::analyze::NodeFacts, deps: &mut Vec<String>) -> String {
    let plain = npm_install("npm install --no-audit --no-fund");
    let Some(a) = &n.resolve_as_of else {
        return plain;
    };
    deps.push(format!(
        "# Dependencies resolve as of {}: {}. `--resolve-as-of latest` takes the newest.",
        a.at, a.from
    ));
    // Only "no version as of the date" falls back (`ETARGET` for a range,
    // `ENOVERSIONS` for a package with no release before it): a network
    // error or a failing install script stays the repair's to see.
    format!(
        "{{ {} ; }} 2>&1 | tee /tmp/belay-npm-before.log || {{ grep -qE 'ETARGET|ENOVERSIONS|notarget|No matching version found|No versions available' /tmp/belay-npm-before.log && echo 'belay: nothing resolves as of {}: installing the newest versions' >&2 && {plain}; }}",
        npm_install(&format!("npm install --no-audit --no-fund --before={}", a.at)),
        a.at
    )
}

/// The project's package manager, at the version `packageManager` pins
/// (its major when that exact version cannot be had, then any): pnpm and
/// yarn classic from their npm packages, yarn 2+ from `@yarnpkg/cli-dist`
/// (a project's own `.yarn/releases` and `yarnPath` still win, as yarn
/// runs them itself).
fn package_manager_lines(n: &crate::analyze::NodeFacts) -> Vec<String> {
    let npm_g = "npm install -g --no-audit --no-fund";
    // On a line older than 18 the newest yarn berry and pnpm do not run,
    // nor does npm's corepack: the newest that do.
    let old_line = n.node_line.filter(|l| *l < 18);
    let (pkg, default) = match (n.package_manager.as_str(), old_line) {
        ("yarn", None) if n.yarn_berry => ("@yarnpkg/cli-dist", "4"),
        ("yarn", Some(_)) if n.yarn_berry => ("@yarnpkg/cli-dist", "3"),
        ("yarn", _) => ("yarn", "1"),
        ("pnpm", None) => ("pnpm", ""),
        ("pnpm", Some(l)) => (
            "pnpm",
            match l {
                16.. => "8",
                14 | 15 => "7",
                12 | 13 => "6",
                10 | 11 => "5",
                8 | 9 => "3",
                6 | 7 => "2",
                _ => "1",
            },
        ),
        _ => return vec![],
    };
    let bin = n.package_manager.as_str();
    let at = |v: &str| {
        if v.is_empty() {
            pkg.to_string()
        } else {
            format!("{pkg}@{v}")
        }
    };
    match n.package_manager_version.as_deref() {
        Some(v) if old_line.is_some() => {
            let major = v.split('.').next().unwrap_or(v);
            vec![format!(
                "{{ {bin} --version 2>/dev/null | grep -qx '{v}'; }} || {npm_g} {} || {npm_g} {} || {npm_g} {}",
                at(v),
                at(major),
                at(default)
            )]
        }
        Some(v) => {
            let major = v.split('.').next().unwrap_or(v);
            // corepack (the node's own, else npm's `corepack` package:
            // neither Debian's node nor the npm registry's ships it): the
            // version the project pins, checked against its hash, kept
            // under COREPACK_HOME and run by a wrapper that names it (a
            // sandbox's HOME is not the build's). Where corepack fails (a
            // proxy it cannot use, a key it does not know), its commands go
            // and npm's package is installed, unchecked.
            // The other command the package links (corepack's package
            // links both, and npm would refuse to overwrite them).
            let companion = if bin == "pnpm" { "pnpx" } else { "yarnpkg" };
            let spec = match &n.package_manager_hash {
                Some(h) => format!("{bin}@{v}+{h}"),
                None => format!("{bin}@{v}"),
            };
            vec![format!(
                "{{ {bin} --version 2>/dev/null | grep -qx '{v}'; }} || {{ {{ command -v corepack >/dev/null || {npm_g} corepack; }} && cb=$(dirname \"$(command -v corepack)\") && export COREPACK_ENABLE_DOWNLOAD_PROMPT=0 COREPACK_HOME={COREPACK_HOME} && {{ corepack install -g {spec} || corepack prepare {spec} --activate; }} && rm -f \"$cb/{bin}\" && printf '#!/bin/sh\\nexport COREPACK_HOME={COREPACK_HOME} COREPACK_ENABLE_DOWNLOAD_PROMPT=0\\nexec corepack {bin} \"$@\"\\n' > \"$cb/{bin}\" && chmod 755 \"$cb/{bin}\" && hash -r && {bin} --version 2>/dev/null | grep -qx '{v}' && echo 'belay: {bin} {v} from corepack'; }} || {{ [ -z \"${{cb:-}}\" ] || rm -f \"$cb/{bin}\" \"$cb/{companion}\"; hash -r; {npm_g} {} || {npm_g} {} || {npm_g} {}; }}",
                at(v),
                at(major),
                at(default)
            )]
        }
        // Yarn 2+ without a pinned version: a yarn 1 already there is not it.
        None if n.yarn_berry => vec![format!(
            "{{ {bin} --version 2>/dev/null | grep -q '^[2-9]'; }} || {npm_g} {}",
            at(default)
        )],
        // The pnpm of the lockfile's format, when it says.
        None => match n.lockfile_pnpm_major {
            Some(m) => vec![format!(
                "{{ {bin} --version 2>/dev/null | grep -q '^{m}\\.'; }} || {npm_g} {}",
                at(&m.to_string())
            )],
            None => vec![format!(
                "command -v {bin} >/dev/null || {npm_g} {}",
                at(default)
            )],
        },
    }
}

/// The running node's major, for the install's test (0 without a node).
const NODE_MAJOR: &str =
    r#""$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)""#;

/// The running node's major, for the runtime block's check.
const NODE_MAJOR_CHECK: &str = r#""$(node -p 'process.versions.node.split(".")[0]')""#;

/// The npm that runs on node `line` where Debian's npm 9 does not, or
/// where it would build addons with Debian's node-gyp (see `node_part`):
/// the newest whose `engines.node` admits the line's last release, but for
/// node 6 to 11 npm 6, the npm 10 and 11 shipped with, and for 4 and 5 npm
/// 5, on which npm 6 does not start. None from 18 on:
/// the npm there runs on it (npm 10 only warns on 19).
fn npm_for_line(line: u32) -> Option<u32> {
    match line {
        // npm 6 does not start on node 4 (`let` outside strict mode).
        ..=5 => Some(5),
        6..=11 => Some(6),
        12 | 17 => Some(8),
        13 | 15 => Some(7),
        14 | 16 => Some(9),
        _ => None,
    }
}

/// ` npm@N`, or nothing.
fn npm_beside(npm: Option<u32>) -> String {
    npm.map(|v| format!(" npm@{v}")).unwrap_or_default()
}

/// A link `/workspace/NAME` to the checkout, where nothing has that name
/// ([`crate::analyze::NodeFacts::checkout_name`]: a plain directory name,
/// none a mode mounts at).
fn checkout_link(name: &str) -> Option<String> {
    use belay_sandbox::layout::{reserved, REPO_NAME, WORKSPACE};
    let name = only(name, "._-");
    (!name.is_empty() && !name.starts_with('.') && !reserved(&name)).then(|| {
        format!("[ -e {WORKSPACE}/{name} ] || [ -L {WORKSPACE}/{name} ] || ln -s {REPO_NAME} {WORKSPACE}/{name}")
    })
}

/// `s` with only ASCII letters, digits and the characters of `also`: what
/// of a project's text may reach the runtime script.
fn only(s: &str, also: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || also.contains(*c))
        .collect()
}

/// The line that puts the project's node in place. Debian's node is 18 on
/// bookworm: a line the project names (older or newer) or a newer floor
/// comes from the npm registry's `node` package, as the project's
/// `engines`, `.nvmrc`, `.node-version` or `volta` says. An older line
/// brings an npm that runs on it, installed in the same command by the npm
/// that runs now (npm 6 cannot install node 10 from node 18; npm 9 runs on
/// no node older than 14).
fn node_install(n: &crate::analyze::NodeFacts) -> Option<String> {
    // `--force`: a base image's own node (the official images', a real file
    // in npm's global bin) is replaced, where npm would refuse (EEXIST).
    let g = "npm install -g --no-audit --no-fund --force";
    let install = format!("{g} node@{} && hash -r", node_to_install(n)?);
    if let Some(line) = n.node_line {
        // A pinned release is the one that runs, as nvm and volta see it:
        // Debian's 18.19 is not a pin of 18.17.1.
        if let Some(release) = pinned_release_pattern(n, line) {
            return Some(format!(
                "case \"$(node --version 2>/dev/null)\" in {release}) ;; *) {install} ;; esac"
            ));
        }
        return Some(format!("[ {NODE_MAJOR} -eq {line} ] || {{ {install}; }}"));
    }
    if n.ci_line().is_some() {
        // Any line the CI tests runs as it is (Debian's 18 among them).
        let any = ci_lines_pattern(n);
        return Some(format!(
            "case {NODE_MAJOR} in {any}) ;; *) {install} ;; esac"
        ));
    }
    let major = n.required_major?;
    Some(format!("[ {NODE_MAJOR} -ge {major} ] || {{ {install}; }}"))
}

/// What follows `node@` where the project's node is installed, the runtime
/// block's and the `node-engine` repair's alike: the line's spec
/// ([`node_spec`]) with the npm that runs on it, else the CI's line, else
/// the floor. None where the project asks for no node.
pub(crate) fn node_to_install(n: &crate::analyze::NodeFacts) -> Option<String> {
    if let Some(line) = n.node_line {
        return Some(format!(
            "{}{}",
            node_spec(n, line),
            npm_beside(npm_for_node(n))
        ));
    }
    n.ci_line()
        .or(n.required_major)
        .map(|major| major.to_string())
}

/// `node --version` of the release a pin names within `line`, as a `case`
/// pattern (`v18.17.1`, `v14.17.*`): digits and dots only.
fn pinned_release_pattern(n: &crate::analyze::NodeFacts, line: u32) -> Option<String> {
    let v = pinned_version(n, line)?;
    Some(match v.matches('.').count() {
        2 => format!("v{v}"),
        _ => format!("v{v}.*"),
    })
}

/// What `npm install -g node@…` takes for the project's `line` where it
/// has to be installed: the pin's version where the pin says more than the
/// major (`16.13.0`, `v14.17`: what its developers run, as nvm and volta
/// install it), the part of `engines.node` that admits the line where it
/// narrows it (`~16.13` gives `'16.x ~16.13'`, whose newest is 16.13.2,
/// where the line's newest, 16.20.2, is outside it), else the line.
fn node_spec(n: &crate::analyze::NodeFacts, line: u32) -> String {
    if let Some(v) = pinned_version(n, line) {
        return v;
    }
    // A pin of the line (`16`, `lts/gallium`): its newest release. A pin
    // that names no line (`lts/*`) leaves it to `engines.node`.
    if n.node_pin.as_deref().and_then(crate::analyze::pin_major) == Some(line) {
        return line.to_string();
    }
    let Some(range) = n.engines_node.as_deref() else {
        return line.to_string();
    };
    // A version of this line with a minor or patch of more than zero
    // (`16.13`, `14.17.0`) narrows it.
    let narrows = |alt: &str| {
        alt.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|v| v.split_once('.'))
            .any(|(major, rest)| {
                major == line.to_string()
                    && rest.split('.').any(|p| p.parse::<u32>().unwrap_or(0) > 0)
            })
    };
    let alts: Vec<String> = range
        .split("||")
        .map(str::trim)
        .filter(|alt| crate::as_of::allows_major(alt, line))
        // Nothing of it is shell syntax: it is quoted, and only what a
        // range holds is kept.
        .map(|alt| only(alt, " .<>=^~*-"))
        .collect();
    if alts.is_empty() || !alts.iter().any(|a| narrows(a)) {
        return line.to_string();
    }
    let set = alts
        .iter()
        .map(|a| format!("{line}.x {a}"))
        .collect::<Vec<_>>()
        .join(" || ");
    format!("'{set}'")
}

/// The version the project's pin names within `line` where it says more
/// than the major: `16.13.0`, `14.17` (digits and dots only).
fn pinned_version(n: &crate::analyze::NodeFacts, line: u32) -> Option<String> {
    let pin = n.node_pin.as_deref()?.trim().trim_start_matches('v');
    let parts: Vec<&str> = pin.split('.').collect();
    let whole = (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    (whole && crate::analyze::pin_major(pin) == Some(line)).then(|| pin.to_string())
}

/// The npm that goes with the node the runtime block installs: the line's
/// ([`npm_for_line`]), but for a pinned release older than that npm runs
/// on, the newest npm that does (npm 9 runs from 14.17 and 16.13, npm 8
/// from 12.13 and 14.15, npm 7 from 10).
fn npm_for_node(n: &crate::analyze::NodeFacts) -> Option<u32> {
    let line = n.node_line?;
    let minor = pinned_version(n, line)
        .and_then(|v| v.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()));
    match (line, minor) {
        (12, Some(0..=12)) | (14, Some(0..=14)) => Some(7),
        (14, Some(15..=16)) | (16, Some(0..=12)) => Some(8),
        _ => npm_for_line(line),
    }
}

/// Whether the project's npm is npm 5 or 6 (node lines older than 12),
/// which as root runs no install script unless told to (`unsafe-perm`)
/// and installs no peer dependencies.
fn old_npm(n: &crate::analyze::NodeFacts) -> bool {
    npm_for_node(n).is_some_and(|v| v <= 6)
}

/// The CI's lines as a `case` pattern: `20|22|24`.
fn ci_lines_pattern(n: &crate::analyze::NodeFacts) -> String {
    n.ci_node_lines
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join("|")
}

/// The CI files a node line comes from, said in the runtime check: names
/// only of what they hold, at most three.
fn ci_files_said(n: &crate::analyze::NodeFacts) -> String {
    n.ci_node_files
        .iter()
        .take(3)
        .map(|f| only(f, "._/-"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The runtime block's check of the node in place: the project's line, or
/// at least its floor, said in words the repair rules read.
fn node_version_check(n: &crate::analyze::NodeFacts) -> Option<String> {
    // Quoted into the script: nothing of it is shell syntax.
    let quoted =
        |s: Option<&String>| only(s.map(|s| s.as_str()).unwrap_or_default(), " .<>=^~*|-_/");
    if let Some(line) = n.node_line {
        if let Some(release) = pinned_release_pattern(n, line) {
            // Said as the pin says it, which the `node-engine` repair reads.
            let pin = release.trim_start_matches('v').trim_end_matches(".*");
            return Some(format!(
                "case \"$(node --version)\" in {release}) ;; *) echo \"node $(node --version) is not node {pin}, the release the project's node pin names\"; false ;; esac"
            ));
        }
        let pinned = n.node_pin.as_deref().and_then(crate::analyze::pin_major) == Some(line);
        let source = match &n.node_pin {
            Some(pin) if pinned => format!("the project's node pin ({})", quoted(Some(pin))),
            None if n.ci_node_lines == [line] => {
                format!("the project's CI ({})", ci_files_said(n))
            }
            // The date's line: said without the date's source (no shell
            // syntax reaches the script).
            None if n.node_era.is_some() => "the project's date".to_string(),
            _ => format!(
                "the project's engines.node ({})",
                quoted(n.engines_node.as_ref())
            ),
        };
        return Some(format!(
            "{{ [ {NODE_MAJOR_CHECK} -eq {line} ] || {{ echo \"node $(node --version) is not node {line}, the line {source} names\"; false; }}; }}"
        ));
    }
    if !n.ci_node_lines.is_empty() {
        let any = ci_lines_pattern(n);
        let said = any.replace('|', ", ");
        return Some(format!(
            "case {NODE_MAJOR_CHECK} in {any}) ;; *) echo \"node $(node --version) is not node {said}, the lines the project's CI tests ({})\"; false ;; esac",
            ci_files_said(n)
        ));
    }
    let major = n.required_major?;
    let wanted = match &n.node_era {
        // The date's node: said without the date's source (no shell
        // syntax reaches the script).
        Some(_) => format!("node {major}, the oldest LTS line supported at the source's date"),
        None => format!(
            "the project's engines.node {}",
            quoted(n.engines_node.as_ref())
        ),
    };
    Some(format!(
        "{{ [ {NODE_MAJOR_CHECK} -ge {major} ] || {{ echo \"node $(node --version) is older than {wanted}\"; false; }}; }}"
    ))
}

fn node_part(ctx: &RepoContext, notes: &RuntimeNotes) -> Part {
    let Some(n) = &ctx.node else {
        return Part::default();
    };
    let mut p = Part {
        lang: "node",
        ..Default::default()
    };
    if !notes.has("node") || !notes.has("npm") {
        p.runtime.push(apt_install(
            &["nodejs".to_string(), "npm".to_string()].into(),
        ));
    }
    p.runtime.extend(node_install(n));
    if old_npm(n) {
        // npm 5 and 6 as root run no package's scripts ("cannot run in wd")
        // unless told they may: the project's own install script among them.
        p.runtime.push("npm config -g set unsafe-perm true".into());
    }
    if n.native_addons {
        // node-gyp compiles them at install: Python, make, a C++ compiler,
        // and node's headers, Debian's only for Debian's node (they match
        // it; another node's package owns the same paths).
        p.runtime.push(apt_install(
            &["python3", "make", "g++"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ));
        // Debian's node-gyp links every addon with Debian's libnode (node
        // 18), and Debian's npm always runs it: in another node the addon
        // loads a second V8 and crashes. Another node gets npm's own npm,
        // whose node-gyp builds against that node's headers alone.
        p.runtime.push(format!(
            "if {}; then {}; else npm install -g --no-audit --no-fund npm@{} && hash -r; fi",
            crate::script::DEBIAN_NODE,
            apt_install(&["libnode-dev".to_string()].into()),
            npm_for_node(n).unwrap_or(10)
        ));
    }
    p.runtime.extend(package_manager_lines(n));
    p.runtime.push(IPV4_FIRST_BEFORE_NODE_20.into());
    p.runtime
        .push("echo \"node $(node --version), npm $(npm --version)\"".into());
    p.runtime_validation.push("node --version".into());
    if n.package_manager != "npm" {
        p.runtime_validation
            .push(format!("{} --version", n.package_manager));
    }
    p.runtime_validation.extend(node_version_check(n));
    // A native addon of the project's own compiles in its install script.
    if n.has_dependencies || n.lockfile.is_some() || n.native_addons {
        let install: String = match (n.package_manager.as_str(), n.lockfile.is_some()) {
            // Plug'n'Play, the project's own linker ([`YARN_PNP`]).
            ("yarn", true) if n.yarn_pnp => format!("{YARN_PNP}\nyarn install --immutable"),
            ("yarn", false) if n.yarn_pnp => format!("{YARN_PNP}\nyarn install"),
            // Any other linker links a node_modules tree ([`YARN_NODE_MODULES`]).
            ("yarn", true) if n.yarn_berry => {
                format!("{YARN_NODE_MODULES}\nyarn install --immutable")
            }
            ("yarn", false) if n.yarn_berry => format!("{YARN_NODE_MODULES}\nyarn install"),
            ("yarn", true) => install_skipping_scripts(
                &format!(
                    "yarn install {} --non-interactive {YARN_MUTEX}",
                    unless_stale("--frozen-lockfile", "--pure-lockfile")
                ),
                false,
            ),
            ("yarn", false) => install_skipping_scripts(
                &format!("yarn install --non-interactive {YARN_MUTEX}"),
                false,
            ),
            ("pnpm", true) => install_skipping_scripts(
                &format!(
                    "pnpm install {}",
                    unless_stale("--frozen-lockfile", "--no-frozen-lockfile")
                ),
                true,
            ),
            ("pnpm", false) => install_skipping_scripts("pnpm install", true),
            (_, true) => npm_install(&format!(
                "npm {} --no-audit --no-fund",
                unless_stale("ci", "install --no-save")
            )),
            (_, false) => npm_install_as_of(n, &mut p.deps),
        };
        // Install scripts that download browsers and drivers from hosts of
        // their own (playwright, puppeteer, chromedriver, geckodriver,
        // electron, cypress) are told not to: the tests that need them use
        // the system's browser, and a download that cannot succeed fails
        // the install.
        p.deps.push(BINARY_DOWNLOADS_OFF.to_string());
        // Snapshots recorded on a colour terminal pass only where the
        // output is coloured: so in the final image (`final_env`) too.
        if n.colour_snapshot.is_some() {
            p.deps.push(format!(
                "# The project's test snapshots hold a colour terminal's codes.\n{COLOUR_TESTS}"
            ));
        }
        // The checkout answers to its clone's name as well: a test that
        // reaches the project as `../mqemitter` finds it.
        p.deps
            .extend(n.checkout_name.as_deref().and_then(checkout_link));
        if n.native_addons {
            p.deps.push(NODE_HEADERS.to_string());
        }
        p.deps.push(install);
        p.deps_validation.push(match n.package_manager.as_str() {
            // npm 6 installs no peer dependencies and `ls` fails on each one
            // missing: only a missing or invalid dependency fails here.
            "npm" if old_npm(n) => {
                "npm ls --depth=0 >/dev/null 2>&1 || ! npm ls --depth=0 2>&1 | grep -E 'ERR! (missing|invalid):'".into()
            }
            "npm" => "npm ls --depth=0 >/dev/null".into(),
            // yarn 2's map is `.pnp.js`, 3 and later's `.pnp.cjs`.
            _ if n.yarn_pnp => "test -f .pnp.cjs || test -f .pnp.js".into(),
            _ => "test -d node_modules".into(),
        });
    }
    for runner in ["jest", "mocha", "vitest", "ava"] {
        if ctx.test_frameworks.iter().any(|f| f == runner) {
            if n.yarn_pnp {
                // No `node_modules/.bin`: yarn runs a dependency's binary.
                p.test.push(format!("yarn {runner} --version"));
                p.test_validation
                    .push(format!("yarn bin {runner} >/dev/null"));
            } else {
                p.test.push(format!("node_modules/.bin/{runner} --version"));
                p.test_validation
                    .push(format!("test -x node_modules/.bin/{runner}"));
            }
        }
    }
    p
}

/// The line that installs cargo and rustc. Debian's security updates carry
/// a current toolchain as cargo-web / rustc-web; plain `cargo` in bookworm is
/// 1.63, too old for the sparse registry protocol and for most crates'
/// rust-version.
fn rust_toolchain() -> String {
    format!(
        "if apt-cache show cargo-web >/dev/null 2>&1; then {}; else {}; fi",
        apt_install(&["cargo-web".to_string()].into()),
        apt_install(&["cargo".to_string()].into())
    )
}

fn rust_part(ctx: &RepoContext, notes: &RuntimeNotes) -> Part {
    let Some(r) = &ctx.rust else {
        return Part::default();
    };
    let mut p = Part {
        lang: "rust",
        ..Default::default()
    };
    if !notes.has("cargo") {
        p.runtime.push(rust_toolchain());
    }
    p.runtime.push("cargo --version && rustc --version".into());
    p.runtime_validation.push("cargo --version".into());
    if r.has_dependencies {
        // The sparse protocol reaches crates.io through plain HTTPS (and proxies).
        p.deps
            .push("export CARGO_REGISTRIES_CRATES_IO_PROTOCOL=sparse".into());
    }
    p.deps.push("cargo fetch".into());
    p.deps_validation.push("cargo test --no-run".into());
    p
}

fn go_part(ctx: &RepoContext, notes: &RuntimeNotes) -> Part {
    let Some(g) = &ctx.go else {
        return Part::default();
    };
    let mut p = Part {
        lang: "go",
        ..Default::default()
    };
    if !notes.has("go") {
        p.runtime
            .push(apt_install(&["golang-go".to_string()].into()));
    }
    p.runtime.push(
        "# Never download another toolchain; without a C compiler, build without cgo.".into(),
    );
    p.runtime
        .push("go env -w GOTOOLCHAIN=local 2>/dev/null || true".into());
    p.runtime
        .push("command -v gcc >/dev/null || go env -w CGO_ENABLED=0".into());
    p.runtime.push("go version".into());
    p.runtime_validation.push("go version".into());
    if g.has_dependencies {
        p.deps.push("go mod download".into());
    } else {
        p.deps
            .push("# go.mod requires no modules: nothing to download.".into());
        p.deps.push("go mod verify".into());
    }
    p.deps_validation.push("go list -mod=mod ./...".into());
    p
}

fn java_part(ctx: &RepoContext, notes: &RuntimeNotes) -> Part {
    let Some(j) = &ctx.java else {
        return Part::default();
    };
    let mut p = Part {
        lang: "java",
        ..Default::default()
    };
    let mut apt: BTreeSet<String> = BTreeSet::new();
    if !notes.has("javac") {
        apt.insert("default-jdk-headless".into());
    }
    let maven = j.build_tool == "maven";
    if maven && !j.wrapper && !notes.has("mvn") {
        apt.insert("maven".into());
    }
    if !maven && !j.wrapper && !notes.has("gradle") {
        apt.insert("gradle".into());
    }
    if !apt.is_empty() {
        p.runtime.push(apt_install(&apt));
    }
    let tool = match (maven, j.wrapper) {
        (true, true) => "./mvnw",
        (true, false) => "mvn",
        (false, true) => "./gradlew",
        (false, false) => "gradle",
    };
    if j.wrapper {
        p.runtime.push(format!("chmod +x {tool}"));
        p.runtime_reads_repo = true;
    }
    p.runtime.push("java -version".into());
    p.runtime_validation.push("java -version".into());
    if maven {
        p.deps.push(format!("{tool} -B -q dependency:go-offline"));
        p.deps_validation.push(format!("{tool} -B -q -o compile"));
    } else {
        p.deps.push(format!("{tool} --no-daemon dependencies"));
        p.deps_validation
            .push(format!("{tool} --no-daemon --offline compileJava"));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::{
        node_install, node_version_check, npm_install_as_of, package_manager_lines, plan_rules,
        Block, RuntimeNotes, COLOUR_TESTS,
    };
    use crate::analyze::{NodeFacts, RepoContext};

    #[test]
    fn a_named_line_is_installed_exactly_with_an_npm_that_runs_on_it() {
        let major = r#""$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)""#;
        let n = |line: Option<u32>, floor: Option<u32>| NodeFacts {
            node_line: line,
            required_major: floor,
            node_pin: line.map(|l| l.to_string()),
            ..Default::default()
        };
        // Older than Debian's: node and its npm in one command, by the npm
        // that runs now.
        assert_eq!(
            node_install(&n(Some(10), Some(10))).unwrap(),
            format!("[ {major} -eq 10 ] || {{ npm install -g --no-audit --no-fund --force node@10 npm@6 && hash -r; }}")
        );
        assert!(node_install(&n(Some(16), None))
            .unwrap()
            .ends_with("node@16 npm@9 && hash -r; }"));
        assert!(node_install(&n(Some(12), None))
            .unwrap()
            .ends_with("node@12 npm@8 && hash -r; }"));
        // npm 6 does not start on node 4: npm 5 does, and installs today.
        assert!(node_install(&n(Some(4), None))
            .unwrap()
            .ends_with("node@4 npm@5 && hash -r; }"));
        assert!(node_install(&n(Some(8), None))
            .unwrap()
            .ends_with("node@8 npm@6 && hash -r; }"));
        // From 18 on, the npm there runs on it.
        assert!(node_install(&n(Some(22), Some(22))).unwrap().ends_with(
            "-eq 22 ] || { npm install -g --no-audit --no-fund --force node@22 && hash -r; }"
        ));
        // A floor is raised to, never lowered to.
        assert!(node_install(&n(None, Some(20)))
            .unwrap()
            .contains(" -ge 20 ] || {"));
        assert!(node_install(&n(None, None)).is_none());
        // A pinned release is tested as a release, not as its line:
        // Debian's 18.19 does not stand in for 18.17.1.
        let pinned = |pin: &str| {
            node_install(&NodeFacts {
                node_pin: Some(pin.into()),
                node_line: crate::analyze::node_line(Some(pin), None),
                ..Default::default()
            })
            .unwrap()
        };
        assert_eq!(
            pinned("v18.17.1"),
            "case \"$(node --version 2>/dev/null)\" in v18.17.1) ;; *) npm install -g --no-audit --no-fund --force node@18.17.1 && hash -r ;; esac"
        );
        assert!(pinned("14.17")
            .starts_with("case \"$(node --version 2>/dev/null)\" in v14.17.*) ;; *) "));
        assert!(pinned("18").starts_with(&format!("[ {major} -eq 18 ] || {{")));
        // And checked as a release: a failed install is not passed over.
        let check = node_version_check(&NodeFacts {
            node_pin: Some("v18.17.1".into()),
            node_line: Some(18),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            check,
            "case \"$(node --version)\" in v18.17.1) ;; *) echo \"node $(node --version) is not node 18.17.1, the release the project's node pin names\"; false ;; esac"
        );
        let check = node_version_check(&n(Some(16), None)).unwrap();
        assert!(check.contains(" -eq 16 ] || { echo \"node $(node --version) is not node 16, the line the project's node pin (16) names\"; false; }"), "{check}");
    }

    #[test]
    fn a_pin_or_range_narrower_than_its_line_is_installed_as_it_says() {
        let n = |pin: Option<&str>, engines: Option<&str>| {
            let line = crate::analyze::node_line(pin, engines);
            let facts = NodeFacts {
                node_pin: pin.map(String::from),
                engines_node: engines.or(pin).map(String::from),
                node_line: line,
                ..Default::default()
            };
            let install = node_install(&facts).unwrap_or_else(|| panic!("{pin:?} {engines:?}"));
            let spec = install.split(" node@").nth(1).unwrap();
            spec.split(" && ").next().unwrap().to_string()
        };
        // A pin: its version, as nvm and volta install it.
        assert_eq!(n(Some("v16.13.0"), None), "16.13.0 npm@9");
        assert_eq!(n(Some("14.17"), None), "14.17 npm@9");
        assert_eq!(n(Some("20.11.1"), None), "20.11.1");
        // A release older than the line's npm runs on gets one that does.
        assert_eq!(n(Some("14.15.4"), None), "14.15.4 npm@8");
        assert_eq!(n(Some("v14.8.0"), None), "14.8.0 npm@7");
        assert_eq!(n(Some("16.4.2"), None), "16.4.2 npm@8");
        assert_eq!(n(Some("12.10.0"), None), "12.10.0 npm@7");
        assert_eq!(n(Some("12.22.12"), None), "12.22.12 npm@8");
        for (pin, npm) in [
            ("12.12.0", 7),
            ("12.13.0", 8),
            ("14.14.0", 7),
            ("14.16.1", 8),
            ("14.17.0", 9),
            ("16.12.0", 8),
            ("16.13.0", 9),
            ("10.24.1", 6),
        ] {
            assert_eq!(n(Some(pin), None), format!("{pin} npm@{npm}"));
        }
        assert_eq!(n(Some("16"), None), "16 npm@9");
        assert_eq!(n(Some("16.x"), None), "16 npm@9");
        assert_eq!(n(Some("lts/gallium"), None), "16 npm@9");
        // A range that narrows the line: its part that admits the line.
        assert_eq!(n(None, Some("~16.13")), "'16.x ~16.13' npm@9");
        assert_eq!(n(Some("lts/*"), Some("~16.13")), "'16.x ~16.13' npm@9");
        assert_eq!(n(None, Some("16.13.x")), "'16.x 16.13.x' npm@9");
        assert_eq!(n(None, Some("^12.22 || ~14.17.0")), "'14.x ~14.17.0' npm@9");
        assert_eq!(n(None, Some(">=14.17.0 <15")), "'14.x >=14.17.0 <15' npm@9");
        // One that does not: the line.
        assert_eq!(n(None, Some("14.x")), "14 npm@9");
        assert_eq!(n(None, Some(">=12 <17")), "16 npm@9");
        assert_eq!(n(None, Some("^12.22 || ^14")), "14 npm@9");
        // Nothing of a range reaches the shell but what a range holds.
        assert_eq!(n(None, Some("~16.13$(id)`x`")), "'16.x ~16.13idx' npm@9");
    }

    #[test]
    fn the_lines_the_ci_tests_settle_the_node() {
        let ci = |lines: &[u32], line: Option<u32>| NodeFacts {
            ci_node_lines: lines.to_vec(),
            ci_node_files: vec![".github/workflows/ci.yml".into(), ".travis.yml".into()],
            node_line: line,
            required_major: Some(14),
            ..Default::default()
        };
        // Any line the CI tests runs as it is; else its newest LTS line.
        let set = ci(&[18, 20, 21], None);
        let install = node_install(&set).unwrap();
        assert!(
            install.starts_with("case \"$(node -p")
                && install.ends_with(" 2>/dev/null || echo 0)\" in 18|20|21) ;; *) npm install -g --no-audit --no-fund --force node@20 && hash -r ;; esac"),
            "{install}"
        );
        let check = node_version_check(&set).unwrap();
        assert!(
            check.ends_with(" in 18|20|21) ;; *) echo \"node $(node --version) is not node 18, 20, 21, the lines the project's CI tests (.github/workflows/ci.yml, .travis.yml)\"; false ;; esac"),
            "{check}"
        );
        // An older line (settled by `as_of`) is the project's line, exactly,
        // with its npm.
        let old = ci(&[10], Some(10));
        assert!(node_install(&old).unwrap().contains(" -eq 10 ] || { npm install -g --no-audit --no-fund --force node@10 npm@6 && hash -r; }"));
        let check = node_version_check(&old).unwrap();
        assert!(
            check.contains("is not node 10, the line the project's CI (.github/workflows/ci.yml, .travis.yml) names"),
            "{check}"
        );
        // The line of an old date (settled by `as_of`), said as the
        // project's, which the `node-engine` repair reads.
        let dated = NodeFacts {
            node_line: Some(10),
            node_era: Some("node 10, the newest LTS line on 2019-04-09 (x)".into()),
            ..Default::default()
        };
        let check = node_version_check(&dated).unwrap();
        assert!(
            check.contains("is not node 10, the line the project's date names"),
            "{check}"
        );
        let ctx = RepoContext {
            node: Some(dated.clone()),
            ..Default::default()
        };
        let fix = crate::repair::propose(
            "node v18.19.0 is not node 10, the line the project's date names",
            &ctx,
            &[],
        );
        assert!(
            fix.first()
                .is_some_and(|p| p.rule_id == "node-engine" && p.fix.contains("node@10 npm@6")),
            "{fix:?}"
        );
        // A file name says nothing the shell reads.
        let mut odd = ci(&[20], None);
        odd.ci_node_files = vec![".github/workflows/$(x)`y`\"z.yml".into()];
        assert!(node_version_check(&odd)
            .unwrap()
            .contains("(.github/workflows/xyz.yml)"));
    }

    #[test]
    fn the_pinned_package_manager_is_installed_with_fallbacks() {
        let n = |pm: &str, v: Option<&str>, berry: bool| NodeFacts {
            package_manager: pm.into(),
            package_manager_version: v.map(String::from),
            yarn_berry: berry,
            ..Default::default()
        };
        let l = package_manager_lines(&n("pnpm", Some("9.2.0"), false));
        assert_eq!(l.len(), 1);
        assert!(
            l[0].contains("pnpm@9.2.0 || npm install -g --no-audit --no-fund pnpm@9 || npm install -g --no-audit --no-fund pnpm"),
            "{l:?}"
        );
        assert!(l[0].starts_with("{ pnpm --version 2>/dev/null | grep -qx '9.2.0'; } ||"));
        // corepack first, with the pinned hash; npm's package after it.
        let mut hashed = n("pnpm", Some("9.2.0"), false);
        hashed.package_manager_hash = Some("sha512.98a8".into());
        let l = package_manager_lines(&hashed);
        let (corepack, npm) = l[0].split_once("[ -z \"${cb:-}\" ] || rm -f").unwrap();
        assert!(
            corepack.contains("{ command -v corepack >/dev/null || npm install -g --no-audit --no-fund corepack; }"),
            "{corepack}"
        );
        assert!(
            npm.starts_with(" \"$cb/pnpm\" \"$cb/pnpx\"; hash -r;"),
            "{npm}"
        );
        assert!(
            corepack.contains("exec corepack pnpm \"$@\"\\n' > \"$cb/pnpm\""),
            "{corepack}"
        );
        assert!(
            corepack.contains("{ corepack install -g pnpm@9.2.0+sha512.98a8 || corepack prepare pnpm@9.2.0+sha512.98a8 --activate; }"),
            "{corepack}"
        );
        assert!(
            npm.contains("npm install -g --no-audit --no-fund pnpm@9.2.0 ||"),
            "{npm}"
        );
        let l = package_manager_lines(&n("yarn", Some("4.1.0"), true));
        assert!(l[0].contains("@yarnpkg/cli-dist@4.1.0"), "{l:?}");
        let l = package_manager_lines(&n("yarn", None, false));
        assert_eq!(
            l,
            ["command -v yarn >/dev/null || npm install -g --no-audit --no-fund yarn@1"]
        );
        assert!(package_manager_lines(&n("npm", Some("10.2.0"), false)).is_empty());
        // An older node line gets the newest that runs on it, and no
        // corepack (npm's needs node 22).
        let mut old = n("pnpm", None, false);
        old.node_line = Some(16);
        assert_eq!(
            package_manager_lines(&old),
            ["command -v pnpm >/dev/null || npm install -g --no-audit --no-fund pnpm@8"]
        );
        let mut old = n("pnpm", Some("7.33.0"), false);
        old.node_line = Some(14);
        assert_eq!(
            package_manager_lines(&old),
            ["{ pnpm --version 2>/dev/null | grep -qx '7.33.0'; } || npm install -g --no-audit --no-fund pnpm@7.33.0 || npm install -g --no-audit --no-fund pnpm@7 || npm install -g --no-audit --no-fund pnpm@7"]
        );
        // pnpm 3 needs node 8.15, 2 node 6, 1 node 4 (their engines).
        for (line, pnpm) in [(8, "3"), (6, "2"), (4, "1")] {
            let mut old = n("pnpm", None, false);
            old.node_line = Some(line);
            assert!(
                package_manager_lines(&old)[0].ends_with(&format!("pnpm@{pnpm}")),
                "{line}"
            );
        }
        let mut old = n("yarn", None, true);
        old.node_line = Some(12);
        assert!(package_manager_lines(&old)[0].ends_with("@yarnpkg/cli-dist@3"));
    }

    #[test]
    fn npm_without_a_lockfile_resolves_as_of_the_commit_then_the_newest() {
        let mut deps = vec![];
        let plain = npm_install_as_of(&NodeFacts::default(), &mut deps);
        assert!(deps.is_empty() && !plain.contains("--before"), "{plain}");
        let n = NodeFacts {
            resolve_as_of: Some(crate::as_of::ResolveAsOf {
                at: "2024-03-01T10:00:00Z".into(),
                from: "the committer date of HEAD (abc1234)".into(),
            }),
            ..Default::default()
        };
        let line = npm_install_as_of(&n, &mut deps);
        assert_eq!(
            deps,
            ["# Dependencies resolve as of 2024-03-01T10:00:00Z: the committer date of HEAD (abc1234). `--resolve-as-of latest` takes the newest."]
        );
        let (first, then) = line.split_once(" || { grep -qE").unwrap();
        assert!(
            first.ends_with("2>&1 | tee /tmp/belay-npm-before.log"),
            "{first}"
        );
        assert!(
            then.starts_with(
                " 'ETARGET|ENOVERSIONS|notarget|No matching version found|No versions available'"
            ),
            "{then}"
        );
        assert!(
            first.contains(
                "npm install --no-audit --no-fund --before=2024-03-01T10:00:00Z --ignore-scripts"
            ),
            "{first}"
        );
        assert!(
            then.contains("installing the newest versions")
                && then.ends_with(&format!("{plain}; }}")),
            "{then}"
        );
    }

    /// The rules' plan of a node project with these facts, on an apt base.
    fn node_plan(n: NodeFacts) -> Vec<super::Block> {
        let ctx = RepoContext {
            languages: vec![crate::analyze::Language::Node],
            node: Some(n),
            ..Default::default()
        };
        let notes = RuntimeNotes {
            package_manager: Some("apt".into()),
            ..Default::default()
        };
        plan_rules(&ctx, &notes).unwrap()
    }

    fn yarn_install_block(blocks: &[Block]) -> &Block {
        blocks
            .iter()
            .find(|b| b.script.contains("yarn install"))
            .expect("a block installs with yarn")
    }

    #[test]
    fn yarn_berry_links_node_modules_at_the_install_and_in_the_image() {
        for lockfile in [Some("yarn.lock".to_string()), None] {
            let blocks = node_plan(NodeFacts {
                package_manager: "yarn".into(),
                yarn_berry: true,
                lockfile: lockfile.clone(),
                has_dependencies: true,
                ..Default::default()
            });
            let deps = yarn_install_block(&blocks);
            let at = |needle: &str| deps.script.find(needle).unwrap();
            assert!(
                at(super::YARN_NODE_MODULES) < at("yarn install"),
                "{lockfile:?}: {}",
                deps.script
            );
            assert!(crate::dockerfile::final_env(&blocks)
                .contains(&"YARN_NODE_LINKER=node-modules".to_string()));
        }
    }

    #[test]
    fn yarn_plug_n_play_keeps_its_archives_in_the_image_outside_the_project() {
        let blocks = node_plan(NodeFacts {
            package_manager: "yarn".into(),
            yarn_berry: true,
            yarn_pnp: true,
            lockfile: Some("yarn.lock".into()),
            has_dependencies: true,
            ..Default::default()
        });
        let deps = yarn_install_block(&blocks);
        let at = |needle: &str| deps.script.find(needle).unwrap();
        assert!(at(super::YARN_PNP) < at("yarn install --immutable"));
        assert!(!deps.script.contains(super::YARN_NODE_MODULES));
        assert!(deps.validation_command.contains(".pnp.cjs"));
        let env = crate::dockerfile::final_env(&blocks);
        for var in [
            "YARN_ENABLE_GLOBAL_CACHE=false",
            "YARN_CACHE_FOLDER=/opt/belay/yarn/cache",
            "YARN_PNP_UNPLUGGED_FOLDER=/opt/belay/yarn/unplugged",
            "YARN_INSTALL_STATE_PATH=/opt/belay/yarn/install-state.gz",
        ] {
            assert!(env.contains(&var.to_string()), "{env:?}");
        }
        assert!(!env.iter().any(|e| e.starts_with("YARN_NODE_LINKER")));
    }

    #[test]
    fn npm_5_and_6_may_run_scripts_as_root_and_miss_peer_dependencies() {
        let plan = |line: u32| {
            node_plan(NodeFacts {
                package_manager: "npm".into(),
                node_line: Some(line),
                has_dependencies: true,
                ..Default::default()
            })
            .iter()
            .flat_map(|b| [b.script.as_str(), b.validation_command.as_str()])
            .collect::<Vec<_>>()
            .join("\n")
        };
        for line in [4, 8, 10] {
            let all = plan(line);
            assert!(
                all.contains("npm config -g set unsafe-perm true"),
                "{line}: {all}"
            );
            assert!(
                all.contains("grep -E 'ERR! (missing|invalid):'"),
                "{line}: {all}"
            );
        }
        let all = plan(12);
        assert!(!all.contains("unsafe-perm"), "{all}");
        assert!(!all.contains("ERR! (missing"), "{all}");
    }

    #[test]
    fn tests_recorded_on_a_colour_terminal_run_coloured_in_the_image() {
        let ctx = |colour: Option<&str>| RepoContext {
            languages: vec![crate::analyze::Language::Node],
            node: Some(NodeFacts {
                package_manager: "yarn".into(),
                lockfile: Some("yarn.lock".into()),
                has_dependencies: true,
                colour_snapshot: colour.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        };
        let notes = RuntimeNotes {
            package_manager: Some("apt".into()),
            ..Default::default()
        };
        let plain = plan_rules(&ctx(None), &notes).unwrap();
        assert!(!plain.iter().any(|b| b.script.contains(COLOUR_TESTS)));
        assert!(!crate::dockerfile::final_env(&plain).contains(&"FORCE_COLOR=1".to_string()));
        let coloured = plan_rules(&ctx(Some("src/__snapshots__/a.snap")), &notes).unwrap();
        let deps = coloured
            .iter()
            .find(|b| b.script.contains(COLOUR_TESTS))
            .expect("a block exports FORCE_COLOR");
        assert!(deps.script.contains("yarn install"), "{}", deps.script);
        assert!(crate::dockerfile::final_env(&coloured).contains(&"FORCE_COLOR=1".to_string()));
    }

    #[test]
    fn the_system_programs_of_the_test_scripts_are_installed_where_the_base_lacks_them() {
        let ctx = RepoContext {
            languages: vec![crate::analyze::Language::Node],
            node: Some(NodeFacts {
                package_manager: "npm".into(),
                script_tools: vec!["rsync".into(), "xvfb-run".into(), "jq".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut notes = RuntimeNotes {
            package_manager: Some("apt".into()),
            ..Default::default()
        };
        notes.tools.insert("jq".into(), "/usr/bin/jq".into());
        let blocks = plan_rules(&ctx, &notes).unwrap();
        let system = blocks
            .iter()
            .find(|b| b.id == "10-system-packages")
            .expect("a system block");
        let install = system
            .script
            .lines()
            .find(|l| l.starts_with("apt-get install"))
            .unwrap();
        let pkgs: Vec<&str> = install.split_whitespace().collect();
        for p in ["rsync", "xvfb", "xauth"] {
            assert!(pkgs.contains(&p), "{install}");
        }
        assert!(!pkgs.contains(&"jq"), "the base has jq: {install}");
    }
}
