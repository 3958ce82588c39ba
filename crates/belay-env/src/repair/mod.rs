//! Rules-based repair: error text -> a fix, as data.
//!
//! Each [`Rule`] is a row: a pattern over the failed command's output, a fix
//! template, an optional read-only probe that tells whether the fix is needed,
//! and optionally the earlier block the fix belongs to (the error points at that
//! block's output, so the build rolls back there). The engine in `build.rs`
//! decides when to repair; this module only proposes.

use std::sync::OnceLock;

use regex::{Captures, Regex};

use crate::analyze::RepoContext;
use crate::module_dists;

/// One repair rule.
#[derive(Debug)]
pub struct Rule {
    pub id: &'static str,
    /// Regex over the tail of the failed command's output (multi-line mode).
    pub pattern: &'static str,
    /// Fix template; see [`render`] for the placeholders.
    pub fix: &'static str,
    /// Read-only probe: exit 0 means the fix is *not* needed (already present).
    pub probe: Option<&'static str>,
    /// The role of the earlier block whose output the error points at
    /// (`python-runtime` names `20-python-runtime`, `21-python-runtime` or the
    /// shared `20-runtime-toolchain`).
    pub blame: Option<&'static str>,
    pub hint: &'static str,
}

mod classify;
mod rules;
mod tables;

pub use classify::{
    classify, classify_in, Classified, DISPLAY_AT_COLLECTION, NETWORK_AT_COLLECTION,
    SOURCE_INCOMPLETE,
};
pub use rules::RULES;
use tables::{CMD_PKG, EXT_PKG, HEADER_PKG, PC_PKG};

/// What repair looked up before proposing (the lookups that need IO).
#[derive(Debug, Clone, Default)]
pub struct Lookups {
    /// Shared library file name -> the Debian package that ships it.
    pub sonames: std::collections::BTreeMap<String, String>,
}

/// The shared libraries a failure says are missing, as the file names the
/// Contents index lookup takes: the loader's `libGL.so.1: cannot open shared
/// object file`; the linker's `cannot find -lsqlite3` (`libsqlite3.so`, the
/// development link); a library loaded by name, ctypes' or cffi's
/// `Library "GL" not found` (`libGL.so.*`, any version); PyOpenGL's
/// `_p.GLES2.glGetError` on a `None` library (`libGLESv2.so.*`).
pub fn missing_sonames(text: &str) -> Vec<String> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let Some(re) = RE
        .get_or_init(|| {
            Regex::new(concat!(
                r"(?P<so>lib[\w.+-]*?\.so(?:\.\d+)*): cannot open shared object file",
                r"|cannot find -l(?P<link>[\w.+-]+)",
                r#"|Library "(?P<name>[\w.+-]+)" not found"#,
                r"|cannot load library '(?P<load>[^'/]+)'",
                r#"|no library called "(?P<called>[\w.+-]+)" was found"#,
                // PyOpenGL's platform left a library it could not load as None.
                r"|_p\.(?P<pyopengl>GL|GLES[123]|GLU|GLUT|EGL)\.\w+[^\n]*\n[^\n]*'NoneType' object has no attribute",
            ))
            .ok()
        })
        .as_ref()
    else {
        return Vec::new();
    };
    // A name without `.so` ("GL", "cairo", "libcairo-2"): any version of it.
    let by_name = |n: &str| {
        if n.contains(".so") {
            n.to_string()
        } else {
            format!("lib{}.so.*", n.trim_start_matches("lib"))
        }
    };
    let mut out: Vec<String> = Vec::new();
    for c in re.captures_iter(text) {
        let s = if let Some(m) = c.name("so") {
            m.as_str().to_string()
        } else if let Some(m) = c.name("link") {
            format!("lib{}.so", m.as_str())
        } else if let Some(m) = c.name("name").or(c.name("load")).or(c.name("called")) {
            by_name(m.as_str())
        } else if let Some(m) = c.name("pyopengl") {
            // The names PyOpenGL's GLX/EGL platforms load each library by
            // (GL is glvnd's libOpenGL first, then the older libGL).
            let names: &[&str] = match m.as_str() {
                "GL" => &["OpenGL", "GL"],
                "GLES1" => &["GLESv1_CM"],
                "GLES2" | "GLES3" => &["GLESv2"],
                "GLUT" => &["glut"],
                other => &[other][..],
            };
            for n in names {
                let s = by_name(n);
                if !out.contains(&s) {
                    out.push(s);
                }
            }
            continue;
        } else {
            continue;
        };
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The sonames `ldd` output reports `not found` (`libEGL.so.1 => not
/// found`). The output comes from the build container: only names shaped
/// like a shared library's are taken.
pub fn unresolved_sonames(ldd: &str) -> Vec<String> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let Some(re) = RE
        .get_or_init(|| {
            Regex::new(r"^\s*(lib[\w.+-]{1,100}?\.so(?:\.\d{1,6}){0,4})\s+=>\s+not found\s*$").ok()
        })
        .as_ref()
    else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for line in ldd.lines().take(20_000) {
        if let Some(c) = re.captures(line) {
            let s = c[1].to_string();
            if !out.contains(&s) && out.len() < 64 {
                out.push(s);
            }
        }
    }
    out
}

/// The rule id of a library `ldd` finds unresolved when no rule matched.
pub const HIDDEN_LIBRARY_RULE: &str = "shared-library-unresolved";

/// Whether a failure looks like a load that failed (an ImportError, an
/// OSError, a shim's "no bindings"), so that a library hidden behind it is
/// worth an `ldd` scan: a plain test failure is not.
pub fn may_hide_a_library(text: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"ImportError|OSError|bindings could be found|BindingsNotFound|dlopen|shared object|undefined symbol").ok()
    })
    .as_ref()
    .is_some_and(|r| r.is_match(text))
}

/// Install what ships each library `ldd` found unresolved (`found`, from
/// the Contents index), when no rule matched the failure: `None` when the
/// index names no package or the same fix was tried.
pub fn propose_unresolved(found: &Lookups, tried: &[String]) -> Option<Proposal> {
    let mut pkgs: Vec<&str> = Vec::new();
    for p in found.sonames.values() {
        if !pkgs.contains(&p.as_str()) {
            pkgs.push(p);
        }
    }
    if pkgs.is_empty() {
        return None;
    }
    let fix = format!("{APT} {}", pkgs.join(" "));
    if tried.contains(&fix) {
        return None;
    }
    Some(Proposal {
        rule_id: HIDDEN_LIBRARY_RULE.into(),
        fix,
        probe: None,
        blame: None,
        hint: "no rule matches, and ldd finds shared libraries the loader cannot resolve (a package that catches the ImportError hides them): install the packages that ship them".into(),
    })
}

/// A proposed repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub rule_id: String,
    pub fix: String,
    pub probe: Option<String>,
    pub blame: Option<String>,
    pub hint: String,
}

fn compiled() -> &'static [(usize, Regex)] {
    static C: OnceLock<Vec<(usize, Regex)>> = OnceLock::new();
    C.get_or_init(|| {
        RULES
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                Regex::new(&format!("(?m){}", r.pattern))
                    .ok()
                    .map(|re| (i, re))
            })
            .collect()
    })
}

const APT: &str = "{ ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || apt-get update -q; } && apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0";
const PIP: &str = "{ [ -x /workspace/repo/.venv/bin/python ] || python3 -m venv /workspace/repo/.venv; } && /workspace/repo/.venv/bin/python -m pip install --disable-pip-version-check";

/// The repository files pytest names as failing to import
/// (`ImportError while importing test module '/workspace/repo/src/x_test.py'.`,
/// `ImportError while loading conftest '/workspace/repo/tests/conftest.py'.`),
/// relative to the repository.
fn failing_test_modules(text: &str) -> Vec<String> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let Some(re) = RE
        .get_or_init(|| {
            Regex::new(r"ImportError while (?:importing test module|loading conftest) '/workspace/repo/([^'\n]+\.py)'").ok()
        })
        .as_ref()
    else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for c in re.captures_iter(text).take(8) {
        let rel = c[1].to_string();
        if !out.contains(&rel) {
            out.push(rel);
        }
    }
    out
}

/// An install that resolves like the plan's own: uv when the runtime block
/// installed it, as of the plan's cut-off date, pip otherwise. The arguments
/// follow it, as they follow `{pip}`.
fn resolving_install(ctx: &RepoContext) -> String {
    let uv = format!(
        "env UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=copy {} pip install --python /workspace/repo/.venv/bin/python",
        crate::plan::UV
    );
    let pip = "/workspace/repo/.venv/bin/python -m pip install --disable-pip-version-check";
    // The date is RFC 3339 (digits, `-`, `:`, `T`, `Z`): safe in the quotes.
    let (with_uv, pip_note) = match ctx.python.as_ref().and_then(|p| p.resolve_as_of.as_ref()) {
        Some(a) => (
            format!(
                "{uv} --exclude-newer {at} \"$@\" || {{ echo \"belay: nothing resolves as of {at}: resolving with the newest versions\" >&2; exec {uv} \"$@\"; }}",
                at = a.at
            ),
            format!(
                " echo \"belay: pip cannot resolve as of {}, so the newest versions are installed\" >&2;",
                a.at
            ),
        ),
        None => (format!("exec {uv} \"$@\""), String::new()),
    };
    format!(
        "{{ [ -x /workspace/repo/.venv/bin/python ] || python3 -m venv /workspace/repo/.venv; }} && sh -c 'if [ -x {} ]; then {with_uv}; else{pip_note} exec {pip} \"$@\"; fi' belay-install",
        crate::plan::UV
    )
}

/// The system programs a project's test scripts may run that the image
/// gets (`analyze::script_tools`): a developer's everyday tools, not a
/// toolchain (cargo, go, java come with their language's block) or a
/// service.
const SCRIPT_TOOLS: &[&str] = &[
    "rsync",
    "jq",
    "zip",
    "unzip",
    "curl",
    "wget",
    "git",
    "make",
    "lsof",
    "nc",
    "openssl",
    "bc",
    "xvfb-run",
    "zstd",
    "shellcheck",
    "bats",
    "file",
    "tree",
    "patch",
    "xz",
    "bzip2",
    "sqlite3",
    "perl",
    "ps",
    "which",
    "protoc",
];

/// The Debian packages (space-separated) that give a project's test script
/// the system program `program`, where it is one of [`SCRIPT_TOOLS`].
pub(crate) fn program_packages(program: &str) -> Option<&'static str> {
    if !SCRIPT_TOOLS.contains(&program) {
        return None;
    }
    CMD_PKG.iter().find(|(k, _)| *k == program).map(|(_, v)| *v)
}

fn lookup(table: &[(&str, &str)], key: &str) -> Option<String> {
    table
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

fn is_local_module(ctx: &RepoContext, module: &str) -> bool {
    crate::analyze::is_local_module(
        &ctx.repo_path,
        ctx.python.as_ref().and_then(|p| p.import_name.as_deref()),
        module,
    )
}

/// Render a template; `None` when a placeholder cannot be filled.
fn render(
    rule: &Rule,
    template: &str,
    caps: &Captures,
    ctx: &RepoContext,
    all_missing: &[String],
    lookups: &Lookups,
    text: &str,
) -> Option<String> {
    let cap1 = caps
        .iter()
        .skip(1)
        .flatten()
        .map(|m| m.as_str().to_string())
        .find(|s| !s.is_empty() && !s.starts_with("required by") && *s != "was ");
    let mut out = template
        .replace("{apt}", APT)
        .replace("{pip}", PIP)
        .replace("{debian_node}", crate::script::DEBIAN_NODE);
    if out.contains("{resolve}") {
        out = out.replace("{resolve}", &resolving_install(ctx));
    }
    if out.contains("{node}") {
        // What the runtime block installs: one spec for both.
        let spec = crate::plan::node_to_install(ctx.node.as_ref()?)?;
        out = out.replace("{node}", &spec);
    }
    if out.contains("{header:1}") {
        let h = cap1.clone()?;
        let pkg = lookup(HEADER_PKG, &h).or_else(|| {
            // "foo/bar.h" -> try its file name.
            h.rsplit('/').next().and_then(|f| lookup(HEADER_PKG, f))
        })?;
        out = out.replace("{header:1}", &pkg);
    }
    if out.contains("{cmd:1}") {
        let c = cap1.clone()?;
        let pkg = lookup(CMD_PKG, &c).unwrap_or_else(|| c.clone());
        out = out.replace("{cmd:1}", &pkg);
    }
    if out.contains("{known_cmd:1}") {
        // Only a command the table knows: a file name ('setup.cfg') is not one.
        let pkg = lookup(CMD_PKG, cap1.as_deref()?)?;
        out = out.replace("{known_cmd:1}", &pkg);
    }
    if out.contains("{pc:1}") {
        let c = cap1.clone()?;
        let pkg =
            lookup(PC_PKG, &c).unwrap_or_else(|| format!("lib{}-dev", c.trim_start_matches("lib")));
        out = out.replace("{pc:1}", &pkg);
    }
    if out.contains("{soname:1}") {
        out = out.replace("{soname:1}", &soname_packages(text, lookups)?);
    }
    if out.contains("{extras:2}") {
        out = out.replace("{extras:2}", &needed_extras(caps, ctx, text)?);
    }
    let module = cap1.clone();
    match rule.id {
        "lockfile-stale" => {
            // npm 6's crash names no lockfile: a lockfile of npm's only.
            let whole = caps.get(0).map_or("", |m| m.as_str());
            let npm_lock = ctx.node.as_ref().is_some_and(|n| n.has_npm_lockfile());
            if whole.starts_with("npm ERR! Cannot read property") && !npm_lock {
                return None;
            }
        }
        "project-extra-missing" => {
            let file = cap1.clone()?;
            if !project_extra_applies(&file, caps, ctx) {
                return None;
            }
        }
        "local-module-not-installed" => {
            let m = module?;
            if !is_local_module(ctx, &top_package(&m)) {
                return None;
            }
        }
        "python-module-missing" => {
            let m = module?;
            let dists = missing_distributions(&m, ctx, all_missing, text)?;
            out = out.replace("{module:1}", &dists);
        }
        _ => {}
    }
    if out.contains("{ext:1}") {
        let pkg = lookup(EXT_PKG, cap1.as_deref()?)?;
        out = out.replace("{ext:1}", &pkg);
    }
    if out.contains("{dec:1}") {
        let n: u32 = cap1.clone()?.parse().ok()?;
        out = out.replace("{dec:1}", &n.checked_sub(1)?.to_string());
    }
    if let Some(c) = &cap1 {
        out = out.replace("{1}", c);
    }
    if out.contains("{2}") {
        out = out.replace("{2}", caps.get(2)?.as_str());
    }
    (!out.contains('{') || !out.contains(":1}")).then_some(out)
}

/// A module's top-level package: the project's own module is one whose top-level package is.
fn top_package(m: &str) -> String {
    m.split('.').next().unwrap_or(m).to_string()
}

/// What fills `{soname:1}`: the packages that ship the missing libraries.
fn soname_packages(text: &str, lookups: &Lookups) -> Option<String> {
    // The library the failure names first, then every other one the
    // lookup found missing (a wheel that needs libGL usually needs
    // libEGL, fontconfig and more): one repair, not one per library.
    // Keyed as `missing_sonames` names it (`-lsqlite3` is `libsqlite3.so`).
    // The first the index resolved: cffi names a library as it was
    // asked for ("cairo-2") before the loader's file (libcairo.so.2).
    let first = missing_sonames(text)
        .iter()
        .find_map(|s| lookups.sonames.get(s))?;
    let mut pkgs = vec![first.as_str()];
    for p in lookups.sonames.values() {
        if !pkgs.contains(&p.as_str()) {
            pkgs.push(p);
        }
    }
    Some(pkgs.join(" "))
}

/// What fills `{extras:2}`: the project's extras that provide the missing
/// module (capture 2) and what the failing test modules need; `None` when none does.
fn needed_extras(caps: &Captures, ctx: &RepoContext, text: &str) -> Option<String> {
    // The extras whose requirements name the missing module's
    // distribution (`yaml` is PyYAML's): not every extra, which for a
    // large project may not resolve at all.
    let module = caps.get(2)?.as_str();
    let dist_of = |m: &str| {
        let top = m.split('.').next().unwrap_or(m);
        crate::analyze::normalise_name(module_dists::distribution(m).unwrap_or(top))
    };
    let py = ctx.python.as_ref()?;
    let core: Vec<String> = py
        .core_dependencies
        .iter()
        .map(|d| crate::analyze::normalise_name(d))
        .collect();
    // And what the project's modules that the failing test modules import
    // import in turn: cattrs's test_preconf imports a converter per
    // format, each needing one extra, which would be one attempt each.
    let mut dists = vec![dist_of(module)];
    for rel in failing_test_modules(text) {
        let import_name = py.import_name.as_deref();
        for file in crate::analyze::own_files_imported_by(&ctx.repo_path, &rel, import_name) {
            for m in crate::analyze::third_party_imports_of_package_file(
                &ctx.repo_path,
                &file,
                import_name,
            ) {
                let d = dist_of(&m);
                // A core dependency is installed already: an extra that
                // repeats it (`all`, `gpu = ["cupy", "numpy"]`) is not
                // what the test module needs.
                if !dists.contains(&d) && !core.contains(&d) {
                    dists.push(d);
                }
            }
        }
    }
    // Names from the repository's own metadata go into a shell word:
    // only those shaped like an extra's name (PEP 685).
    let extras: Vec<&str> = py
        .extra_requirements
        .iter()
        .filter(|(_, reqs)| {
            reqs.iter()
                .any(|r| dists.contains(&crate::analyze::normalise_name(r)))
        })
        .map(|(e, _)| e.as_str())
        .filter(|e| {
            !e.is_empty()
                && e.len() <= 64
                && e.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
        .collect();
    if extras.is_empty() {
        return None;
    }
    Some(extras.join(","))
}

/// Whether `project-extra-missing` applies: the import that failed (in
/// `file`, capture 1) is in the project's own package, and the missing
/// module (capture 2) is not the project's own.
fn project_extra_applies(file: &str, caps: &Captures, ctx: &RepoContext) -> bool {
    // The import that failed is in the project's own package, not
    // in a test file (`calc/tests/test_x.py` is a test's need), and
    // the missing module is not the project's own.
    let parts: Vec<&str> = file.trim_start_matches("src/").split('/').collect();
    let name = parts.last().copied().unwrap_or("");
    let is_test = parts
        .iter()
        .any(|p| matches!(*p, "tests" | "test" | "testing"))
        || name.starts_with("test_")
        || name.ends_with("_test.py")
        || name == "conftest.py";
    let missing = caps.get(2).map(|m| m.as_str()).unwrap_or("");
    if is_test
        || parts.len() < 2
        || !is_local_module(ctx, parts[0])
        || is_local_module(ctx, &top_package(missing))
    {
        return false;
    }
    true
}

/// What fills `{module:1}` of `python-module-missing`: the distributions of
/// every missing module (`m` first among them) that is not the project's
/// own; `None` when there is none to install.
fn missing_distributions(
    m: &str,
    ctx: &RepoContext,
    all_missing: &[String],
    text: &str,
) -> Option<String> {
    // The repository's own (a package, or a directory such as
    // `tests/` without `__init__.py`): never a name to install.
    let own = |m: &str| {
        is_local_module(ctx, &top_package(m))
            || matches!(m, "venv" | "ensurepip")
            || matches!(
                top_package(m).as_str(),
                "tests" | "test" | "testing" | "conftest"
            )
            || ctx.repo_path.join(top_package(m)).is_dir()
    };
    if own(m) {
        return None;
    }
    // Every missing module the output names, so that one round installs them all,
    // and what else the test module or conftest that failed imports at
    // column 0 (collection stops at the first one missing).
    let mut wanted: Vec<String> = all_missing.to_vec();
    for rel in failing_test_modules(text) {
        let import_name = ctx.python.as_ref().and_then(|p| p.import_name.as_deref());
        for extra in crate::analyze::third_party_imports_of(&ctx.repo_path, &rel, import_name) {
            if !wanted.contains(&extra) {
                wanted.push(extra);
            }
        }
    }
    let mut dists: Vec<String> = Vec::new();
    for m in wanted.iter().filter(|m| !own(m)) {
        let d = match module_dists::distribution_in_text(m, text) {
            Some(d) => d.to_string(),
            // A shared namespace (`google`) without the dotted import
            // that says which of its distributions: no guess.
            None if module_dists::is_namespace(m) => continue,
            None => module_dists::distribution_or_own(m),
        };
        // A bound such as `setuptools<81` is quoted for the shell.
        let d = if d
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            d
        } else {
            format!("'{d}'")
        };
        if !dists.contains(&d) {
            dists.push(d);
        }
    }
    if dists.is_empty() {
        return None;
    }
    Some(dists.join(" "))
}

/// Fixes for a failure, most specific first, skipping fixes already `tried`.
pub fn propose(text: &str, ctx: &RepoContext, tried: &[String]) -> Vec<Proposal> {
    propose_with(text, ctx, tried, &Lookups::default())
}

/// [`propose`], with what was looked up for this failure.
pub fn propose_with(
    text: &str,
    ctx: &RepoContext,
    tried: &[String],
    lookups: &Lookups,
) -> Vec<Proposal> {
    let mut out: Vec<Proposal> = Vec::new();
    for (i, re) in compiled() {
        let rule = &RULES[*i];
        // The last match is the one nearest the failure.
        let Some(caps) = re.captures_iter(text).last() else {
            continue;
        };
        let all: Vec<String> = re
            .captures_iter(text)
            .filter_map(|c| c.get(1).map(|m| m.as_str().to_string()))
            .collect();
        let Some(fix) = render(rule, rule.fix, &caps, ctx, &all, lookups, text) else {
            continue;
        };
        if tried.contains(&fix) || out.iter().any(|p| p.fix == fix) {
            continue;
        }
        out.push(Proposal {
            rule_id: rule.id.to_string(),
            probe: rule
                .probe
                .and_then(|p| render(rule, p, &caps, ctx, &all, lookups, text)),
            blame: rule.blame.map(String::from),
            hint: rule.hint.to_string(),
            fix,
        });
    }
    out
}

/// The block that plays `role` in a plan: `<NN>-<role>`, or the shared block
/// of a plan with three or more languages.
pub fn block_for_role<'a>(ids: impl Iterator<Item = &'a str>, role: &str) -> Option<usize> {
    let ids: Vec<&str> = ids.collect();
    let shared = if role.ends_with("-runtime") {
        "runtime-toolchain"
    } else {
        "project-dependencies"
    };
    ids.iter()
        .position(|id| id.split_once('-').is_some_and(|(_, r)| r == role))
        .or_else(|| {
            ids.iter()
                .position(|id| id.split_once('-').is_some_and(|(_, r)| r == shared))
        })
}

/// The tail of a log file that repair reads (bounded).
pub fn failure_text(log: &std::path::Path, stdout_tail: &str, stderr_tail: &str) -> String {
    const MAX: u64 = 32 * 1024;
    use std::io::{Read, Seek, SeekFrom};
    // host-owned: an exec log belay's log sink wrote in the run dir (its text is a build's output, bounded here).
    let from_log = std::fs::File::open(log).ok().and_then(|mut f| {
        let len = f.metadata().ok()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(MAX))).ok()?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    });
    from_log.unwrap_or_else(|| format!("{stdout_tail}\n{stderr_tail}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::{NodeFacts, PythonFacts};

    fn ctx() -> RepoContext {
        RepoContext {
            repo_path: "/nonexistent-repo".into(),
            python: Some(PythonFacts {
                import_name: Some("calc".into()),
                extras: vec![
                    "bson".into(),
                    "msgpack".into(),
                    "pyyaml".into(),
                    "bad;rm -rf /".into(),
                ],
                extra_requirements: [
                    ("bson", vec!["pymongo"]),
                    ("msgpack", vec!["msgpack"]),
                    ("pyyaml", vec!["pyyaml"]),
                    ("yaml2", vec!["pyyaml", "ruamel-yaml"]),
                    ("bad;rm -rf /", vec!["pyyaml"]),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
                .collect(),
                ..Default::default()
            }),
            node: Some(NodeFacts {
                required_major: Some(20),
                lockfile: Some("package-lock.json".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// npm 6's crash on a lockfile that lacks a dependency reads as a stale
    /// lockfile only where the project has a lockfile of npm's.
    #[test]
    fn npm_6s_crash_is_a_stale_lockfile_only_beside_one() {
        let text = "npm ERR! Cannot read property 'mocha' of undefined\n";
        let first = |c: &RepoContext| propose(text, c, &[]).first().map(|p| p.rule_id.clone());
        assert_eq!(first(&ctx()).as_deref(), Some("lockfile-stale"));
        let mut yarn = ctx();
        if let Some(n) = yarn.node.as_mut() {
            n.lockfile = Some("yarn.lock".into());
        }
        assert_eq!(first(&yarn), None);
    }

    /// Real error text, the rule it must pick first, and a fragment of the fix.
    const CASES: &[(&str, &str, &str)] = &[
        ("E: Unable to locate package libffi-dev", "apt-lists-missing", "apt-get update"),
        // aiohasupervisor 0.3.0's dev extra on Python 3.13 (trixie), verbatim.
        ("  × Failed to download and build `orjson==3.10.6`\n  ├─▶ Failed to parse: `pyproject.toml`\n  ╰─▶ TOML parse error at line 1, column 1\n  help: `orjson` (v3.10.6) was included because `aiohasupervisor` (v0.3.0) depends on `orjson`", "pinned-source-build-failed", "echo 'orjson!=3.10.6' >> /etc/uv/belay-overrides.txt"),
        ("E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem.", "dpkg-interrupted", "dpkg --configure -a"),
        ("WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'ReadTimeoutError(\"HTTPSConnectionPool(host='x', port=443): Read timed out. (read timeout=15)\")'", "transient-network", "sleep"),
        ("error: externally-managed-environment\n\n× This environment is externally managed\n╰─> To install Python packages system-wide, try apt install", "pep668-externally-managed", "python3 -m venv"),
        ("The virtual environment was not created successfully because ensurepip is not\navailable.  On Debian/Ubuntu systems, you need to install the python3-venv\npackage using the following command.", "python-venv-missing", "python3-venv"),
        ("src/_pyyaml.c:4:10: fatal error: Python.h: No such file or directory\n    4 | #include \"Python.h\"\n      |          ^~~~~~~~~~\ncompilation terminated.", "python-headers", "python3-dev"),
        ("Error: pg_config executable not found.\n\npg_config is required to build psycopg2 from source.", "pg-config", "libpq-dev"),
        ("/bin/sh: 1: mysql_config: not found\nOSError: mysql_config not found", "mysql-config", "default-libmysqlclient-dev"),
        ("  Could not find directory of OpenSSL installation, and this `-sys` crate cannot\n  proceed without this knowledge.", "openssl-sys", "libssl-dev"),
        ("      c/_cffi_backend.c:15:10: fatal error: ffi.h: No such file or directory\n         15 | #include <ffi.h>\n            |          ^~~~~~~\n      compilation terminated.", "missing-c-header", "libffi-dev"),
        ("src/lxml/includes/etree_defs.h:14:10: fatal error: libxml/xmlversion.h: No such file or directory", "missing-c-header", "libxml2-dev"),
        ("build/temp.linux-x86_64-cpython-311/_openssl.c:575:10: fatal error: openssl/opensslv.h: No such file or directory", "missing-c-header", "libssl-dev"),
        ("Package libffi was not found in the pkg-config search path.\nPerhaps you should add the directory containing `libffi.pc'", "pkg-config-package", "libffi-dev"),
        ("/bin/sh: 1: pkg-config: not found", "pkg-config-missing", "pkg-config"),
        ("error: command 'x86_64-linux-gnu-gcc' failed: No such file or directory", "c-compiler-missing", "build-essential"),
        // propcache 0.2.0 cythonizes at build time (seen in the corpus).
        ("[1/1] Cythonizing /workspace/repo/src/propcache/_helpers_c.pyx\n         error: [Errno 2] No such file or directory: 'x86_64-linux-gnu-gcc'", "c-compiler-missing", "build-essential"),
        ("error: linker `cc` not found\n  |\n  = note: No such file or directory (os error 2)", "c-compiler-missing", "build-essential"),
        // npm 9: a dependency's postinstall fetching a binary from its own host.
        ("npm ERR! code 1\nnpm ERR! path /workspace/repo/node_modules/fetch-binary\nnpm ERR! command failed\nnpm ERR! command sh -c node install.js\nnpm ERR! downloading https://downloads.example.com/tool-linux-x64.tar.gz\nnpm ERR! Error: getaddrinfo ENOTFOUND downloads.example.com", "npm-install-script-download", "echo 'fetch-binary' >> /etc/belay/npm-skip-scripts"),
        ("npm error code 1\nnpm error path /workspace/repo/node_modules/@scope/driver\nnpm error command failed\nnpm error command sh -c node ./install\nnpm error Error: connect ECONNREFUSED 140.82.121.4:443", "npm-install-script-download", "'@scope/driver'"),
        // pnpm 9 and yarn 1.22, the same postinstall (their own words).
        (".../node_modules/fetch-binary postinstall$ node install.js\n.../node_modules/marker postinstall: Done\n.../node_modules/fetch-binary postinstall: downloading https://downloads.belay-fixture.invalid/tool-linux-x64\n.../node_modules/fetch-binary postinstall: Error: getaddrinfo ENOTFOUND downloads.belay-fixture.invalid\n.../node_modules/fetch-binary postinstall: Failed\n ELIFECYCLE  Command failed with exit code 1.", "pnpm-install-script-download", "echo 'fetch-binary' >> /etc/belay/npm-skip-scripts"),
        // pnpm cuts its prefix to 40 characters: a long scoped name keeps no node_modules.
        (".../@playwright/browser-chromium postinstall: Error: getaddrinfo EAI_AGAIN playwright.azureedge.net", "pnpm-install-script-download", "echo '@playwright/browser-chromium' >> /etc/belay/npm-skip-scripts"),
        ("node v18.19.0 is older than node 22, the oldest LTS line supported at the source's date", "node-engine", "node@20"),
        ("[4/4] Building fresh packages...\nerror /workspace/repo/node_modules/@scope/driver: Command failed.\nExit code: 1\nCommand: node install.js\nArguments: \nDirectory: /workspace/repo/node_modules/@scope/driver\nOutput:\ndownloading https://downloads.belay-fixture.invalid/tool-linux-x64\nError: getaddrinfo ENOTFOUND downloads.belay-fixture.invalid", "yarn-install-script-download", "echo '@scope/driver' >> /etc/belay/npm-skip-scripts"),
        // node-gyp 9 building a native addon where no Python is installed.
        ("npm ERR! gyp ERR! find Python \nnpm ERR! gyp ERR! find Python Python is not set from command line or npm configuration\nnpm ERR! gyp ERR! find Python You need to install the latest version of Python.", "node-gyp-toolchain", "python3 make g++"),
        ("npm ERR! gyp info spawn make\nnpm ERR! make: Entering directory '/workspace/repo/build'\nnpm ERR!   CXX(target) Release/obj.target/addon/addon.o\nnpm ERR! make: g++: No such file or directory\nnpm ERR! make: *** [addon.target.mk:111: Release/obj.target/addon/addon.o] Error 127", "node-gyp-toolchain", "g++"),
        // node-hid 2.1.2's `node-gyp rebuild` (its devDependency prebuild pins node-gyp 6) on Python 3.11.
        ("gyp info spawn args [ '/workspace/repo/node_modules/node-gyp/gyp/gyp_main.py', 'binding.gyp' ]\n  File \"/workspace/repo/node_modules/node-gyp/gyp/pylib/gyp/input.py\", line 237, in LoadOneBuildFile\n    build_file_contents = open(build_file_path, 'rU').read()\nValueError: invalid mode: 'rU' while trying to load binding.gyp\ngyp ERR! configure error \ngyp ERR! stack Error: `gyp` failed with exit code: 1", "node-gyp-python-rU", "belay-open-mode-u.pth"),
        // envinfo 5.7.0 (yarn.lock from 2018) on node 18, verbatim.
        ("[3/5] Fetching packages...\nerror upath@1.0.4: The engine \"node\" is incompatible with this module. Expected version \">=4 <=9\". Got \"18.20.8\"\ninfo Visit https://yarnpkg.com/en/docs/cli/install for documentation about this command.\nerror Found incompatible module.", "yarn-dependency-engine-cap", "yarn config set ignore-engines true"),
        // node-hid 2.1.2's hidapi once gyp runs (the rU repair), verbatim.
        ("npm ERR! Package libusb-1.0 was not found in the pkg-config search path.\nnpm ERR! Perhaps you should add the directory containing `libusb-1.0.pc'\nnpm ERR! to the PKG_CONFIG_PATH environment variable\nnpm ERR! No package 'libusb-1.0' found\nnpm ERR! gyp: Call to 'pkg-config libusb-1.0 --cflags' returned exit status 1 while in binding.gyp. while trying to load binding.gyp", "pkg-config-package", "libusb-1.0-0-dev"),
        // node-hid 2.1.2's hidapi once libusb is there, verbatim.
        ("npm ERR!   CC(target) Release/obj.target/hidapi-linux-hidraw/hidapi/linux/hid.o\nnpm ERR! ../hidapi/linux/hid.c:44:10: fatal error: libudev.h: No such file or directory\nnpm ERR!    44 | #include <libudev.h>\nnpm ERR! compilation terminated.", "missing-c-header", "libudev-dev"),
        ("npm ERR! gyp ERR! stack Error: not found: make\nnpm ERR! gyp ERR! stack     at getNotFoundError (/usr/share/nodejs/which/which.js:10:17)", "node-gyp-toolchain", "make"),
        // node-gyp 10 without a way to nodejs.org.
        ("npm ERR! gyp http GET https://nodejs.org/download/release/v20.11.0/node-v20.11.0-headers.tar.gz\nnpm ERR! gyp WARN install got an error, rolling back install\nnpm ERR! gyp ERR! configure error \nnpm ERR! gyp ERR! stack FetchError: request to https://nodejs.org/download/release/v20.11.0/node-v20.11.0-headers.tar.gz failed, reason: getaddrinfo EAI_AGAIN nodejs.org", "node-headers-unreachable", "libnode-dev"),
        ("node v18.19.0 is older than the project's engines.node >=20", "node-engine", "node@20"),
        ("node v18.19.0 is not node 20, the line the project's node pin (20) names", "node-engine", "node@20 && hash -r"),
        ("node v18.19.0 is not node 20, 22, the lines the project's CI tests (.github/workflows/ci.yml)", "node-engine", "node@20 && hash -r"),
        // npm 6's log of a postinstall that downloads (node 10, verbatim).
        ("\n> fetch-binary@1.0.0 postinstall /workspace/repo/node_modules/fetch-binary\n> node install.js\n\ndownloading https://downloads.belay-fixture.invalid/tool-linux-x64\n{ Error: getaddrinfo ENOTFOUND downloads.belay-fixture.invalid downloads.belay-fixture.invalid:443\n    at GetAddrInfoReqWrap.onlookup [as oncomplete] (dns.js:56:26)\n", "npm6-install-script-download", "echo 'fetch-binary' >> /etc/belay/npm-skip-scripts"),
        ("npm WARN EBADENGINE Unsupported engine {\nnpm WARN EBADENGINE   package: 'x@1.0.0',\nnpm WARN EBADENGINE   required: { node: '>=20' },", "node-engine", "node@20"),
        ("go: go.mod requires go >= 1.21 (running go 1.19; GOTOOLCHAIN=local)", "go-too-old", "golang-1.22-go"),
        ("bash: line 1: ./gradlew: Permission denied", "gradlew-not-executable", "chmod +x"),
        ("/workspace/repo/.venv/bin/python: No such file or directory", "venv-broken", "rm -rf /workspace/repo/.venv"),
        ("Error: Cannot find module 'is-number'\nRequire stack:\n- /workspace/repo/index.js", "node-modules-missing", "node_modules"),
        ("E   ModuleNotFoundError: No module named 'calc'", "local-module-not-installed", "-e /workspace/repo"),
        ("ImportError while importing test module '/workspace/repo/tests/test_x.py'.\nE   ModuleNotFoundError: No module named 'yaml'", "python-module-missing", "PyYAML"),
        ("/belay/scripts/30.sh: line 9: tree: command not found", "command-not-found", "tree"),
        ("E   ModuleNotFoundError: No module named 'yaml._yaml'", "python-extension-not-built", "libyaml-dev"),
        ("pluggy._manager.PluginValidationError: Plugin '/workspace/repo/tests/conftest.py' for hook 'pytest_pycollect_makemodule'\nhookimpl definition: pytest_pycollect_makemodule(path, parent)\nArgument(s) {'path'} are declared in the hookimpl but can not be found in the hookspec", "pytest-hook-removed", "pytest<8"),
        ("E   pytest.PytestRemovedIn10Warning: Passing a non-Collection iterable to parametrize is deprecated.", "pytest-too-new", "pytest<9"),
        ("E   ModuleNotFoundError: No module named 'railroad'\nE   ModuleNotFoundError: No module named 'jinja2'", "python-module-missing", "railroad-diagrams jinja2"),
        ("bash: line 1: cmake: command not found", "command-not-found", "cmake"),
        ("E   ModuleNotFoundError: No module named 'xdist'", "python-module-missing", "pytest-xdist"),
        ("    import pkg_resources\nModuleNotFoundError: No module named 'pkg_resources'", "python-module-missing", "'setuptools<81'"),
        ("tests/test_proto.py:1: in <module>\n    from google.protobuf import descriptor\nE   ModuleNotFoundError: No module named 'google.protobuf'", "python-module-missing", "protobuf"),
        // A package's _pb2 built with protoc 6 under the protobuf 5 runtime.
        ("  File \"/workspace/repo/.venv/lib/python3.11/site-packages/google/protobuf/runtime_version.py\", line 106, in ValidateProtobufRuntimeVersion\n    _ReportVersionError(\ngoogle.protobuf.runtime_version.VersionError: Detected incompatible Protobuf Gencode/Runtime versions when loading grpc/health/v1/health.proto: gencode 6.31.1 runtime 5.29.5. Runtime version cannot be older than the linked gencode version. See Protobuf version guarantees at https://protobuf.dev/support/cross-version-runtime-guarantee.", "protobuf-runtime-older-than-gencode", "'protobuf~=6.31'"),
        ("TypeError: Descriptors cannot be created directly.\nIf this call came from a _pb2.py file, your generated code is out of date and must be regenerated with protoc >= 3.19.0.", "protobuf-gencode-too-old", "'protobuf<4'"),
        ("  error: subprocess-exited-with-error\n  Error parsing\n  Traceback (most recent call last):\n    File \"/tmp/pip-build-env/overlay/lib/python3.11/site-packages/pbr/core.py\", line 105, in pbr\n  Exception: Versioning for this project requires either an sdist tarball, or access to an upstream git repository. It's also possible that there is a mismatch between the package name in setup.cfg and the argument given to pbr.version.VersionInfo. Project name pbrdemo was given, but was not able to be found.", "needs-git", "install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 git"),
        ("  LookupError: setuptools-scm was unable to detect version for /workspace/repo.", "needs-git", "safe.directory"),
        ("fatal: detected dubious ownership in repository at '/workspace/repo'\nTo add an exception for this directory, call:", "git-dubious-ownership", "safe.directory /workspace/repo"),
        ("ImportError while loading conftest '/workspace/repo/tests/conftest.py'.\nsrc/glibdemo/__init__.py:3: in <module>\n    _gobject = ctypes.CDLL(\"libgobject-2.0.so.0\")\nE   OSError: libgobject-2.0.so.0: cannot open shared object file: No such file or directory", "shared-library-missing", "libglib2.0-0"),
        ("E   ImportError: libGL.so.1: cannot open shared object file: No such file or directory", "shared-library-missing", "libgl1"),
        ("  = note: /usr/bin/ld: cannot find -lsqlite3: No such file or directory\n          collect2: error: ld returned 1 exit status", "library-missing-at-link", "libsqlite3-dev"),
        ("E   ImportError: Library \"GL\" not found.", "library-missing-at-load", "libgl1"),
        ("E   FileNotFoundError: [Errno 2] No such file or directory: 'convert'", "command-missing-at-run", "imagemagick"),
        ("         Error: Please make sure the libxml2 and libxslt development packages are installed.", "libxml2-dev-missing", "libxslt1-dev"),
        ("         distutils.errors.DistutilsPlatformError: can't find Rust compiler", "rust-compiler-missing", "cargo-web"),
        ("    raise QtBindingsNotFoundError()\nqtpy.QtBindingsNotFoundError: No Qt bindings could be found", "qt-binding-missing", "PyQt5"),
        ("/bin/sh: 1: javac: not found", "command-not-found", "default-jdk-headless"),
        // cliff 4.7.0's collection under pytest 8.2.0, verbatim.
        ("___________________ ERROR collecting cliff/tests/test_app.py ___________________\n.venv/lib/python3.11/site-packages/testtools/testcase.py:241: in __init__\n    test_method = self._get_test_method()\n.venv/lib/python3.11/site-packages/testtools/testcase.py:696: in _get_test_method\n    return getattr(self, method_name)\nE   AttributeError: 'TestInteractiveMode' object has no attribute 'runTest'", "pytest-unittest-runtest", "'pytest<8.2'"),
        // cattrs 23.2.3's collection, its package renamed to this context's `calc`:
        // the project's own module imports an optional dependency.
        ("tests/test_preconf.py:51: in <module>\n    from calc.preconf.pyyaml import make_converter as pyyaml_make_converter\nsrc/calc/preconf/pyyaml.py:5: in <module>\n    from yaml import safe_dump, safe_load\nE   ModuleNotFoundError: No module named 'yaml'", "project-extra-missing", "-e '/workspace/repo[pyyaml,yaml2]'"),
        // chance 1.0.18's yarn.lock, behind its package.json (yarn 1.22).
        ("yarn install v1.22.22\n[1/4] Resolving packages...\nerror Your lockfile needs to be updated, but yarn was run with `--frozen-lockfile`.\ninfo Visit https://yarnpkg.com/en/docs/cli/install for documentation about this command.", "lockfile-stale", "touch /etc/belay/lockfile-stale"),
        ("npm error code EUSAGE\nnpm error\nnpm error `npm ci` can only install packages when your package.json and package-lock.json or npm-shrinkwrap.json are in sync. Please update your lock file with `npm install` before continuing.\nnpm error\nnpm error Missing: left-pad@1.3.0 from lock file", "lockfile-stale", "lockfile-stale"),
        // find-free-port 2.0.0's lockfile, without its mocha, under npm 6's `npm ci`, verbatim.
        ("npm ERR! Cannot read property 'mocha' of undefined\n\nnpm ERR! A complete log of this run can be found in:\nnpm ERR!     /mnt/npm/_logs/2026-12-06T08_13_35_469Z-debug.log", "lockfile-stale", "lockfile-stale"),
        (" ERR_PNPM_OUTDATED_LOCKFILE  Cannot install with \"frozen-lockfile\" because pnpm-lock.yaml is not up to date with <ROOT>/package.json", "lockfile-stale", "lockfile-stale"),
        // dns2 2.1.0's install once nothing resolves as of its date (npm 9), verbatim.
        ("npm ERR! code ERESOLVE\nnpm ERR! ERESOLVE unable to resolve dependency tree\nnpm ERR! \nnpm ERR! While resolving: dns2@2.1.0\nnpm ERR! Found: eslint@7.32.0\nnpm ERR! node_modules/eslint\nnpm ERR!   dev eslint@\"^7.28.0\" from the root project\nnpm ERR! \nnpm ERR! Could not resolve dependency:\nnpm ERR! peer eslint@\"^8.0.1\" from eslint-config-standard@17.1.0\nnpm ERR! Fix the upstream dependency conflict, or retry\nnpm ERR! this command with --force or --legacy-peer-deps", "npm-peer-conflict", "npm config set legacy-peer-deps true"),
        // npm 10's words, with an engine warning before it.
        ("npm warn EBADENGINE Unsupported engine {\nnpm warn EBADENGINE   package: 'x@1.0.0',\nnpm warn EBADENGINE   required: { node: '>=20' },\nnpm error code ERESOLVE\nnpm error ERESOLVE could not resolve", "npm-peer-conflict", "legacy-peer-deps"),
        // memchr 2.7.4's `cargo test --no-run` on rustc 1.96, verbatim (the tail).
        ("error: missing documentation for a macro\nnote: the lint level is defined here\n   --> src/lib.rs:172:9\n    |\n172 | #![deny(missing_docs)]\n    |         ^^^^^^^^^^^^\n\nerror: could not compile `memchr` (lib test) due to 1 previous error", "rust-lint-denied", "--cap-lints"),
    ];

    #[test]
    fn every_rule_has_real_error_text() {
        for r in RULES {
            assert!(
                CASES.iter().any(|(_, id, _)| *id == r.id),
                "rule {} has no test case",
                r.id
            );
            assert!(
                Regex::new(r.pattern).is_ok(),
                "rule {} has a bad pattern",
                r.id
            );
        }
    }

    /// What the Contents index says of the libraries in [`CASES`].
    fn lookups() -> Lookups {
        let mut l = Lookups::default();
        l.sonames.insert("libGL.so.1".into(), "libgl1".into());
        l.sonames
            .insert("libgobject-2.0.so.0".into(), "libglib2.0-0".into());
        l.sonames
            .insert("libsqlite3.so".into(), "libsqlite3-dev".into());
        l.sonames.insert("libGL.so.*".into(), "libgl1".into());
        l
    }

    #[test]
    fn rules_pick_the_right_fix() {
        let c = ctx();
        for (text, id, fragment) in CASES {
            let p = propose_with(text, &c, &[], &lookups());
            let first = p
                .first()
                .unwrap_or_else(|| panic!("no proposal for {id}: {text}"));
            assert_eq!(first.rule_id, *id, "for text: {text}\nproposals: {p:#?}");
            assert!(
                first.fix.contains(fragment),
                "{id}: {} lacks {fragment}",
                first.fix
            );
            assert!(
                crate::safety::check_repair(&first.fix).is_none(),
                "{id}: fix refused by the safety filter: {}",
                first.fix
            );
            if let Some(probe) = &first.probe {
                assert!(
                    crate::safety::check_probe(probe).is_none(),
                    "{id}: bad probe {probe}"
                );
            }
        }
    }

    /// A line older than 18 comes back with the npm that runs on it: npm 9
    /// runs on no node 10.
    #[test]
    fn an_older_node_line_is_repaired_with_its_npm() {
        let mut c = ctx();
        c.node = Some(NodeFacts {
            node_line: Some(10),
            node_pin: Some("10".into()),
            required_major: Some(10),
            ..Default::default()
        });
        let text = "node v18.19.0 is not node 10, the line the project's node pin (10) names";
        let p = propose_with(text, &c, &[], &lookups());
        assert_eq!(
            p.first().map(|p| (p.rule_id.as_str(), p.fix.as_str())),
            Some((
                "node-engine",
                "npm install -g --no-audit --no-fund --force node@10 npm@6 && hash -r && node --version"
            ))
        );
    }

    /// A pinned release is repaired to that release, as the runtime block
    /// installs it, not to its line's newest.
    #[test]
    fn a_pinned_release_is_repaired_to_that_release() {
        let mut c = ctx();
        for (pin, line, fix) in [
            ("18.17.1", 18, "node@18.17.1 && hash -r"),
            ("v16.13.0", 16, "node@16.13.0 npm@9 && hash -r"),
        ] {
            c.node = Some(NodeFacts {
                node_line: Some(line),
                node_pin: Some(pin.into()),
                ..Default::default()
            });
            let want = pin.trim_start_matches('v');
            let text = format!(
                "node v18.19.0 is not node {want}, the release the project's node pin names"
            );
            let p = propose_with(&text, &c, &[], &lookups());
            assert_eq!(
                p.first().map(|p| p.rule_id.as_str()),
                Some("node-engine"),
                "{text}"
            );
            assert!(
                p[0].fix
                    .ends_with(&format!("--force {fix} && node --version")),
                "{}",
                p[0].fix
            );
        }
        // A range that narrows the line: its spec, quoted, which the safety
        // filter reads as one argument (its `>` is no redirection).
        c.node = Some(NodeFacts {
            node_line: Some(14),
            engines_node: Some(">=14.17.0 <15".into()),
            ..Default::default()
        });
        let text = "node v18.19.0 is not node 14, the line the project's engines.node (>=14.17.0 <15) names";
        let p = propose_with(text, &c, &[], &lookups());
        assert_eq!(
            p.first().map(|p| p.fix.as_str()),
            Some("npm install -g --no-audit --no-fund --force node@'14.x >=14.17.0 <15' npm@9 && hash -r && node --version")
        );
    }

    #[test]
    fn blame_roles_find_their_block_in_any_plan() {
        let one = [
            "00-preflight",
            "10-system-packages",
            "20-python-runtime",
            "30-python-deps",
        ];
        assert_eq!(
            block_for_role(one.iter().copied(), "python-runtime"),
            Some(2)
        );
        let two = [
            "00-preflight",
            "20-node-runtime",
            "21-python-runtime",
            "30-node-deps",
            "31-python-deps",
        ];
        assert_eq!(
            block_for_role(two.iter().copied(), "python-runtime"),
            Some(2)
        );
        assert_eq!(block_for_role(two.iter().copied(), "node-deps"), Some(3));
        let many = [
            "00-preflight",
            "20-runtime-toolchain",
            "30-project-dependencies",
        ];
        assert_eq!(block_for_role(many.iter().copied(), "node-deps"), Some(2));
        assert_eq!(
            block_for_role(["00-preflight"].iter().copied(), "node-deps"),
            None
        );
    }

    #[test]
    fn pyopengl_libraries_left_as_none_are_named_for_the_lookup() {
        // PyOpenGL 3.1.7's collection without libOpenGL/libGLESv2, verbatim.
        let text = "OpenGL/raw/GL/_errors.py:4: in <module>\n    _error_checker = _ErrorChecker( _p, _p.GL.glGetError )\nE   AttributeError: 'NoneType' object has no attribute 'glGetError'\nOpenGL/raw/GLES2/_errors.py:4: in <module>\n    _error_checker = _ErrorChecker( _p, _p.GLES2.glGetError )\nE   AttributeError: 'NoneType' object has no attribute 'glGetError'";
        assert_eq!(
            missing_sonames(text),
            ["libOpenGL.so.*", "libGL.so.*", "libGLESv2.so.*"]
        );
        let mut l = Lookups::default();
        l.sonames
            .insert("libOpenGL.so.*".into(), "libopengl0".into());
        l.sonames.insert("libGL.so.*".into(), "libgl1".into());
        l.sonames.insert("libGLESv2.so.*".into(), "libgles2".into());
        let p = propose_with(text, &ctx(), &[], &l);
        assert_eq!(p[0].rule_id, "library-missing-at-load");
        assert!(
            p[0].fix.ends_with(" libopengl0 libgl1 libgles2"),
            "{}",
            p[0].fix
        );
        // Any other attribute error on None is not a library.
        assert!(
            missing_sonames("E   AttributeError: 'NoneType' object has no attribute 'split'")
                .is_empty()
        );
    }

    #[test]
    fn an_optional_import_in_a_test_file_is_not_an_extra() {
        let c = ctx();
        // astropy's layout: the tests live inside the package.
        let in_tests = "calc/tests/test_io.py:3: in <module>\n    import yaml\nE   ModuleNotFoundError: No module named 'yaml'";
        assert!(propose(in_tests, &c, &[])
            .iter()
            .all(|p| p.rule_id != "project-extra-missing"));
        // No extra declares the module: the per-module rule takes it.
        let undeclared = "src/calc/io.py:3: in <module>\n    import toml\nE   ModuleNotFoundError: No module named 'toml'";
        let p = propose(undeclared, &c, &[]);
        assert!(
            p.iter().all(|p| p.rule_id != "project-extra-missing"),
            "{p:?}"
        );
        assert_eq!(p[0].rule_id, "python-module-missing");
    }

    #[test]
    fn the_extras_of_every_project_module_a_failing_test_imports_go_in_one_round() {
        // cattrs 23.2.3's layout: test_preconf imports a converter per format,
        // and each converter imports its optional library.
        let repo = tempfile::tempdir().unwrap();
        let w = |rel: &str, text: &str| {
            let p = repo.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w("src/calc/__init__.py", "import attrs\n");
        w("src/calc/preconf/__init__.py", "");
        w(
            "src/calc/preconf/bson.py",
            "from bson import ObjectId\nfrom ..converters import C\n",
        );
        w("src/calc/preconf/msgpack.py", "from msgpack import dumps\n");
        w("src/calc/preconf/json.py", "from json import dumps\n");
        w(
            "tests/test_preconf.py",
            "import pytest\nimport calc\nfrom calc.preconf.bson import make_converter\nfrom calc.preconf.json import make_converter as j\nfrom calc.preconf import (msgpack, json)\n",
        );
        let mut c = ctx();
        c.repo_path = repo.path().to_path_buf();
        // attrs is a core dependency: the extra that repeats it is not taken.
        let py = c.python.as_mut().unwrap();
        py.core_dependencies = vec!["attrs".into()];
        py.extra_requirements
            .insert("speedups".into(), vec!["attrs".into()]);
        let text = "ImportError while importing test module '/workspace/repo/tests/test_preconf.py'.\ntests/test_preconf.py:2: in <module>\n    from calc.preconf.bson import make_converter\nsrc/calc/preconf/bson.py:1: in <module>\n    from bson import ObjectId\nE   ModuleNotFoundError: No module named 'bson'";
        let p = propose(text, &c, &[]);
        assert_eq!(p[0].rule_id, "project-extra-missing", "{p:?}");
        assert!(
            p[0].fix.ends_with("-e '/workspace/repo[bson,msgpack]'"),
            "{}",
            p[0].fix
        );
        // A path out of the repository is not read.
        assert!(
            crate::analyze::own_files_imported_by(repo.path(), "../x.py", Some("calc")).is_empty()
        );
    }

    #[test]
    fn libraries_ldd_finds_when_no_rule_matches_are_installed_once() {
        let mut l = Lookups::default();
        assert!(
            propose_unresolved(&l, &[]).is_none(),
            "nothing found, nothing proposed"
        );
        l.sonames.insert("libGL.so.1".into(), "libgl1".into());
        l.sonames.insert("libEGL.so.1".into(), "libegl1".into());
        l.sonames.insert("libGLX.so.0".into(), "libgl1".into());
        let p = propose_unresolved(&l, &[]).unwrap();
        assert_eq!(p.rule_id, HIDDEN_LIBRARY_RULE);
        assert!(p.fix.ends_with("Use-Pty=0 libegl1 libgl1"), "{}", p.fix);
        assert!(crate::safety::check_repair(&p.fix).is_none());
        assert!(
            propose_unresolved(&l, std::slice::from_ref(&p.fix)).is_none(),
            "tried once"
        );
    }

    #[test]
    fn tried_fixes_are_not_proposed_again() {
        let c = ctx();
        let text = "fatal error: ffi.h: No such file or directory";
        let first = propose(text, &c, &[]).remove(0);
        assert!(propose(text, &c, &[first.fix]).is_empty());
    }

    #[test]
    fn libraries_the_linker_or_a_loader_by_name_misses_are_looked_up_too() {
        // rusqlite 0.31.0's `cargo test --no-run`, pyglet 2.0.15's and
        // cairocffi's collection, verbatim.
        let link = "  = note: /usr/bin/ld: cannot find -lsqlite3: No such file or directory\n          collect2: error: ld returned 1 exit status";
        let pyglet = "E   ImportError: Library \"GL\" not found.";
        let cffi = "OSError: no library called \"cairo-2\" was found\ncannot load library 'libcairo.so.2': libcairo.so.2: cannot open shared object file";
        assert_eq!(missing_sonames(link), ["libsqlite3.so"]);
        assert_eq!(missing_sonames(pyglet), ["libGL.so.*"]);
        assert_eq!(missing_sonames(cffi), ["libcairo-2.so.*", "libcairo.so.2"]);
        let mut l = Lookups::default();
        l.sonames
            .insert("libsqlite3.so".into(), "libsqlite3-dev".into());
        l.sonames.insert("libGL.so.*".into(), "libgl1".into());
        let p = propose_with(link, &ctx(), &[], &l);
        assert_eq!(p[0].rule_id, "library-missing-at-link");
        assert!(p[0].fix.ends_with("libsqlite3-dev libgl1"), "{}", p[0].fix);
        // cffi's first name resolves to nothing; the loader's second does.
        let mut l = Lookups::default();
        l.sonames.insert("libcairo.so.2".into(), "libcairo2".into());
        let p = propose_with(cffi, &ctx(), &[], &l);
        assert!(p[0].fix.ends_with(" libcairo2"), "{}", p[0].fix);
        let mut l = Lookups::default();
        l.sonames.insert("libGL.so.*".into(), "libgl1".into());
        let p = propose_with(pyglet, &ctx(), &[], &l);
        assert_eq!(p[0].rule_id, "library-missing-at-load");
        assert!(p[0].fix.ends_with(" libgl1"), "{}", p[0].fix);
        // Without a lookup there is no package to name: no proposal.
        assert!(propose_with(pyglet, &ctx(), &[], &Lookups::default())
            .iter()
            .all(|p| p.rule_id != "library-missing-at-load"));
    }

    #[test]
    fn a_test_module_that_fails_to_import_gets_all_its_imports_in_one_repair() {
        let d = tempfile::tempdir().unwrap();
        fs_err::create_dir_all(d.path().join("src")).unwrap();
        fs_err::write(
            d.path().join("src/img2pdf_test.py"),
            "import numpy\nimport scipy.signal\nimport zlib\nimport img2pdf\nfrom PIL import Image\n",
        )
        .unwrap();
        fs_err::write(d.path().join("src/img2pdf.py"), "").unwrap();
        let mut c = ctx();
        c.repo_path = d.path().to_path_buf();
        // img2pdf 0.5.1's collection, verbatim.
        let text = "ImportError while importing test module '/workspace/repo/src/img2pdf_test.py'.\nHint: make sure your test modules/packages have valid Python names.\nTraceback:\n/usr/lib/python3.11/importlib/__init__.py:126: in import_module\n    return _bootstrap._gcd_import(name[level:], package, level)\nsrc/img2pdf_test.py:5: in <module>\n    import numpy\nE   ModuleNotFoundError: No module named 'numpy'";
        let p = propose_with(text, &c, &[], &Lookups::default());
        assert_eq!(p[0].rule_id, "python-module-missing");
        assert!(
            p[0].fix.ends_with("belay-install numpy scipy pillow"),
            "{}",
            p[0].fix
        );
    }

    #[test]
    fn the_repositorys_own_tests_package_is_never_installed() {
        // hass-nabucasa 0.88.1: the repair asked the index for `tests`.
        let text = "ImportError while loading conftest '/workspace/repo/tests/conftest.py'.\ntests/conftest.py:18: in <module>\n    from tests.utils.aiohttp import mock_aiohttp_client\nE   ModuleNotFoundError: No module named 'tests'";
        let p = propose_with(text, &ctx(), &[], &Lookups::default());
        assert!(
            p.iter().all(|p| p.rule_id != "python-module-missing"),
            "{p:?}"
        );
    }

    #[test]
    fn a_command_the_tests_run_at_import_is_installed() {
        // img2pdf 0.5.1's collection, verbatim.
        let text = "/usr/lib/python3.11/subprocess.py:1901: in _execute_child\n    raise child_exception_type(errno_num, err_msg, err_filename)\nE   FileNotFoundError: [Errno 2] No such file or directory: 'convert'";
        let p = propose_with(text, &ctx(), &[], &Lookups::default());
        assert_eq!(p[0].rule_id, "command-missing-at-run");
        assert!(p[0].fix.ends_with(" imagemagick"), "{}", p[0].fix);
        // A path is not a command.
        let path =
            "FileNotFoundError: [Errno 2] No such file or directory: '/workspace/repo/data/x.txt'";
        assert!(propose_with(path, &ctx(), &[], &Lookups::default())
            .iter()
            .all(|p| p.rule_id != "command-missing-at-run"));
        // Nor is a file name the command table does not know.
        let file = "FileNotFoundError: [Errno 2] No such file or directory: 'setup.cfg'";
        assert!(propose_with(file, &ctx(), &[], &Lookups::default())
            .iter()
            .all(|p| p.rule_id != "command-missing-at-run"));
    }

    #[test]
    fn the_libraries_ldd_cannot_find_are_read_and_all_installed_at_once() {
        // ldd over PyQt6's wheel in bookworm, as the lookup's probe prints it.
        let ldd = "/workspace/repo/.venv/lib/python3.11/site-packages/PyQt6/Qt6/lib/libQt6Gui.so.6:
\tlinux-vdso.so.1 (0x00007ffd5f3e2000)
\tlibEGL.so.1 => not found
\tlibfontconfig.so.1 => not found
\tlibGL.so.1 => not found
\tlibQt6Core.so.6 => /workspace/repo/.venv/lib/python3.11/site-packages/PyQt6/Qt6/lib/libQt6Core.so.6 (0x00007f)
\tlibEGL.so.1 => not found
\tlib$(reboot).so => not found
";
        assert_eq!(
            unresolved_sonames(ldd),
            ["libEGL.so.1", "libfontconfig.so.1", "libGL.so.1"]
        );
        let mut l = Lookups::default();
        for (s, p) in [
            ("libGL.so.1", "libgl1"),
            ("libEGL.so.1", "libegl1"),
            ("libfontconfig.so.1", "libfontconfig1"),
        ] {
            l.sonames.insert(s.into(), p.into());
        }
        let text = "INTERNALERROR> ImportError: libGL.so.1: cannot open shared object file: No such file or directory";
        let p = propose_with(text, &ctx(), &[], &l);
        assert_eq!(p[0].rule_id, "shared-library-missing");
        assert!(
            p[0].fix.ends_with("libgl1 libegl1 libfontconfig1"),
            "{}",
            p[0].fix
        );
    }

    #[test]
    fn sonames_are_read_from_the_failure_and_need_a_lookup() {
        let text = "E   OSError: libgobject-2.0.so.0: cannot open shared object file: No such file or directory";
        assert_eq!(missing_sonames(text), ["libgobject-2.0.so.0"]);
        // Without the Contents index the rule proposes nothing rather than guess.
        assert!(propose(text, &ctx(), &[])
            .iter()
            .all(|p| p.rule_id != "shared-library-missing"));
    }

    #[test]
    fn unknown_failures_get_no_proposal() {
        assert!(propose("AssertionError: expected 3, got 4", &ctx(), &[]).is_empty());
        assert!(propose(
            "fatal error: somethingobscure.h: No such file or directory",
            &ctx(),
            &[]
        )
        .is_empty());
    }
}
