//! Third-party modules a `conftest.py` imports at module level.
//!
//! pytest imports every `conftest.py` before it collects a single test, so
//! an import there that fails stops collection as a whole. Test-only
//! dependencies are often declared nowhere the planner reads (httpx 0.27's
//! sdist: `trustme`, `uvicorn`, `trio`), and the repair that installs one
//! missing module per attempt runs out of attempts. The planner installs
//! what the conftests import up front instead, mapped to distributions
//! through the shipped import table.
//!
//! Only unconditional imports count: a statement at column 0. One under
//! `try:`, `if TYPE_CHECKING:` or inside a function is indented, and so is
//! left to the repair should collection need it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::Files;

const STDLIB: &str = include_str!("../../data/stdlib-modules.txt");

fn stdlib() -> &'static BTreeSet<&'static str> {
    static S: OnceLock<BTreeSet<&'static str>> = OnceLock::new();
    S.get_or_init(|| {
        STDLIB
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    })
}

/// Top-level modules of the column-0 `import` / `from … import` statements.
pub(super) fn top_level_imports(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |m: &str| {
        let top = m.trim().split('.').next().unwrap_or("").to_string();
        let ok = !top.is_empty()
            && top.len() <= 80
            && top.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !top.starts_with(|c: char| c.is_ascii_digit());
        if ok && !out.contains(&top) {
            out.push(top);
        }
    };
    // A parenthesised or backslash-continued import is read on its first line
    // only: the module is there.
    for line in text.lines().take(2000) {
        let line = line.split('#').next().unwrap_or("");
        if let Some(rest) = line.strip_prefix("import ") {
            for part in rest.split(',') {
                push(part.split_whitespace().next().unwrap_or(""));
            }
        } else if let Some(rest) = line.strip_prefix("from ") {
            let module = rest.split_whitespace().next().unwrap_or("");
            if !module.starts_with('.') && rest.contains(" import") {
                push(module);
            }
        }
    }
    out
}

/// A module a conftest imports unconditionally, and the distribution that
/// provides it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConftestImport {
    /// The top-level module (`uvicorn`), checked with an import before the
    /// distribution is installed.
    pub module: String,
    pub distribution: String,
    /// `tests/conftest.py: import uvicorn`.
    pub because: String,
}

/// Whether `module` is the repository's own: next to the conftest, at the
/// root (a directory with or without `__init__.py`), a known package dir, or
/// any directory or `.py` of that name three levels deep (a helper put on
/// the path by pytest's `pythonpath`). Installing a name from the index
/// that is in fact a local helper would pull in a stranger's package.
fn is_local(
    root: &Path,
    names: &BTreeSet<String>,
    conftest_dir: &Path,
    module: &str,
    is_local: &dyn Fn(&str) -> bool,
) -> bool {
    is_local(module)
        || names.contains(module)
        || [conftest_dir, root]
            .iter()
            .any(|d| d.join(module).is_dir() || d.join(format!("{module}.py")).is_file())
}

/// The names of the directories and `.py` modules three levels deep, read
/// once for every import checked (paths relative to the root: the
/// checkout's own directory name is not one of them).
fn local_names(f: &Files) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rel in f.find(3, &|p| p.is_file()) {
        let path = Path::new(&rel);
        if let Some(stem) = rel
            .strip_suffix(".py")
            .and_then(|r| Path::new(r).file_name())
        {
            out.insert(stem.to_string_lossy().into_owned());
        }
        for dir in path.ancestors().skip(1) {
            if let Some(n) = dir.file_name() {
                out.insert(n.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// A distribution name safe to put on a command line unquoted.
fn plain_name(d: &str) -> bool {
    !d.is_empty()
        && d.len() <= 100
        && d.starts_with(|c: char| c.is_ascii_alphanumeric())
        && d.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// The distributions the conftests' unconditional imports need, with why.
/// `declared`: distribution names already installed by the plan.
pub(super) fn needed(
    f: &Files,
    declared: &BTreeSet<String>,
    is_local_module: &dyn Fn(&str) -> bool,
) -> Vec<ConftestImport> {
    let mut out: Vec<ConftestImport> = Vec::new();
    let names = local_names(f);
    for rel in f.find(3, &|p| p.file_name().is_some_and(|n| n == "conftest.py")) {
        // The path goes into a comment of the script: printable ASCII only.
        if !rel.chars().all(|c| c.is_ascii_graphic()) {
            continue;
        }
        let Some(text) = f.read(&rel) else { continue };
        let path = f.root().join(&rel);
        let dir = path.parent().unwrap_or(f.root());
        for m in top_level_imports(&text) {
            // A namespace (`google`, `azure`) names no distribution of its own.
            if stdlib().contains(m.as_str())
                || matches!(
                    m.as_str(),
                    "pytest" | "_pytest" | "conftest" | "tests" | "test"
                )
                || crate::module_dists::is_namespace(&m)
                || is_local(f.root(), &names, dir, &m, is_local_module)
            {
                continue;
            }
            let dist = crate::module_dists::distribution_or_own(&m);
            let key = super::requirement_name(&dist);
            if !plain_name(&dist)
                || key.as_ref().is_some_and(|k| declared.contains(k))
                || out
                    .iter()
                    .any(|n| super::requirement_name(&n.distribution) == key)
            {
                continue;
            }
            out.push(ConftestImport {
                because: format!("{rel}: import {m}"),
                module: m,
                distribution: dist,
            });
        }
    }
    out
}

/// The third-party modules a test module of the repository imports at
/// column 0, for the repair of a collection that stopped at the first one
/// missing (img2pdf's test module imports numpy, then scipy: collection
/// names one per attempt). `rel` comes from the build container's output:
/// it is read only when it resolves to a file inside `root`.
pub fn third_party_imports_of(root: &Path, rel: &str, import_name: Option<&str>) -> Vec<String> {
    imports_of(root, rel, import_name, false)
}

/// The third-party modules a file of the project's own package imports at
/// column 0. An absolute import there resolves on `sys.path` only: a module
/// next to the file, or one of that name deeper in the tree, is not it
/// (cattrs's `preconf/msgpack.py` imports the index's `msgpack`).
pub fn third_party_imports_of_package_file(
    root: &Path,
    rel: &str,
    import_name: Option<&str>,
) -> Vec<String> {
    imports_of(root, rel, import_name, true)
}

/// A `.py` file of the repository named by a path from the build's output
/// (untrusted): read only when it resolves, symlinks followed, to a regular
/// file inside `root` of at most 1 MiB. The canonical root, path and text.
fn read_repo_python_file(root: &Path, rel: &str) -> Option<(PathBuf, PathBuf, String)> {
    if rel.split('/').any(|c| c == "..") || !rel.ends_with(".py") || Path::new(rel).is_absolute() {
        return None;
    }
    let root = root.canonicalize().ok()?;
    let path = root.join(rel).canonicalize().ok()?;
    if !path.starts_with(&root) {
        return None;
    }
    let meta = fs_err::metadata(&path).ok()?;
    if !meta.is_file() || meta.len() > 1 << 20 {
        return None;
    }
    // host-owned: the user's repository on the host (builds get a copy, never a
    // mount); the untrusted name was confined to it above.
    let text = fs_err::read_to_string(&path).ok()?;
    Some((root, path, text))
}

fn imports_of(
    root: &Path,
    rel: &str,
    import_name: Option<&str>,
    package_file: bool,
) -> Vec<String> {
    let Some((root, path, text)) = read_repo_python_file(root, rel) else {
        return Vec::new();
    };
    let names = if package_file {
        BTreeSet::new()
    } else {
        local_names(&Files::new(&root))
    };
    // `is_local` looks beside the file and at the root: for a package file,
    // the other place on `sys.path` is `src/`, not the file's directory.
    let dir = if package_file {
        root.join("src")
    } else {
        path.parent().unwrap_or(&root).to_path_buf()
    };
    let own = |m: &str| super::is_local_module(&root, import_name, m);
    top_level_imports(&text)
        .into_iter()
        .filter(|m| {
            !stdlib().contains(m.as_str())
                && !matches!(
                    m.as_str(),
                    "pytest" | "_pytest" | "conftest" | "tests" | "test"
                )
                && !crate::module_dists::is_namespace(m)
                && !is_local(&root, &names, &dir, m, &own)
        })
        .collect()
}

/// The files of the project's own package that a test module imports at
/// column 0 (`from cattrs.preconf.bson import …` is
/// `src/cattrs/preconf/bson.py`): an optional dependency those import is one
/// more the collection needs, named one per attempt otherwise. `rel` is
/// read as `third_party_imports_of` reads it; the files returned exist.
pub fn own_files_imported_by(root: &Path, rel: &str, import_name: Option<&str>) -> Vec<String> {
    let Some(own) = import_name else {
        return Vec::new();
    };
    let Some((root, _, text)) = read_repo_python_file(root, rel) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for line in text.lines().take(2000) {
        let line = line.split('#').next().unwrap_or("");
        // `from pkg.preconf import bson`: `bson` may be a module of its own.
        let mut names: Vec<&str> = Vec::new();
        let module = if let Some(rest) = line.strip_prefix("from ") {
            if let Some((_, imported)) = rest.split_once(" import ") {
                names = imported
                    .trim_start_matches(['(', ' '])
                    .split(',')
                    .filter_map(|n| n.split_whitespace().next())
                    .collect();
            }
            rest.split_whitespace().next().unwrap_or("")
        } else if let Some(rest) = line.strip_prefix("import ") {
            rest.split([',', ' ']).next().unwrap_or("")
        } else {
            continue;
        };
        let parts: Vec<&str> = module.split('.').collect();
        if parts.first() != Some(&own)
            || parts.len() > 8
            || !parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            continue;
        }
        let path = parts.join("/");
        let mut found = |candidates: [String; 2]| {
            for candidate in candidates {
                if root.join(&candidate).is_file() {
                    if !out.contains(&candidate) {
                        out.push(candidate);
                    }
                    return true;
                }
            }
            false
        };
        if !found([format!("src/{path}.py"), format!("{path}.py")]) {
            found([
                format!("src/{path}/__init__.py"),
                format!("{path}/__init__.py"),
            ]);
            for n in names
                .iter()
                .filter(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                .take(16)
            {
                found([format!("src/{path}/{n}.py"), format!("{path}/{n}.py")]);
            }
        }
        if out.len() >= 32 {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn httpx_conftest_needs_trustme_cryptography_and_uvicorn() {
        // httpx 0.27.0's tests/conftest.py, its imports verbatim.
        let conftest = "import asyncio\nimport json\nimport os\nimport threading\nimport time\nimport typing\n\nimport pytest\nimport trustme\nfrom cryptography.hazmat.backends import default_backend\nfrom cryptography.hazmat.primitives.serialization import (\n    BestAvailableEncryption,\n)\nfrom uvicorn.config import Config\nfrom uvicorn.server import Server\n\nimport httpx\nfrom tests.concurrency import sleep\n\ntry:\n    import brotli\nexcept ImportError:\n    pass\n\ndef f():\n    import yaml\n";
        let d = tempfile::tempdir().unwrap();
        fs_err::create_dir_all(d.path().join("tests")).unwrap();
        fs_err::create_dir_all(d.path().join("httpx")).unwrap();
        fs_err::write(d.path().join("httpx/__init__.py"), "").unwrap();
        fs_err::write(d.path().join("tests/conftest.py"), conftest).unwrap();
        fs_err::write(d.path().join("tests/concurrency.py"), "").unwrap();
        let declared: BTreeSet<String> = ["cryptography".to_string()].into();
        let got = needed(&Files::new(d.path()), &declared, &|m| m == "httpx");
        let dists: Vec<&str> = got.iter().map(|n| n.distribution.as_str()).collect();
        assert_eq!(dists, ["trustme", "uvicorn"]);
        assert_eq!(got[0].because, "tests/conftest.py: import trustme");
        // Without the declaration, cryptography is needed too.
        let got = needed(&Files::new(d.path()), &BTreeSet::new(), &|m| m == "httpx");
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn a_test_module_names_all_it_imports_and_only_inside_the_repository() {
        let d = tempfile::tempdir().unwrap();
        fs_err::create_dir_all(d.path().join("src")).unwrap();
        // img2pdf 0.5.1's src/img2pdf_test.py, its first imports.
        fs_err::write(
            d.path().join("src/img2pdf_test.py"),
            "import numpy\nimport scipy.signal\nimport zlib\nimport pytest\nimport img2pdf\nfrom PIL import Image\n",
        )
        .unwrap();
        fs_err::write(d.path().join("src/img2pdf.py"), "").unwrap();
        assert_eq!(
            third_party_imports_of(d.path(), "src/img2pdf_test.py", None),
            ["numpy", "scipy", "PIL"]
        );
        assert!(third_party_imports_of(d.path(), "../etc/passwd.py", None).is_empty());
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("x.py"), "import numpy\n").unwrap();
        std::os::unix::fs::symlink(outside.path().join("x.py"), d.path().join("link.py")).unwrap();
        assert!(third_party_imports_of(d.path(), "link.py", None).is_empty());
    }

    #[test]
    fn import_names_map_to_distributions_and_odd_lines_are_skipped() {
        assert_eq!(
            top_level_imports("import yaml, attr as a\nfrom . import x\nfrom .y import z\nimport 9bad\nfrom PIL import Image\n"),
            ["yaml", "attr", "PIL"]
        );
        let d = tempfile::tempdir().unwrap();
        fs_err::write(
            d.path().join("conftest.py"),
            "import yaml\nfrom PIL import Image\nimport xdist\n",
        )
        .unwrap();
        let got = needed(&Files::new(d.path()), &BTreeSet::new(), &|_| false);
        let dists: Vec<&str> = got.iter().map(|n| n.distribution.as_str()).collect();
        assert_eq!(dists, ["PyYAML", "pillow", "pytest-xdist"]);
    }
}
