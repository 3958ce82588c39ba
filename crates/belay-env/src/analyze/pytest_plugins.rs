//! The pytest plugins a project's test configuration names.
//!
//! pytest reads one configuration file (the first of `pytest.ini`,
//! `.pytest.ini`, `pyproject.toml` with `[tool.pytest.ini_options]`, `tox.ini`
//! with `[pytest]`, `setup.cfg` with `[tool:pytest]`). When its `addopts` uses
//! a plugin's option (`--cov=…`, `-n auto`, `--timeout 30`), loads one with
//! `-p NAME`, or lists `required_plugins`, collection fails with
//! "unrecognized arguments" until the plugin is installed. `pytest_plugins`
//! in a top-level `conftest.py` does the same with an import error.

use serde::{Deserialize, Serialize};

use super::Files;

/// A plugin distribution the tests need, and where the configuration says so.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PluginNeed {
    /// The distribution to install (`pytest-cov`), or a requirement with its
    /// version bound when `required_plugins` gives one (`pytest-xdist>=3`).
    pub distribution: String,
    /// `pytest.ini: addopts --cov`, `conftest.py: pytest_plugins pytest_mock`.
    pub because: String,
}

/// Options -> the plugin that adds them. An entry ending in `-` matches every
/// option with that prefix.
const OPTIONS: &[(&str, &str)] = &[
    ("--cov", "pytest-cov"),
    ("--cov-", "pytest-cov"),
    ("--no-cov", "pytest-cov"),
    ("--no-cov-on-fail", "pytest-cov"),
    ("-n", "pytest-xdist"),
    ("--numprocesses", "pytest-xdist"),
    ("--maxprocesses", "pytest-xdist"),
    ("--dist", "pytest-xdist"),
    ("--max-worker-restart", "pytest-xdist"),
    ("--looponfail", "pytest-xdist"),
    ("--tx", "pytest-xdist"),
    ("--timeout", "pytest-timeout"),
    ("--timeout-method", "pytest-timeout"),
    ("--timeout_method", "pytest-timeout"),
    ("--benchmark-", "pytest-benchmark"),
    ("--reruns", "pytest-rerunfailures"),
    ("--reruns-delay", "pytest-rerunfailures"),
    ("--only-rerun", "pytest-rerunfailures"),
    ("--randomly-", "pytest-randomly"),
    ("--html", "pytest-html"),
    ("--self-contained-html", "pytest-html"),
    ("--mypy", "pytest-mypy"),
    ("--flake8", "pytest-flake8"),
    ("--black", "pytest-black"),
    ("--isort", "pytest-isort"),
    ("--ruff", "pytest-ruff"),
    ("--ruff-format", "pytest-ruff"),
    ("--pylint", "pytest-pylint"),
    ("--doctest-plus", "pytest-doctestplus"),
    ("--doctest-rst", "pytest-doctestplus"),
    ("--text-file-format", "pytest-doctestplus"),
    ("--remote-data", "pytest-remotedata"),
    ("--mpl", "pytest-mpl"),
    ("--mpl-", "pytest-mpl"),
    ("--arraydiff", "pytest-arraydiff"),
    ("--hypothesis-", "hypothesis"),
    ("--snapshot-update", "syrupy"),
    ("--snapshot-warn-unused", "syrupy"),
    ("--ds", "pytest-django"),
    ("--reuse-db", "pytest-django"),
    ("--create-db", "pytest-django"),
    ("--nomigrations", "pytest-django"),
    ("--no-migrations", "pytest-django"),
    ("--asyncio-mode", "pytest-asyncio"),
    ("--forked", "pytest-forked"),
    ("--count", "pytest-repeat"),
    ("--repeat-scope", "pytest-repeat"),
    ("--instafail", "pytest-instafail"),
    ("--no-flaky-report", "flaky"),
    ("--no-success-flaky-report", "flaky"),
    ("--force-flaky", "flaky"),
    ("--max-runs", "flaky"),
    ("--min-passes", "flaky"),
    ("--disable-socket", "pytest-socket"),
    ("--allow-hosts", "pytest-socket"),
    ("--allow-unix-socket", "pytest-socket"),
    ("--memray", "pytest-memray"),
    ("--codeblocks", "pytest-codeblocks"),
    ("--order-scope", "pytest-order"),
    ("--sugar", "pytest-sugar"),
    ("--picked", "pytest-picked"),
    ("--testmon", "pytest-testmon"),
    ("--flakes", "pytest-flakes"),
    ("--pycodestyle", "pytest-pycodestyle"),
    ("--splits", "pytest-split"),
    ("--group", "pytest-split"),
];

/// ini keys that only a plugin defines (pytest warns, or with
/// `--strict-config` fails, on the others).
const INI_KEYS: &[(&str, &str)] = &[
    ("asyncio_mode", "pytest-asyncio"),
    ("asyncio_default_fixture_loop_scope", "pytest-asyncio"),
    ("timeout", "pytest-timeout"),
    ("timeout_method", "pytest-timeout"),
    ("DJANGO_SETTINGS_MODULE", "pytest-django"),
    ("django_find_project", "pytest-django"),
    ("env", "pytest-env"),
    ("mock_use_standalone_module", "pytest-mock"),
    ("doctest_plus", "pytest-doctestplus"),
    ("flake8-ignore", "pytest-flake8"),
    ("mpl-baseline-path", "pytest-mpl"),
    ("mpl-results-path", "pytest-mpl"),
    ("reruns", "pytest-rerunfailures"),
];

/// Plugin names for `-p` and `pytest_plugins` whose distribution is not
/// `pytest-<name>`.
const PLUGIN_NAMES: &[(&str, &str)] = &[
    ("xdist", "pytest-xdist"),
    ("xdist.plugin", "pytest-xdist"),
    ("xdist.looponfail", "pytest-xdist"),
    ("pytest_cov", "pytest-cov"),
    ("pytest_mock", "pytest-mock"),
    ("hypothesis", "hypothesis"),
    ("hypothesis.extra.pytestplugin", "hypothesis"),
    ("syrupy", "syrupy"),
    ("anyio", "anyio"),
    ("trio", "pytest-trio"),
    ("pytest_trio", "pytest-trio"),
    ("pytest_httpserver", "pytest-httpserver"),
    ("pytest_lazyfixture", "pytest-lazy-fixture"),
    ("pytest_localserver", "pytest-localserver"),
    ("celery.contrib.pytest", "celery"),
    ("sphinx.testing.fixtures", "sphinx"),
    ("matplotlib.testing.conftest", "matplotlib"),
    ("aiohttp.pytest_plugin", "pytest-aiohttp"),
    ("pytest_aiohttp", "pytest-aiohttp"),
    ("respx.plugin", "respx"),
    ("freezegun", "pytest-freezegun"),
];

/// Plugins that ship with pytest (`-p no:cacheprovider`, `pytester`).
const BUILTIN: &[&str] = &[
    "pytester",
    "pytest_pytester",
    "_pytest.pytester",
    "doctest",
    "cacheprovider",
    "capture",
    "faulthandler",
    "junitxml",
    "logging",
    "monkeypatch",
    "pastebin",
    "python_path",
    "recwarn",
    "setuponly",
    "setupplan",
    "skipping",
    "stepwise",
    "terminal",
    "tmpdir",
    "unittest",
    "warnings",
    "legacypath",
    "debugging",
    "helpconfig",
    "nose",
    "threadexception",
    "unraisableexception",
];

/// The one configuration pytest would read, with its file name.
enum Config {
    Ini {
        file: &'static str,
        section: Vec<(String, String)>,
    },
    Toml {
        table: toml::Table,
    },
}

fn ini_section(text: &str, name: &str) -> Option<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut inside = false;
    let mut found = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') && t.ends_with(']') {
            inside = t[1..t.len() - 1].trim() == name;
            found |= inside;
            continue;
        }
        if !inside || t.is_empty() || t.starts_with('#') || t.starts_with(';') {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            // A continuation of the last key's value.
            if let Some((_, v)) = out.last_mut() {
                v.push(' ');
                v.push_str(t);
            }
            continue;
        }
        if let Some((k, v)) = t.split_once(['=', ':']) {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    found.then_some(out)
}

fn config(f: &Files) -> Option<Config> {
    for file in ["pytest.ini", ".pytest.ini"] {
        if let Some(text) = f.read(file) {
            return Some(Config::Ini {
                file,
                section: ini_section(&text, "pytest").unwrap_or_default(),
            });
        }
    }
    if let Some(text) = f.read("pyproject.toml") {
        if let Ok(t) = text.parse::<toml::Table>() {
            let pytest = t
                .get("tool")
                .and_then(|x| x.get("pytest"))
                .and_then(|x| x.as_table());
            if let Some(p) = pytest {
                let table = p
                    .get("ini_options")
                    .and_then(|x| x.as_table())
                    .cloned()
                    .unwrap_or_else(|| p.clone());
                return Some(Config::Toml { table });
            }
        }
    }
    for (file, name) in [("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")] {
        if let Some(section) = f.read(file).and_then(|t| ini_section(&t, name)) {
            return Some(Config::Ini { file, section });
        }
    }
    None
}

/// Split a command line as pytest does (`shlex.split`); an unbalanced quote,
/// which pytest rejects, falls back to white space.
fn split_args(s: &str) -> Vec<String> {
    shlex::split(s).unwrap_or_else(|| s.split_whitespace().map(String::from).collect())
}

/// The distribution of a plugin named by module or entry point.
fn plugin_dist(name: &str, is_local: &dyn Fn(&str) -> bool) -> Option<String> {
    let name = name.trim();
    if name.is_empty() || name.starts_with("no:") || BUILTIN.contains(&name) {
        return None;
    }
    // A module or entry point name; anything else in a repository's config is not one.
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    {
        return None;
    }
    if name.starts_with("_pytest.") || name.starts_with("pytest.") {
        return None;
    }
    if let Some((_, d)) = PLUGIN_NAMES.iter().find(|(n, _)| *n == name) {
        return Some(d.to_string());
    }
    let top = name.split('.').next().unwrap_or(name);
    if is_local(top) {
        return None;
    }
    if let Some(d) = crate::module_dists::distribution(name) {
        return Some(d.to_string());
    }
    let base = top
        .trim_start_matches("pytest_")
        .trim_start_matches("pytest-");
    Some(format!("pytest-{}", base.replace('_', "-")))
}

fn option_dist(arg: &str) -> Option<&'static str> {
    let opt = arg.split_once('=').map_or(arg, |(o, _)| o);
    if opt.starts_with("-n") && opt.len() > 2 && !opt.starts_with("--") {
        // -n4, -nauto
        return Some("pytest-xdist");
    }
    OPTIONS
        .iter()
        .find(|(o, _)| *o == opt || (o.ends_with('-') && opt.starts_with(o)))
        .map(|(_, d)| *d)
}

/// The plugins the configuration and the top-level `conftest.py` need.
pub(super) fn needed(f: &Files, is_local: &dyn Fn(&str) -> bool) -> Vec<PluginNeed> {
    let mut out: Vec<PluginNeed> = Vec::new();
    let mut add = |distribution: String, because: String| {
        let key = crate::analyze::requirement_name(&distribution);
        if !out
            .iter()
            .any(|p| crate::analyze::requirement_name(&p.distribution) == key)
        {
            out.push(PluginNeed {
                distribution,
                because,
            });
        }
    };
    let (file, addopts, required, keys): (&str, Vec<String>, Vec<String>, Vec<String>) =
        match config(f) {
            Some(Config::Ini { file, section }) => {
                let get = |k: &str| {
                    section
                        .iter()
                        .filter(|(key, _)| key == k)
                        .map(|(_, v)| v.clone())
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                (
                    file,
                    split_args(&get("addopts")),
                    split_args(&get("required_plugins")),
                    section.iter().map(|(k, _)| k.clone()).collect(),
                )
            }
            Some(Config::Toml { table }) => {
                let list = |k: &str| -> Vec<String> {
                    match table.get(k) {
                        Some(toml::Value::String(s)) => split_args(s),
                        Some(toml::Value::Array(a)) => a
                            .iter()
                            .filter_map(|v| v.as_str())
                            .flat_map(split_args)
                            .collect(),
                        _ => Vec::new(),
                    }
                };
                (
                    "pyproject.toml",
                    list("addopts"),
                    list("required_plugins"),
                    table.keys().cloned().collect(),
                )
            }
            None => ("", Vec::new(), Vec::new(), Vec::new()),
        };
    let mut args = addopts.iter().peekable();
    while let Some(a) = args.next() {
        if a == "-p" {
            if let Some(name) = args.next() {
                if let Some(d) = plugin_dist(name, is_local) {
                    add(d, format!("{file}: addopts -p {name}"));
                }
            }
            continue;
        }
        if let Some(name) = a
            .strip_prefix("-p")
            .filter(|n| !n.is_empty() && !a.starts_with("--"))
        {
            if let Some(d) = plugin_dist(name, is_local) {
                add(d, format!("{file}: addopts -p {name}"));
            }
            continue;
        }
        if let Some(d) = option_dist(a) {
            let opt = a.split_once('=').map_or(a.as_str(), |(o, _)| o);
            add(d.to_string(), format!("{file}: addopts {opt}"));
        }
    }
    for r in required {
        if crate::analyze::requirement_name(&r).is_some() {
            add(r.clone(), format!("{file}: required_plugins {r}"));
        }
    }
    for k in keys {
        if let Some((_, d)) = INI_KEYS.iter().find(|(key, _)| *key == k) {
            add(d.to_string(), format!("{file}: {k}"));
        }
    }
    if let Some(text) = f.read("conftest.py") {
        for name in conftest_plugins(&text) {
            if let Some(d) = plugin_dist(&name, is_local) {
                add(d, format!("conftest.py: pytest_plugins {name}"));
            }
        }
    }
    out
}

/// The names in `pytest_plugins = "a"` / `pytest_plugins = ["a", "b"]` /
/// `pytest_plugins = ("a",)`.
fn conftest_plugins(text: &str) -> Vec<String> {
    let Some(start) = text
        .lines()
        .position(|l| l.starts_with("pytest_plugins") && l.contains('='))
    else {
        return Vec::new();
    };
    // The assignment, up to its closing bracket (at most 40 lines).
    let mut value = String::new();
    let mut depth = 0i32;
    for (n, line) in text.lines().skip(start).take(40).enumerate() {
        let part = if n == 0 {
            line.split_once('=').map_or("", |(_, v)| v)
        } else {
            line
        };
        let part = part.split('#').next().unwrap_or("");
        depth += part.matches(['[', '(']).count() as i32;
        depth -= part.matches([']', ')']).count() as i32;
        value.push_str(part);
        value.push(' ');
        if depth <= 0 {
            break;
        }
    }
    let mut out = Vec::new();
    let mut rest = value.as_str();
    while let Some(i) = rest.find(['"', '\'']) {
        let q = rest.as_bytes()[i] as char;
        let tail = &rest[i + 1..];
        let Some(j) = tail.find(q) else { break };
        out.push(tail[..j].to_string());
        rest = &tail[j + 1..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, text) in files {
            std::fs::write(d.path().join(p), text).unwrap();
        }
        d
    }

    fn dists(files: &[(&str, &str)]) -> Vec<String> {
        let d = repo(files);
        needed(&Files::new(d.path()), &|m| m == "mypkg")
            .into_iter()
            .map(|p| p.distribution)
            .collect()
    }

    #[test]
    fn coverage_py_addopts_need_xdist_and_flaky() {
        // coverage 7.6.0's pyproject.toml, verbatim.
        let toml = "[tool.pytest.ini_options]\naddopts = \"-q -n auto -p no:legacypath --strict-markers --no-flaky-report -rfEX --failed-first\"\n";
        assert_eq!(
            dists(&[("pyproject.toml", toml)]),
            ["pytest-xdist", "flaky"]
        );
    }

    #[test]
    fn addopts_options_name_their_plugins_in_every_config_file() {
        let ini =
            "[pytest]\naddopts = --cov=mypkg --cov-report term-missing\n    -n auto --timeout=30\n";
        assert_eq!(
            dists(&[("pytest.ini", ini)]),
            ["pytest-cov", "pytest-xdist", "pytest-timeout"]
        );
        let cfg = "[metadata]\nname = x\n\n[tool:pytest]\naddopts = -nauto --dist loadfile\n";
        assert_eq!(dists(&[("setup.cfg", cfg)]), ["pytest-xdist"]);
        let tox = "[tox]\nenvlist = py311\n\n[pytest]\naddopts = --reruns 2 --html=report.html\n";
        assert_eq!(
            dists(&[("tox.ini", tox)]),
            ["pytest-rerunfailures", "pytest-html"]
        );
        let toml = "[tool.pytest.ini_options]\naddopts = [\"--benchmark-skip\", \"-p\", \"xdist\"]\nasyncio_mode = \"auto\"\n";
        assert_eq!(
            dists(&[("pyproject.toml", toml)]),
            ["pytest-benchmark", "pytest-xdist", "pytest-asyncio"]
        );
    }

    #[test]
    fn only_the_file_pytest_reads_counts() {
        // pytest.ini wins over setup.cfg, even when it names no plugin.
        let got = dists(&[
            ("pytest.ini", "[pytest]\naddopts = -ra\n"),
            ("setup.cfg", "[tool:pytest]\naddopts = --cov\n"),
        ]);
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn p_required_plugins_and_conftest_name_plugins() {
        let ini = "[pytest]\naddopts = -p no:cacheprovider -p pytest_randomly -p mypkg.plugin\nrequired_plugins = pytest-mock>=3 pytest-env\n";
        assert_eq!(
            dists(&[("pytest.ini", ini)]),
            ["pytest-randomly", "pytest-mock>=3", "pytest-env"]
        );
        let conftest = "import os\npytest_plugins = [\n    \"pytester\",  # builtin\n    'pytest_httpserver',\n    \"mypkg.fixtures\",\n]\n";
        assert_eq!(dists(&[("conftest.py", conftest)]), ["pytest-httpserver"]);
        assert_eq!(
            dists(&[("conftest.py", "pytest_plugins = 'xdist'\n")]),
            ["pytest-xdist"]
        );
        // A name that is not a module name is no plugin (and never reaches a script).
        assert!(dists(&[("conftest.py", "pytest_plugins = ['x$(touch /pwn)']\n")]).is_empty());
    }

    #[test]
    fn a_project_without_plugins_needs_none() {
        assert!(dists(&[(
            "pytest.ini",
            "[pytest]\naddopts = -ra -q --strict-markers\ntestpaths = tests\n"
        )])
        .is_empty());
        assert!(dists(&[]).is_empty());
    }

    proptest::proptest! {
        #[test]
        fn config_parsing_never_panics(ini in ".{0,300}", conftest in ".{0,200}") {
            let d = repo(&[("pytest.ini", &ini), ("conftest.py", &conftest)]);
            let _ = needed(&Files::new(d.path()), &|_| false);
        }
    }
}
