//! Failures no repair can fix, named for what they are.
//!
//! A test suite that reaches the network while pytest collects it (a
//! conftest that downloads a fixture, a module that resolves a host at
//! import) cannot collect offline, and the Repo2Run criterion runs offline.
//! No rule can repair that, and "no repair rule matches" would hide it: it is
//! classified, with the host, in the manifest and the batch summary.

use std::path::Path;
use std::sync::OnceLock;

use regex::Regex;

/// The class of a network need at collection time.
pub const NETWORK_AT_COLLECTION: &str = "needs-network-at-collection";
/// The class of a source archive that lacks a file its tests read (a
/// crate packaged without its test data, an sdist without its fixtures).
pub const SOURCE_INCOMPLETE: &str = "source-incomplete";
/// The class of a suite that opens a window (or connects to an X server)
/// while pytest imports it: the build container has no display.
pub const DISPLAY_AT_COLLECTION: &str = "needs-display-at-collection";

/// A failure's class and what to say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    pub class: &'static str,
    /// `needs network at collection: host example.org`
    pub detail: String,
}

fn re(cell: &'static OnceLock<Option<Regex>>, pattern: &str) -> Option<&'static Regex> {
    cell.get_or_init(|| Regex::new(pattern).ok()).as_ref()
}

/// Markers that pytest was collecting (or importing a conftest) when it failed.
fn collecting(text: &str) -> bool {
    static R: OnceLock<Option<Regex>> = OnceLock::new();
    re(
        &R,
        r"(?m)ERROR collecting|errors? during collection|ImportError while loading conftest|ImportError while importing test module|Interrupted: \d+ errors? during collection|^collecting \.\.\.",
    )
    .is_some_and(|r| r.is_match(text))
}

/// A network error, and the host it names when it names one.
fn network_error(text: &str) -> Option<Option<String>> {
    static ERR: OnceLock<Option<Regex>> = OnceLock::new();
    static HOST: OnceLock<Option<Regex>> = OnceLock::new();
    let err = re(
        &ERR,
        r"Temporary failure in name resolution|Name or service not known|nodename nor servname|No address associated with hostname|Failed to establish a new connection|Network is unreachable|Connection refused|getaddrinfo failed|socket\.gaierror|urlopen error|Could not resolve host|NameResolutionError|ConnectTimeout|ConnectionError: HTTP|Max retries exceeded with url|httpx\.ConnectError|ClientConnectorError|SocketBlockedError",
    )?;
    let hit = err.find_iter(text).last()?;
    let host = re(
        &HOST,
        r#"host='([\w.-]+)'|Failed to resolve '([\w.-]+)'|Could not resolve host:? '?([\w.-]+)|Cannot connect to host ([\w.-]+)|for url: https?://([\w.-]+)|https?://([\w.-]+)"#,
    )?;
    // The host nearest before the error, else the first one after it.
    let before = &text[..hit.end().min(text.len())];
    let pick = |c: regex::Captures| {
        c.iter()
            .skip(1)
            .flatten()
            .next()
            .map(|m| m.as_str().to_string())
    };
    let found = host
        .captures_iter(before)
        .last()
        .and_then(pick)
        .or_else(|| {
            host.captures_iter(&text[hit.start()..])
                .next()
                .and_then(pick)
        });
    Some(found.filter(|h| !matches!(h.as_str(), "localhost" | "127.0.0.1")))
}

/// A GUI toolkit that found no display, and the error that says so.
fn display_error(text: &str) -> Option<String> {
    static R: OnceLock<Option<Regex>> = OnceLock::new();
    let r = re(
        &R,
        r#"(?m)^E?\s*([\w.]*NoSuchDisplayException: [^\n]{0,120}|[\w.]*TclError: no display name[^\n]{0,80}|[^\n]{0,60}cannot connect to X server[^\n]{0,60}|[^\n]{0,60}could not connect to display[^\n]{0,60}|Gtk-WARNING \*\*: [^\n]{0,40}cannot open display[^\n]{0,60}|[\w.]*(?:DisplayConnectionError|DisplayNameError)[^\n]{0,120}|[^\n]{0,60}Can't connect to display[^\n]{0,60})"#,
    )?;
    r.captures_iter(text)
        .last()
        .map(|c| c[1].trim().to_string())
}

/// A file of the repository's own source that the tests read and the
/// archive does not have: rustc's `couldn't read `src/x.txt`` (an
/// `include_str!`), or Python's FileNotFoundError on a path in the
/// checkout (not in the environments under it), while collecting.
fn missing_source_file(text: &str, collecting: bool) -> Option<String> {
    static RUST: OnceLock<Option<Regex>> = OnceLock::new();
    static PY: OnceLock<Option<Regex>> = OnceLock::new();
    if let Some(c) = re(
        &RUST,
        r"(?m)^error: couldn't read `([^`\n]{1,300})`: No such file or directory",
    )?
    .captures(text)
    {
        // The crate's own source: relative to it, or in the checkout but
        // not in `target/` (a build script's output is the environment's).
        let path = c[1].to_string();
        let rel = path.strip_prefix("/workspace/repo/").unwrap_or(&path);
        if !rel.starts_with('/') && !rel.starts_with("target/") && !rel.contains("/target/") {
            return Some(path);
        }
    }
    if !collecting {
        return None;
    }
    let c = re(
        &PY,
        r"FileNotFoundError: \[Errno 2\] No such file or directory: '/workspace/repo/([^'\n]{1,300})'",
    )?
    .captures(text)?;
    let rel = c[1].to_string();
    let first = rel.split('/').next().unwrap_or("");
    let env = [
        ".venv",
        "venv",
        "node_modules",
        "build",
        "target",
        "dist",
        ".tox",
        ".nox",
        ".eggs",
    ];
    (!env.contains(&first) && !first.ends_with(".egg-info")).then_some(rel)
}

/// The class of a failure that repair cannot fix, when it has one.
pub fn classify(text: &str) -> Option<Classified> {
    let collecting = collecting(text);
    // A download that failed at collection explains a file missing after it.
    let network = collecting.then(|| network_error(text)).flatten();
    if let (None, Some(path)) = (&network, missing_source_file(text, collecting)) {
        return Some(Classified {
            class: SOURCE_INCOMPLETE,
            detail: format!(
                "the source lacks a file its tests read: {path} (not in the archive; no environment can supply it)"
            ),
        });
    }
    if !collecting {
        return None;
    }
    if let Some(err) = display_error(text) {
        return Some(Classified {
            class: DISPLAY_AT_COLLECTION,
            detail: format!(
                "needs a display at collection: the build container has no X server ({err})"
            ),
        });
    }
    let host = network?;
    Some(Classified {
        class: NETWORK_AT_COLLECTION,
        detail: match host {
            Some(h) => format!("needs network at collection: host {h}"),
            None => "needs network at collection: host not named in the error".to_string(),
        },
    })
}

/// `classify`, and a test helper module the archive lacks, which only the
/// checkout can tell: hass-nabucasa's sdist ships `tests/test_*.py` without
/// `tests/common.py` or `tests/utils/` ("No module named 'tests.utils'",
/// "attempted relative import" for `from .common import …`). Read only in
/// `repo`; a module that exists there is some other failure.
pub fn classify_in(text: &str, repo: &Path) -> Option<Classified> {
    if let Some(c) = classify(text) {
        return Some(c);
    }
    if !collecting(text) {
        return None;
    }
    let path = missing_test_module(text, repo)?;
    Some(Classified {
        class: SOURCE_INCOMPLETE,
        detail: format!(
            "the source lacks a module its tests import: {path} (not in the archive; no environment can supply it)"
        ),
    })
}

fn missing_test_module(text: &str, repo: &Path) -> Option<String> {
    static ABS: OnceLock<Option<Regex>> = OnceLock::new();
    static REL: OnceLock<Option<Regex>> = OnceLock::new();
    let safe = |p: &str| {
        !p.is_empty()
            && p.len() <= 300
            && !p.starts_with('/')
            && p.split('/').all(|c| !c.is_empty() && c != "..")
    };
    let absent = |base: &str| {
        safe(base)
            && !repo.join(base).exists()
            && !repo.join(format!("{base}.py")).exists()
            && !repo.join(format!("src/{base}")).exists()
            && !repo.join(format!("src/{base}.py")).exists()
    };
    // `tests.utils`, where the repository has a `tests` directory.
    if let Some(r) = re(&ABS, r"No module named '((?:tests?|testing)\.[\w.]+)'") {
        for c in r.captures_iter(text) {
            let module = &c[1];
            let top = module.split('.').next().unwrap_or("");
            let base = module.replace('.', "/");
            if repo.join(top).is_dir() && absent(&base) {
                return Some(base);
            }
        }
    }
    // `from .common import X` in a test module, next to which there is no
    // `common.py`.
    let r = re(
        &REL,
        r"(?m)^([\w/.-]+\.py):\d+: in <module>\n\s+from \.(\w+) import[^\n]*\nE\s+(?:ImportError: attempted relative import|ModuleNotFoundError: No module named)",
    )?;
    for c in r.captures_iter(text) {
        let file = &c[1];
        let dir = file.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        let base = if dir.is_empty() {
            c[2].to_string()
        } else {
            format!("{dir}/{}", &c[2])
        };
        if safe(file) && repo.join(file).is_file() && absent(&base) {
            return Some(base);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_helper_module_missing_from_the_archive_is_classified() {
        // hass-nabucasa 0.88.1's collection, verbatim (two of its errors).
        let text =
            "ImportError while importing test module '/workspace/repo/tests/test_init.py'.\n\
            tests/test_init.py:12: in <module>\n    from .common import MockClient\n\
            E   ImportError: attempted relative import with no known parent package\n\
            ImportError while importing test module '/workspace/repo/tests/test_voice.py'.\n\
            E   ModuleNotFoundError: No module named 'tests.utils'\n\
            !!!!!!!!!!!!!!!!!!! Interrupted: 2 errors during collection !!!!!!!!!!!!!!!!!!!";
        let repo = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(repo.path().join("tests")).unwrap();
        std::fs::write(
            repo.path().join("tests/test_init.py"),
            "from .common import MockClient\n",
        )
        .unwrap();
        let c = classify_in(text, repo.path()).unwrap();
        assert_eq!(c.class, SOURCE_INCOMPLETE);
        assert_eq!(
            c.detail,
            "the source lacks a module its tests import: tests/utils (not in the archive; no environment can supply it)"
        );
        // With tests/utils/ there, the relative import's common.py is what is missing.
        std::fs::create_dir_all(repo.path().join("tests/utils")).unwrap();
        assert!(classify_in(text, repo.path())
            .unwrap()
            .detail
            .contains(": tests/common "));
        // With both there, it is some other failure (tests/ lacks __init__.py).
        std::fs::write(repo.path().join("tests/common.py"), "").unwrap();
        assert!(classify_in(text, repo.path()).is_none());
        // A third-party module missing is not the source's.
        assert!(classify_in(
            "ERROR collecting tests/test_a.py\nE   ModuleNotFoundError: No module named 'yaml'",
            repo.path()
        )
        .is_none());
    }

    #[test]
    fn a_conftest_that_downloads_is_classified_with_its_host() {
        let text = "ImportError while loading conftest '/workspace/repo/tests/conftest.py'.\n\
            tests/conftest.py:4: in <module>\n    DATA = requests.get('https://data.example.org/fixture.json').json()\n\
            E   requests.exceptions.ConnectionError: HTTPSConnectionPool(host='data.example.org', port=443): Max retries exceeded with url: /fixture.json (Caused by NameResolutionError(\"<urllib3.connection.HTTPSConnection object at 0x7f>: Failed to resolve 'data.example.org' ([Errno -3] Temporary failure in name resolution)\"))";
        let c = classify(text).unwrap();
        assert_eq!(c.class, NETWORK_AT_COLLECTION);
        assert_eq!(
            c.detail,
            "needs network at collection: host data.example.org"
        );
    }

    #[test]
    fn urllib_at_import_is_classified_too() {
        let text = "==================================== ERRORS ====================================\n\
            ______________________ ERROR collecting tests/test_geo.py ______________________\n\
            tests/test_geo.py:3: in <module>\n    urllib.request.urlopen(\"http://tiles.example.net/index\")\n\
            E   urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>\n\
            !!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!";
        assert_eq!(
            classify(text).unwrap().detail,
            "needs network at collection: host tiles.example.net"
        );
    }

    #[test]
    fn a_window_opened_at_import_is_classified_as_needing_a_display() {
        // pyglet 2.0.15's collection, verbatim (the tail).
        let text = "______________ ERROR collecting tests/unit/test_events.py ______________\n\
            pyglet/canvas/xlib.py:88: in __init__\n    raise NoSuchDisplayException(f'Cannot connect to \"{name}\"')\n\
            E   pyglet.canvas.xlib.NoSuchDisplayException: Cannot connect to \"None\"\n\
            !!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!";
        let c = classify(text).unwrap();
        assert_eq!(c.class, DISPLAY_AT_COLLECTION);
        assert_eq!(
            c.detail,
            "needs a display at collection: the build container has no X server (pyglet.canvas.xlib.NoSuchDisplayException: Cannot connect to \"None\")"
        );
        let tk = "ERROR collecting tests/test_gui.py\nE   _tkinter.TclError: no display name and no $DISPLAY environment variable";
        assert_eq!(classify(tk).unwrap().class, DISPLAY_AT_COLLECTION);
        // python-xlib's refusal names a "Connection refused": still a display, not the network.
        let xlib = "ERROR collecting tests/test_keys.py\nE   Xlib.error.DisplayConnectionError: Can't connect to display \":0\": [Errno 111] Connection refused";
        assert_eq!(classify(xlib).unwrap().class, DISPLAY_AT_COLLECTION);
    }

    #[test]
    fn test_files_missing_from_the_archive_are_classified() {
        // zstd 0.13.2's `cargo test --no-run` and cairosvg 2.7.1's collection, verbatim.
        let zstd = "   Compiling zstd v0.13.2 (/workspace/repo)\nerror: couldn't read `src/stream/../../assets/example.txt.zst`: No such file or directory (os error 2)\n   --> src/stream/tests.rs:231:20";
        let c = classify(zstd).unwrap();
        assert_eq!(c.class, SOURCE_INCOMPLETE);
        assert!(
            c.detail.starts_with(
                "the source lacks a file its tests read: src/stream/../../assets/example.txt.zst"
            ),
            "{}",
            c.detail
        );
        let cairo = "_____ ERROR collecting test_non_regression/test_helpers.py _____\nE   FileNotFoundError: [Errno 2] No such file or directory: '/workspace/repo/test_non_regression/cairosvg_reference/cairosvg/__init__.py'";
        assert!(classify(cairo)
            .unwrap()
            .detail
            .contains(": test_non_regression/cairosvg_reference/cairosvg/__init__.py"));
        // A file missing from an environment is not the source's.
        let venv = "ERROR collecting tests/test_a.py\nE   FileNotFoundError: [Errno 2] No such file or directory: '/workspace/repo/.venv/bin/tool'";
        assert!(classify(venv).is_none());
        // A build script's output missing from target/ is the environment's to make.
        let out_dir = "error: couldn't read `/workspace/repo/target/debug/build/x-1/out/bindings.rs`: No such file or directory (os error 2)";
        assert!(classify(out_dir).is_none());
        // A conftest whose download failed explains the file it did not write.
        let dl = "ImportError while loading conftest '/workspace/repo/tests/conftest.py'.\nE   urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution> for https://data.example.org/x\nE   FileNotFoundError: [Errno 2] No such file or directory: '/workspace/repo/tests/data/x.json'";
        assert_eq!(classify(dl).unwrap().class, NETWORK_AT_COLLECTION);
        // Outside collection, a Python FileNotFoundError is not classified.
        assert!(classify(
            "FileNotFoundError: [Errno 2] No such file or directory: '/workspace/repo/data.txt'"
        )
        .is_none());
    }

    #[test]
    fn other_failures_are_not_network_needs() {
        assert!(classify(
            "ERROR collecting tests/test_a.py\nE   ModuleNotFoundError: No module named 'yaml'"
        )
        .is_none());
        // A network error outside collection (a pip download) is transient, not this class.
        assert!(classify("ERROR: Could not install packages due to an OSError: HTTPSConnectionPool(host='files.example', port=443): Max retries exceeded").is_none());
    }
}
