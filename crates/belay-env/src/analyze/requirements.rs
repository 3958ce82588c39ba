//! Requirements files, and the paths in them.
//!
//! pip reads `-e ../pkg/core` (and a bare `./pkg`) relative to the working
//! directory, not to the file that names it, so a monorepo's
//! `services/api/requirements.txt` fails from the repository root with "is
//! not a valid editable requirement". The files are read here, and a file
//! whose paths are relative to itself is handed to the installer as its
//! lines, every path resolved under the repository, so that one resolver
//! call sees the local packages and the rest together (which also installs
//! them in dependency order).

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Files;
use crate::REPO_DIR;

/// A requirements file, relative to the repository root.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RequirementFile {
    pub path: String,
    /// When the file (or one it includes) names paths relative to itself:
    /// the installer's arguments for it, with those paths resolved in the
    /// build container. Empty: pass `-r <path>` as it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolved: Vec<String>,
    /// The requirement lines of the file and those it includes (for the
    /// dependency names).
    #[serde(skip)]
    pub lines: Vec<String>,
}

/// Options that take a value, in their long and short spellings.
const VALUE_OPTIONS: &[&str] = &[
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "--trusted-host",
    "--no-binary",
    "--only-binary",
];

/// One logical line: continuations joined, the comment dropped.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for raw in text.lines() {
        let line = match raw.find(" #").or_else(|| raw.starts_with('#').then_some(0)) {
            Some(i) => &raw[..i],
            None => raw,
        };
        if let Some(stripped) = line.trim_end().strip_suffix('\\') {
            cur.push_str(stripped);
            cur.push(' ');
            continue;
        }
        cur.push_str(line);
        let l = cur.trim().to_string();
        cur.clear();
        if !l.is_empty() {
            out.push(l);
        }
    }
    let l = cur.trim();
    if !l.is_empty() {
        out.push(l.to_string());
    }
    out
}

/// `rel` joined to `dir` and normalised; `None` when it leaves the repository.
fn under_repo(dir: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in dir.join(rel).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn container_path(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        REPO_DIR.to_string()
    } else {
        format!("{REPO_DIR}/{}", rel.to_string_lossy())
    }
}

/// Whether a requirement names a local path (not a distribution or a URL).
fn is_local_path(s: &str) -> bool {
    s.starts_with("./") || s.starts_with("../") || s == "." || s == ".." || s.starts_with("file:")
}

struct Reader<'a> {
    f: &'a Files,
    warnings: &'a mut Vec<String>,
    /// Some line named a path relative to its file's directory, outside the root.
    relative: bool,
    /// Some line carries a hash (pip accepts `--hash` only in files).
    hashed: bool,
    /// The project's own distribution name (normalized), when it is
    /// installed from the checkout.
    own: Option<&'a str>,
    /// The lines that pinned the project itself, dropped.
    own_pins: Vec<String>,
    seen: Vec<PathBuf>,
}

impl Reader<'_> {
    /// The installer arguments of `file` (relative to the root), its
    /// includes expanded in place.
    fn read(&mut self, file: &Path, args: &mut Vec<String>, lines: &mut Vec<String>) {
        if self.seen.iter().any(|s| s == file) || self.seen.len() > 50 {
            return;
        }
        self.seen.push(file.to_path_buf());
        let Some(text) = self.f.read(&file.to_string_lossy()) else {
            self.warnings.push(format!(
                "{}: cannot be read (named by a requirements file)",
                file.display()
            ));
            return;
        };
        let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let outside_root = !dir.as_os_str().is_empty();
        for line in logical_lines(&text) {
            if line.contains("--hash") {
                self.hashed = true;
            }
            let (opt, value) = split_option(&line);
            match opt.as_deref() {
                Some("-r" | "--requirement" | "-c" | "--constraint") => {
                    let Some(v) = value else { continue };
                    if v.contains("://") {
                        args.extend([norm_opt(opt.as_deref()), v]);
                        continue;
                    }
                    match under_repo(&dir, &v) {
                        Some(inc) if matches!(opt.as_deref(), Some("-r" | "--requirement")) => {
                            self.relative |= outside_root;
                            self.read(&inc, args, lines);
                        }
                        Some(inc) => {
                            self.relative |= outside_root;
                            args.extend(["-c".to_string(), container_path(&inc)]);
                        }
                        None => self.outside(file, &v),
                    }
                }
                Some("-e" | "--editable") => {
                    let Some(v) = value else { continue };
                    if is_local_path(&v) {
                        let (p, extras) = local_parts(&v);
                        match self.local_project(&dir, p) {
                            Some(r) => {
                                self.relative |= outside_root;
                                args.extend([
                                    "-e".to_string(),
                                    format!("{}{extras}", container_path(&r)),
                                ]);
                            }
                            None => self.outside(file, &v),
                        }
                    } else {
                        lines.push(v.clone());
                        args.extend(["-e".to_string(), v]);
                    }
                }
                Some(o) if VALUE_OPTIONS.contains(&o) => {
                    let Some(v) = value else { continue };
                    let v = if matches!(o, "-f" | "--find-links") && !v.contains("://") {
                        match under_repo(&dir, &v) {
                            Some(r) => {
                                self.relative |= outside_root;
                                container_path(&r)
                            }
                            None => v,
                        }
                    } else {
                        v
                    };
                    args.extend([o.to_string(), v]);
                }
                Some(o) => args.push(o.to_string()),
                None => {
                    if is_local_path(&line) {
                        let (p, extras) = local_parts(&line);
                        match self.local_project(&dir, p) {
                            Some(r) => {
                                self.relative |= outside_root;
                                args.push(format!("{}{extras}", container_path(&r)));
                            }
                            None => self.outside(file, &line),
                        }
                    } else if let Some((name, url)) = line.split_once(" @ file:") {
                        // `name @ file:../x` (PEP 508 with a relative file URL).
                        match under_repo(&dir, url.trim()) {
                            Some(r) => {
                                self.relative |= outside_root;
                                args.push(format!(
                                    "{} @ file://{}",
                                    name.trim(),
                                    container_path(&r)
                                ));
                            }
                            None => self.outside(file, &line),
                        }
                    } else if self.own.is_some()
                        && super::requirement_name(&line).as_deref() == self.own
                    {
                        self.own_pins.push(line);
                    } else {
                        lines.push(line.clone());
                        args.push(line);
                    }
                }
            }
        }
    }

    /// Where a local path of a file in `dir` points. pip reads it from the
    /// working directory, and authors write it either way: relative to the
    /// file (a monorepo's `-e ../pkg/core`) or to the root (multidict's
    /// `requirements/ci.txt` says `-e .` for the project). The one that is a
    /// Python project wins, the file's own reading first.
    fn local_project(&self, dir: &Path, p: &str) -> Option<PathBuf> {
        let is_project = |r: &Path| {
            ["pyproject.toml", "setup.py", "setup.cfg"]
                .iter()
                .any(|m| self.f.exists(&r.join(m).to_string_lossy()))
        };
        let by_file = under_repo(dir, p);
        if by_file.as_deref().is_some_and(is_project) {
            return by_file;
        }
        match under_repo(Path::new(""), p) {
            Some(r) if is_project(&r) => Some(r),
            _ => by_file,
        }
    }

    fn outside(&mut self, file: &Path, v: &str) {
        self.warnings.push(format!(
            "{}: `{v}` is outside the repository; it is passed as written",
            file.display()
        ));
    }
}

/// A local requirement's path and extras: `file:.#egg=jsonschema` (what
/// pip-compile writes for `file:.`) is `.`, `./pkg[test]` is `./pkg` with
/// `[test]`. The URL fragment names the egg, which pip reads from the
/// project itself.
fn local_parts(v: &str) -> (&str, &str) {
    let v = v
        .strip_prefix("file://")
        .or_else(|| v.strip_prefix("file:"))
        .unwrap_or(v);
    let v = v.split('#').next().unwrap_or(v);
    match v.find('[') {
        Some(i) if v.ends_with(']') => (&v[..i], &v[i..]),
        _ => (v, ""),
    }
}

fn norm_opt(o: Option<&str>) -> String {
    match o {
        Some("--requirement") => "-r".into(),
        Some("--constraint") => "-c".into(),
        Some(o) => o.to_string(),
        None => String::new(),
    }
}

/// `-e ../x`, `-e../x`, `--editable=../x`, `--pre` -> (option, value).
fn split_option(line: &str) -> (Option<String>, Option<String>) {
    if !line.starts_with('-') {
        return (None, None);
    }
    if let Some(rest) = line.strip_prefix("--") {
        let (name, value) = match rest.split_once(['=', ' ', '\t']) {
            Some((n, v)) => (n, Some(v.trim().to_string())),
            None => (rest, None),
        };
        return (Some(format!("--{name}")), value.filter(|v| !v.is_empty()));
    }
    let opt: String = line.chars().take(2).collect();
    let value = line[opt.len()..].trim().to_string();
    (Some(opt), (!value.is_empty()).then_some(value))
}

/// Read each requirements file (relative to the root).
///
/// `own` is the project's distribution name when the project is installed
/// from the checkout: a line that pins it (`click==8.1.3` in click's own
/// pip-compiled `requirements/dev.txt`) makes the one resolver call
/// unsatisfiable, so the file is handed over as its lines without it.
pub(super) fn read_all(
    f: &Files,
    paths: &[String],
    own: Option<&str>,
    warnings: &mut Vec<String>,
) -> Vec<RequirementFile> {
    let mut out = Vec::new();
    for p in paths {
        let mut args = Vec::new();
        let mut lines = Vec::new();
        let mut r = Reader {
            f,
            warnings,
            relative: false,
            hashed: false,
            own,
            own_pins: Vec::new(),
            seen: Vec::new(),
        };
        r.read(Path::new(p), &mut args, &mut lines);
        let inline = r.relative || !r.own_pins.is_empty();
        if !r.own_pins.is_empty() && !r.hashed {
            r.warnings.push(format!(
                "{p}: `{}` pins the project itself, which is installed from the checkout; that line is left out",
                r.own_pins.join("`, `")
            ));
        }
        let resolved = if inline && r.hashed {
            r.warnings.push(format!(
                "{p}: names paths relative to itself and pins hashes; pip takes hashes only from the file, so it is passed as written"
            ));
            Vec::new()
        } else if inline {
            args
        } else {
            Vec::new()
        };
        out.push(RequirementFile {
            path: p.clone(),
            resolved,
            lines,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, text) in files {
            let path = d.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        d
    }

    #[test]
    fn paths_relative_to_a_nested_file_are_resolved_under_the_repository() {
        let d = repo(&[
            (
                "services/api/requirements.txt",
                "-r ../../common/base.txt\n-e ../../pkg/core\n../../pkg/util  # a bare path\nrequests>=2 ; python_version >= \"3.8\"\n",
            ),
            ("common/base.txt", "-e ../pkg/models\nclick==8.1.7\n"),
        ]);
        let mut w = Vec::new();
        let got = read_all(
            &Files::new(d.path()),
            &["services/api/requirements.txt".into()],
            None,
            &mut w,
        );
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            got[0].resolved,
            [
                "-e",
                "/workspace/repo/pkg/models",
                "click==8.1.7",
                "-e",
                "/workspace/repo/pkg/core",
                "/workspace/repo/pkg/util",
                "requests>=2 ; python_version >= \"3.8\"",
            ]
        );
        assert_eq!(
            got[0].lines,
            ["click==8.1.7", "requests>=2 ; python_version >= \"3.8\""]
        );
    }

    #[test]
    fn a_root_file_and_plain_requirements_pass_as_written() {
        let d = repo(&[
            ("requirements.txt", "-e .\n-r requirements/test.txt\nsix\n"),
            ("requirements/test.txt", "pytest\n"),
        ]);
        let mut w = Vec::new();
        let got = read_all(
            &Files::new(d.path()),
            &["requirements.txt".into()],
            None,
            &mut w,
        );
        assert!(got[0].resolved.is_empty());
        assert_eq!(got[0].lines, ["pytest", "six"]);
    }

    #[test]
    fn hashes_and_escapes_are_left_alone_with_a_warning() {
        let d = repo(&[(
            "sub/requirements.txt",
            "-e ../../../etc\nsix==1.16.0 \\\n    --hash=sha256:abc\n-e ../lib\n",
        )]);
        let mut w = Vec::new();
        let got = read_all(
            &Files::new(d.path()),
            &["sub/requirements.txt".into()],
            None,
            &mut w,
        );
        assert!(got[0].resolved.is_empty());
        assert!(
            w.iter().any(|m| m.contains("outside the repository")),
            "{w:?}"
        );
        assert!(w.iter().any(|m| m.contains("pins hashes")), "{w:?}");
    }

    #[test]
    fn a_pin_of_the_project_itself_is_left_out() {
        let d = repo(&[
            (
                "requirements/dev.txt",
                "# pip-compile output\nclick==8.1.3\ncolorama==0.4.6\n-r tests.txt\n",
            ),
            ("requirements/tests.txt", "pytest==7.4.0\n"),
        ]);
        let mut w = Vec::new();
        let got = read_all(
            &Files::new(d.path()),
            &["requirements/dev.txt".into()],
            Some("click"),
            &mut w,
        );
        assert_eq!(got[0].resolved, ["colorama==0.4.6", "pytest==7.4.0"]);
        assert!(
            w.iter()
                .any(|m| m.contains("`click==8.1.3` pins the project itself")),
            "{w:?}"
        );
        // A root file that pins another project is passed as written.
        let d = repo(&[("requirements.txt", "click==8.1.3\n")]);
        let got = read_all(
            &Files::new(d.path()),
            &["requirements.txt".into()],
            Some("flask"),
            &mut w,
        );
        assert!(got[0].resolved.is_empty(), "{:?}", got[0].resolved);
    }

    #[test]
    fn a_path_that_is_a_project_only_from_the_root_is_read_from_the_root() {
        // multidict 6.0.5: requirements/ci.txt has `-e .` for the project.
        let d = repo(&[
            (
                "setup.py",
                "from setuptools import setup\nsetup(name='multidict')\n",
            ),
            ("requirements/ci.txt", "-e .\n-r pytest.txt\n"),
            ("requirements/pytest.txt", "pytest==7.4.4\n"),
            ("services/api/requirements.txt", "-e ../../libs/core\n"),
            ("libs/core/pyproject.toml", "[project]\nname = 'core'\n"),
        ]);
        let f = Files::new(d.path());
        let mut w = Vec::new();
        let files = [
            "requirements/ci.txt".to_string(),
            "services/api/requirements.txt".to_string(),
        ];
        let got = read_all(&f, &files, None, &mut w);
        assert_eq!(
            got[0].resolved,
            ["-e", "/workspace/repo", "pytest==7.4.4"],
            "{w:?}"
        );
        assert_eq!(got[1].resolved, ["-e", "/workspace/repo/libs/core"]);
    }

    #[test]
    fn a_pip_compile_file_url_of_the_root_is_the_project() {
        // jsonschema 4.23.0's docs/requirements.txt (pip-compile run at the root).
        let d = repo(&[
            ("pyproject.toml", "[project]\nname = \"jsonschema\"\n"),
            (
                "docs/requirements.txt",
                "alabaster==0.7.16\nfile:.#egg=jsonschema\n    # via -r docs/requirements.in\n./plugins/extra[test]\n",
            ),
            ("plugins/extra/setup.py", ""),
        ]);
        let f = Files::new(d.path());
        let mut w = Vec::new();
        let got = read_all(&f, &["docs/requirements.txt".to_string()], None, &mut w);
        let args = &got[0].resolved;
        assert!(args.contains(&"/workspace/repo".to_string()), "{args:?}");
        assert!(
            args.contains(&"/workspace/repo/plugins/extra[test]".to_string()),
            "{args:?}"
        );
        assert!(
            !args
                .iter()
                .any(|a| a.contains("#egg") || a.contains("docs/.")),
            "{args:?}"
        );
    }

    #[test]
    fn include_cycles_end() {
        let d = repo(&[
            ("a/r.txt", "-r ../b/r.txt\nx\n"),
            ("b/r.txt", "-r ../a/r.txt\ny\n"),
        ]);
        let mut w = Vec::new();
        let got = read_all(&Files::new(d.path()), &["a/r.txt".into()], None, &mut w);
        assert_eq!(got[0].lines, ["y", "x"]);
    }

    proptest::proptest! {
        #[test]
        fn reading_never_panics(text in ".{0,300}") {
            let d = repo(&[("sub/requirements.txt", &text)]);
            let mut w = Vec::new();
            let _ = read_all(&Files::new(d.path()), &["sub/requirements.txt".into()], None, &mut w);
        }
    }
}
