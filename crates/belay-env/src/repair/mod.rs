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

/// Placeholders in fixes and probes:
/// `{apt}`: install with apt (refreshing lists when they are missing);
/// `{pip}`: install into the project's venv (created when missing);
/// `{1}`: capture group 1; `{header:1}`, `{cmd:1}`, `{pc:1}`, `{module:1}`: capture 1
/// mapped through the header / command / pkg-config / Python module tables;
/// `{node_major}`: the major version the project's `engines.node` asks for.
pub const RULES: &[Rule] = &[
    Rule {
        id: "apt-lists-missing",
        pattern: r"E: Unable to locate package|E: Package '[^']+' has no installation candidate|Failed to fetch .* 404\s+Not Found",
        fix: "apt-get update -q",
        probe: None,
        blame: None,
        hint: "the package index is missing or stale",
    },
    Rule {
        id: "dpkg-interrupted",
        pattern: r"dpkg was interrupted, you must manually run",
        fix: "dpkg --configure -a",
        probe: None,
        blame: None,
        hint: "an earlier dpkg run was interrupted",
    },
    Rule {
        id: "transient-network",
        pattern: r"Temporary failure (in name resolution|resolving)|Could not resolve host|Connection reset by peer|ReadTimeoutError|Read timed out|ETIMEDOUT|ECONNRESET|503 Service Unavailable|EAI_AGAIN",
        fix: "sleep 5",
        probe: None,
        blame: None,
        hint: "a transient network error: replay the block",
    },
    Rule {
        id: "pep668-externally-managed",
        pattern: r"externally-managed-environment",
        fix: "{ [ -x /workspace/repo/.venv/bin/python ] || python3 -m venv /workspace/repo/.venv; } && export PATH=/workspace/repo/.venv/bin:$PATH",
        probe: None,
        blame: None,
        hint: "PEP 668 blocks the system pip: install into the project venv",
    },
    Rule {
        id: "python-venv-missing",
        pattern: r"ensurepip is not\s+available|No module named '?(venv|ensurepip)'?",
        fix: "{apt} python3-venv",
        probe: Some("dpkg -s python3-venv"),
        blame: None,
        hint: "python3-venv is not installed",
    },
    Rule {
        id: "python-headers",
        pattern: r"Python\.h: No such file or directory",
        fix: "{apt} python3-dev build-essential",
        probe: Some("dpkg -s python3-dev"),
        blame: None,
        hint: "Python headers are missing",
    },
    Rule {
        id: "pg-config",
        pattern: r"pg_config executable not found|Error: pg_config|pg_config: (command )?not found|libpq-fe\.h: No such file",
        fix: "{apt} libpq-dev build-essential python3-dev",
        probe: Some("command -v pg_config"),
        blame: None,
        hint: "PostgreSQL client headers (pg_config) are missing",
    },
    Rule {
        id: "mysql-config",
        pattern: r"mysql_config: (command )?not found|mysql_config not found|Can not find valid pkg-config name.*mysqlclient",
        fix: "{apt} default-libmysqlclient-dev pkg-config build-essential python3-dev",
        probe: Some("command -v mysql_config"),
        blame: None,
        hint: "MySQL client headers are missing",
    },
    Rule {
        id: "openssl-sys",
        pattern: r"Could not find directory of OpenSSL installation|openssl-sys|Package openssl was not found",
        fix: "{apt} libssl-dev pkg-config",
        probe: Some("dpkg -s libssl-dev"),
        blame: None,
        hint: "OpenSSL development files are missing",
    },
    Rule {
        id: "missing-c-header",
        pattern: r"fatal error: ([\w/.+-]+\.h): No such file or directory",
        fix: "{apt} {header:1}",
        probe: None,
        blame: None,
        hint: "a C header is missing: install the package that ships it",
    },
    Rule {
        id: "pkg-config-package",
        pattern: r"Package '?([\w.+-]+)'?,? (required by '[^']*', )?(was )?not found|No package '([\w.+-]+)' found",
        fix: "{apt} pkg-config {pc:1}",
        probe: None,
        blame: None,
        hint: "a library known to pkg-config is missing",
    },
    Rule {
        id: "pkg-config-missing",
        pattern: r"pkg-config: (command )?not found|Could not find pkg-config|`pkg-config` (command|executable) (could not be found|not found)|pkg-config binary .* not found",
        fix: "{apt} pkg-config",
        probe: Some("command -v pkg-config"),
        blame: None,
        hint: "pkg-config is missing",
    },
    Rule {
        id: "c-compiler-missing",
        pattern: r"error: command '[^']*(gcc|cc|g\+\+|clang)' failed: No such file or directory|unable to execute '[^']*gcc'|linker `cc` not found|No CMAKE_C(XX)?_COMPILER could be found|gcc: (command )?not found|cc: (command )?not found|C compiler cannot create executables|error: Microsoft Visual C\+\+|You need a C compiler",
        fix: "{apt} build-essential",
        probe: Some("command -v gcc && command -v g++ && command -v make"),
        blame: None,
        hint: "no C/C++ compiler",
    },
    Rule {
        id: "node-engine",
        pattern: r"is older than the project's engines\.node|Unsupported engine|The engine \x22node\x22 is incompatible|requires (a )?node(\.?js)? (version )?>=",
        fix: "npm install -g --no-audit --no-fund node@{node_major} && hash -r && node --version",
        probe: None,
        blame: None,
        hint: "the distribution's node is older than engines.node: install the required node from the npm registry",
    },
    Rule {
        id: "go-too-old",
        pattern: r"go\.mod requires go >= ?([0-9.]+)|requires go(\s|>=)+([0-9.]+) \(running go|go: go\.mod requires go",
        fix: "mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources | head -n1) && echo \"deb $mirror bookworm-backports main\" > /etc/apt/sources.list.d/belay-backports.list && apt-get update -q && apt-get install -y -q --no-install-recommends -t bookworm-backports golang-1.22-go && ln -sf /usr/lib/go-1.22/bin/go /usr/local/bin/go && hash -r && go version",
        probe: None,
        blame: None,
        hint: "the distribution's Go is older than go.mod asks: install a newer Go from the distribution's backports",
    },
    Rule {
        id: "gradlew-not-executable",
        pattern: r"\./gradlew: Permission denied|\./mvnw: Permission denied",
        fix: "chmod +x gradlew mvnw 2>/dev/null || chmod +x gradlew || chmod +x mvnw",
        probe: None,
        blame: None,
        hint: "the build wrapper is not executable",
    },
    Rule {
        id: "venv-broken",
        pattern: r"\.venv/bin/python3?: (No such file or directory|not found|cannot execute)|bad interpreter: .*\.venv/bin/python",
        fix: "rm -rf /workspace/repo/.venv",
        probe: None,
        blame: Some("python-runtime"),
        hint: "the virtualenv made by the runtime block is broken: recreate it there",
    },
    Rule {
        id: "node-modules-missing",
        pattern: r"node_modules/\.bin/[\w.-]+: (No such file or directory|not found)|Cannot find module '([\w@/.-]+)'",
        fix: "rm -rf /workspace/repo/node_modules",
        probe: None,
        blame: Some("node-deps"),
        hint: "node_modules from the dependency block is incomplete: reinstall there",
    },
    Rule {
        id: "python-extension-not-built",
        pattern: r"No module named '?([A-Za-z_]\w*)\._\w+'?",
        fix: "{apt} {ext:1} && {pip} --no-deps --force-reinstall --no-build-isolation -e /workspace/repo || {pip} --no-deps --force-reinstall -e /workspace/repo",
        probe: None,
        blame: None,
        hint: "a package's C extension was not built because its library was missing: install the library and rebuild",
    },
    Rule {
        id: "pytest-hook-removed",
        pattern: r"are declared in the hookimpl but can not be found in the hookspec",
        fix: "{pip} 'pytest<8'",
        probe: None,
        blame: None,
        hint: "the test suite's conftest uses hook arguments newer pytest removed: pin pytest 7",
    },
    Rule {
        id: "local-module-not-installed",
        pattern: r"No module named '?([A-Za-z_][\w]*)",
        fix: "{pip} -e /workspace/repo",
        probe: None,
        blame: None,
        hint: "the project's own package is not installed in the venv",
    },
    Rule {
        id: "python-module-missing",
        pattern: r"No module named '?([A-Za-z_][\w]*)",
        fix: "{pip} {module:1}",
        probe: None,
        blame: None,
        hint: "a Python module is missing from the venv",
    },
    Rule {
        id: "pytest-too-new",
        pattern: r"PytestRemovedIn(\d+)Warning",
        fix: "{pip} 'pytest<{dec:1}'",
        probe: None,
        blame: None,
        hint: "the test suite uses pytest behaviour that the installed pytest turned into errors: pin the last pytest that allows it",
    },
    Rule {
        id: "command-not-found",
        pattern: r"(?:^|[\s:])([a-z][\w.+-]*): (?:command )?not found\s*$",
        fix: "{apt} {cmd:1}",
        probe: Some("command -v {1}"),
        blame: None,
        hint: "a command is missing: install the package that provides it",
    },
];

/// Headers -> Debian packages.
const HEADER_PKG: &[(&str, &str)] = &[
    ("ffi.h", "libffi-dev"),
    ("openssl/ssl.h", "libssl-dev"),
    ("openssl/opensslv.h", "libssl-dev"),
    ("ssl.h", "libssl-dev"),
    ("libxml/xmlversion.h", "libxml2-dev libxslt1-dev"),
    ("libxml/parser.h", "libxml2-dev"),
    ("libxslt/xsltconfig.h", "libxslt1-dev"),
    ("zlib.h", "zlib1g-dev"),
    ("bzlib.h", "libbz2-dev"),
    ("lzma.h", "liblzma-dev"),
    ("sqlite3.h", "libsqlite3-dev"),
    ("readline/readline.h", "libreadline-dev"),
    ("ncurses.h", "libncurses-dev"),
    ("curses.h", "libncurses-dev"),
    ("yaml.h", "libyaml-dev"),
    ("jpeglib.h", "libjpeg-dev"),
    ("png.h", "libpng-dev"),
    ("ft2build.h", "libfreetype-dev"),
    ("cairo.h", "libcairo2-dev"),
    ("uuid/uuid.h", "uuid-dev"),
    ("gmp.h", "libgmp-dev"),
    ("mpfr.h", "libmpfr-dev"),
    ("hdf5.h", "libhdf5-dev"),
    ("lber.h", "libldap2-dev libsasl2-dev"),
    ("ldap.h", "libldap2-dev libsasl2-dev"),
    ("sasl/sasl.h", "libsasl2-dev"),
    ("krb5.h", "libkrb5-dev"),
    ("gssapi/gssapi.h", "libkrb5-dev"),
    ("portaudio.h", "portaudio19-dev"),
    ("snappy-c.h", "libsnappy-dev"),
    ("lz4.h", "liblz4-dev"),
    ("zstd.h", "libzstd-dev"),
    ("pcre.h", "libpcre3-dev"),
    ("libpq-fe.h", "libpq-dev"),
    ("mysql.h", "default-libmysqlclient-dev"),
    ("Python.h", "python3-dev"),
    ("X11/Xlib.h", "libx11-dev"),
    ("GL/gl.h", "libgl-dev"),
    ("curl/curl.h", "libcurl4-openssl-dev"),
    ("expat.h", "libexpat1-dev"),
    ("gdbm.h", "libgdbm-dev"),
    ("magic.h", "libmagic-dev"),
    ("systemd/sd-daemon.h", "libsystemd-dev"),
    ("dbus/dbus.h", "libdbus-1-dev"),
    ("glib.h", "libglib2.0-dev"),
    ("libusb.h", "libusb-1.0-0-dev"),
    ("sodium.h", "libsodium-dev"),
    ("event.h", "libevent-dev"),
    ("geos_c.h", "libgeos-dev"),
    ("proj.h", "libproj-dev"),
    ("gdal.h", "libgdal-dev"),
];

/// Commands -> Debian packages (a command not listed is looked up by its own name).
const CMD_PKG: &[(&str, &str)] = &[
    ("gcc", "build-essential"),
    ("cc", "build-essential"),
    ("g++", "build-essential"),
    ("c++", "build-essential"),
    ("make", "make"),
    ("python", "python-is-python3"),
    ("python3", "python3 python3-venv"),
    ("pip", "python3-pip"),
    ("pip3", "python3-pip"),
    ("node", "nodejs"),
    ("nodejs", "nodejs"),
    ("npm", "npm"),
    ("npx", "npm"),
    ("cargo", "cargo"),
    ("rustc", "rustc"),
    ("go", "golang-go"),
    ("gofmt", "golang-go"),
    ("java", "default-jdk-headless"),
    ("javac", "default-jdk-headless"),
    ("mvn", "maven"),
    ("gradle", "gradle"),
    ("cmake", "cmake"),
    ("ninja", "ninja-build"),
    ("meson", "meson"),
    ("autoreconf", "autoconf automake libtool"),
    ("autoconf", "autoconf"),
    ("automake", "automake"),
    ("libtool", "libtool"),
    ("libtoolize", "libtool"),
    ("pkg-config", "pkg-config"),
    ("git", "git"),
    ("curl", "curl"),
    ("wget", "wget"),
    ("unzip", "unzip"),
    ("zip", "zip"),
    ("xz", "xz-utils"),
    ("bzip2", "bzip2"),
    ("patch", "patch"),
    ("swig", "swig"),
    ("protoc", "protobuf-compiler"),
    ("jq", "jq"),
    ("file", "file"),
    ("ps", "procps"),
    ("which", "debianutils"),
    ("sqlite3", "sqlite3"),
    ("psql", "postgresql-client"),
    ("redis-server", "redis-server"),
    ("gfortran", "gfortran"),
    ("perl", "perl"),
    ("ruby", "ruby"),
    ("tree", "tree"),
];

/// pkg-config names -> Debian packages (others become `lib<name>-dev`).
const PC_PKG: &[(&str, &str)] = &[
    ("libffi", "libffi-dev"),
    ("openssl", "libssl-dev"),
    ("libssl", "libssl-dev"),
    ("libpq", "libpq-dev"),
    ("zlib", "zlib1g-dev"),
    ("libxml-2.0", "libxml2-dev"),
    ("libxslt", "libxslt1-dev"),
    ("sqlite3", "libsqlite3-dev"),
    ("mysqlclient", "default-libmysqlclient-dev"),
    ("libsystemd", "libsystemd-dev"),
    ("dbus-1", "libdbus-1-dev"),
    ("glib-2.0", "libglib2.0-dev"),
    ("cairo", "libcairo2-dev"),
    ("gobject-introspection-1.0", "libgirepository1.0-dev"),
    ("x11", "libx11-dev"),
    ("libcurl", "libcurl4-openssl-dev"),
    ("libzstd", "libzstd-dev"),
    ("liblzma", "liblzma-dev"),
    ("libsodium", "libsodium-dev"),
];

/// Packages whose C extension (`pkg._ext`) needs a system library to be built.
const EXT_PKG: &[(&str, &str)] = &[
    ("yaml", "libyaml-dev"),
    ("lxml", "libxml2-dev libxslt1-dev"),
    ("psycopg2", "libpq-dev"),
    ("cffi", "libffi-dev"),
    ("_cffi_backend", "libffi-dev"),
    ("zmq", "libzmq3-dev"),
    ("snappy", "libsnappy-dev"),
    ("ldap", "libldap2-dev libsasl2-dev"),
    ("gssapi", "libkrb5-dev"),
    ("cairo", "libcairo2-dev"),
];

/// Python import names -> distributions (others install under their own name).
const MODULE_DIST: &[(&str, &str)] = &[
    ("yaml", "PyYAML"),
    ("PIL", "Pillow"),
    ("cv2", "opencv-python-headless"),
    ("sklearn", "scikit-learn"),
    ("skimage", "scikit-image"),
    ("bs4", "beautifulsoup4"),
    ("dateutil", "python-dateutil"),
    ("dotenv", "python-dotenv"),
    ("jwt", "PyJWT"),
    ("Crypto", "pycryptodome"),
    ("OpenSSL", "pyOpenSSL"),
    ("attr", "attrs"),
    ("serial", "pyserial"),
    ("usb", "pyusb"),
    ("magic", "python-magic"),
    ("gi", "PyGObject"),
    ("docx", "python-docx"),
    ("jose", "python-jose"),
    ("google", "protobuf"),
    ("pkg_resources", "setuptools"),
    ("setuptools", "setuptools"),
    ("wheel", "wheel"),
    ("_cffi_backend", "cffi"),
    ("MySQLdb", "mysqlclient"),
    ("psycopg2", "psycopg2-binary"),
    ("zmq", "pyzmq"),
    ("Levenshtein", "python-Levenshtein"),
    ("lxml", "lxml"),
    ("pytest", "pytest"),
    ("railroad", "railroad-diagrams"),
    ("hypothesis", "hypothesis"),
    ("mock", "mock"),
    ("nose", "pynose"),
    ("freezegun", "freezegun"),
    ("tomllib", "tomli"),
];

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

fn lookup(table: &[(&str, &str)], key: &str) -> Option<String> {
    table
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

/// Whether `module` is the project's own package (installing it from PyPI
/// would install a stranger's).
fn is_local_module(ctx: &RepoContext, module: &str) -> bool {
    if ctx.python.as_ref().and_then(|p| p.import_name.as_deref()) == Some(module) {
        return true;
    }
    let root = &ctx.repo_path;
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

/// Render a template; `None` when a placeholder cannot be filled.
fn render(
    rule: &Rule,
    template: &str,
    caps: &Captures,
    ctx: &RepoContext,
    all_missing: &[String],
) -> Option<String> {
    let cap1 = caps
        .iter()
        .skip(1)
        .flatten()
        .map(|m| m.as_str().to_string())
        .find(|s| !s.is_empty() && !s.starts_with("required by") && *s != "was ");
    let mut out = template.replace("{apt}", APT).replace("{pip}", PIP);
    if out.contains("{node_major}") {
        let major = ctx.node.as_ref().and_then(|n| n.required_major)?;
        out = out.replace("{node_major}", &major.to_string());
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
    if out.contains("{pc:1}") {
        let c = cap1.clone()?;
        let pkg =
            lookup(PC_PKG, &c).unwrap_or_else(|| format!("lib{}-dev", c.trim_start_matches("lib")));
        out = out.replace("{pc:1}", &pkg);
    }
    let module = cap1.clone();
    match rule.id {
        "local-module-not-installed" => {
            let m = module?;
            if !is_local_module(ctx, &m) {
                return None;
            }
        }
        "python-module-missing" => {
            let m = module?;
            if is_local_module(ctx, &m) || matches!(m.as_str(), "venv" | "ensurepip") {
                return None;
            }
            // Every missing module the output names, so that one round installs them all.
            let mut dists: Vec<String> = Vec::new();
            for m in all_missing
                .iter()
                .filter(|m| !is_local_module(ctx, m) && !matches!(m.as_str(), "venv" | "ensurepip"))
            {
                let d = lookup(MODULE_DIST, m).unwrap_or_else(|| m.replace('_', "-"));
                if !dists.contains(&d) {
                    dists.push(d);
                }
            }
            out = out.replace("{module:1}", &dists.join(" "));
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
    (!out.contains('{') || !out.contains(":1}")).then_some(out)
}

/// Fixes for a failure, most specific first, skipping fixes already `tried`.
pub fn propose(text: &str, ctx: &RepoContext, tried: &[String]) -> Vec<Proposal> {
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
        let Some(fix) = render(rule, rule.fix, &caps, ctx, &all) else {
            continue;
        };
        if tried.contains(&fix) || out.iter().any(|p| p.fix == fix) {
            continue;
        }
        out.push(Proposal {
            rule_id: rule.id.to_string(),
            probe: rule.probe.and_then(|p| render(rule, p, &caps, ctx, &all)),
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
                ..Default::default()
            }),
            node: Some(NodeFacts {
                required_major: Some(20),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Real error text, the rule it must pick first, and a fragment of the fix.
    const CASES: &[(&str, &str, &str)] = &[
        ("E: Unable to locate package libffi-dev", "apt-lists-missing", "apt-get update"),
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
        ("error: linker `cc` not found\n  |\n  = note: No such file or directory (os error 2)", "c-compiler-missing", "build-essential"),
        ("node v18.19.0 is older than the project's engines.node >=20", "node-engine", "node@20"),
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
        ("/bin/sh: 1: javac: not found", "command-not-found", "default-jdk-headless"),
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

    #[test]
    fn rules_pick_the_right_fix() {
        let c = ctx();
        for (text, id, fragment) in CASES {
            let p = propose(text, &c, &[]);
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
    fn tried_fixes_are_not_proposed_again() {
        let c = ctx();
        let text = "fatal error: ffi.h: No such file or directory";
        let first = propose(text, &c, &[]).remove(0);
        assert!(propose(text, &c, &[first.fix]).is_empty());
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
