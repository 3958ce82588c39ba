//! The repair rules, most specific first: each a pattern over the failed
//! command's output and a fix template (see [`super::render`]).

use super::Rule;

/// Placeholders in fixes and probes:
/// `{apt}`: install with apt (refreshing lists when they are missing);
/// `{pip}`: install into the project's venv (created when missing);
/// `{resolve}`: the same through uv when it is there, as of the plan's
/// cut-off date (`as_of.rs`);
/// `{1}`, `{2}`: capture groups 1 and 2; `{header:1}`, `{cmd:1}`, `{pc:1}`, `{module:1}`: capture 1
/// mapped through the header / command / pkg-config / Python module tables;
/// `{known_cmd:1}`: capture 1 through the command table, nothing when it is
/// not there;
/// `{extras:2}`: the project's extras that require the distribution of the
/// module capture 2 names, comma-separated (nothing proposed when none does);
/// `{node}`: what the runtime block installs after `node@`
/// (`crate::plan::node_to_install`): the release or line the project names
/// with the npm that runs on it, else its CI's line, else the major its
/// `engines.node` (or its date) asks for at least;
/// `{debian_node}`: whether the node on `PATH` is Debian's
/// ([`crate::script::DEBIAN_NODE`]);
/// `{soname:1}`: the Debian package that ships the shared library capture 1
/// names, from the mirror's Contents index.
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
        id: "npm-install-script-download",
        pattern: r"npm (?:ERR!|error) path /workspace/repo/(?:[\w.@/-]+/)?node_modules/((?:@[A-Za-z0-9._-]+/)?[A-Za-z0-9._-]+)[ \t]*\n(?:npm (?:ERR!|error)[^\n]*\n){0,40}?[^\n]*(?:ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ENETUNREACH|ETIMEDOUT|ECONNRESET|self[- ]signed certificate|unable to get local issuer certificate|socket hang up)",
        fix: "mkdir -p /etc/belay && echo '{1}' >> /etc/belay/npm-skip-scripts",
        probe: Some("grep -qxF '{1}' /etc/belay/npm-skip-scripts"),
        blame: None,
        hint: "a package's install script downloads from a host this network refuses: install without that package's scripts, and run every other package's",
    },
    Rule {
        // npm 5 and 6 (node 4 to 11) name the script's package in a banner.
        id: "npm6-install-script-download",
        pattern: r"\n> \S+ (?:preinstall|install|postinstall) /workspace/repo/(?:[\w.@/-]+/)?node_modules/((?:@[A-Za-z0-9._-]+/)?[A-Za-z0-9._-]+)[ \t]*\n(?:[^\n]*\n){0,40}?[^\n]*(?:ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ENETUNREACH|ETIMEDOUT|ECONNRESET|self[- ]signed certificate|unable to get local issuer certificate|socket hang up)",
        fix: "mkdir -p /etc/belay && echo '{1}' >> /etc/belay/npm-skip-scripts",
        probe: Some("grep -qxF '{1}' /etc/belay/npm-skip-scripts"),
        blame: None,
        hint: "a package's install script downloads from a host this network refuses: install without that package's scripts, and run every other package's",
    },
    Rule {
        id: "pnpm-install-script-download",
        pattern: r"\.\.\./(?:\S*node_modules/)?((?:@[A-Za-z0-9._-]+/)?[A-Za-z0-9._-]+) (?:preinstall|install|postinstall): [^\n]*(?:ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ENETUNREACH|ETIMEDOUT|ECONNRESET|self[- ]signed certificate|unable to get local issuer certificate|socket hang up)",
        fix: "mkdir -p /etc/belay && echo '{1}' >> /etc/belay/npm-skip-scripts",
        probe: Some("grep -qxF '{1}' /etc/belay/npm-skip-scripts"),
        blame: None,
        hint: "a package's install script downloads from a host this network refuses: pnpm installs without that package's scripts, and rebuilds every other package",
    },
    Rule {
        id: "yarn-install-script-download",
        pattern: r"error /workspace/repo/(?:[\w.@/-]+/)?node_modules/((?:@[A-Za-z0-9._-]+/)?[A-Za-z0-9._-]+): Command failed\.[ \t]*\n(?:[^\n]*\n){0,40}?[^\n]*(?:ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ENETUNREACH|ETIMEDOUT|ECONNRESET|self[- ]signed certificate|unable to get local issuer certificate|socket hang up)",
        fix: "mkdir -p /etc/belay && echo '{1}' >> /etc/belay/npm-skip-scripts",
        probe: Some("grep -qxF '{1}' /etc/belay/npm-skip-scripts"),
        blame: None,
        hint: "a package's install script downloads from a host this network refuses: yarn installs without scripts, then npm runs every other package's",
    },
    Rule {
        id: "node-headers-unreachable",
        pattern: r"node-v[\d.]+-headers\.tar\.gz failed|gyp WARN install got an error, rolling back install|gyp ERR! stack Error: (?:\d+ response downloading|This is most likely not a problem with node-gyp).*headers",
        fix: "{debian_node} && {apt} libnode-dev python3 make g++ && npm config set nodedir /usr -g",
        probe: Some("test -f /usr/include/node/common.gypi && npm config get nodedir | grep -qx /usr"),
        blame: None,
        hint: "node-gyp cannot download node's headers from here: build the native addon against Debian's (libnode-dev), only when Debian's node runs it",
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
        pattern: r"error: command '[^']*(gcc|cc|g\+\+|clang)' failed: No such file or directory|\[Errno 2\] No such file or directory: '[^']*(gcc|cc|g\+\+|clang)'|unable to execute '[^']*gcc'|linker `cc` not found|No CMAKE_C(XX)?_COMPILER could be found|gcc: (command )?not found|cc: (command )?not found|C compiler cannot create executables|error: Microsoft Visual C\+\+|You need a C compiler",
        fix: "{apt} build-essential",
        probe: Some("command -v gcc && command -v g++ && command -v make"),
        blame: None,
        hint: "no C/C++ compiler",
    },
    Rule {
        id: "node-gyp-toolchain",
        pattern: r"gyp ERR! find Python|gyp ERR! stack Error: Could not find any Python|gyp ERR! stack Error: not found: make|make: (?:g\+\+|c\+\+|cc|gcc): No such file or directory|gyp ERR! stack Error: `make` failed",
        fix: "{apt} python3 make g++",
        probe: Some("command -v python3 && command -v make && command -v g++"),
        blame: None,
        hint: "node-gyp compiles a native addon at install: it needs Python, make and a C++ compiler",
    },
    Rule {
        // node-gyp before 7 opens binding.gyp with mode 'rU', which Python
        // 3.11 removed: a project that pins such a node-gyp (node-hid 2
        // through `prebuild`) fails on bookworm's Python. The image's
        // python3 takes 'U' as it did (a no-op since Python 3.0) through a
        // `.pth` line in its site-packages: a fix runs in its own exec, so
        // only what it leaves on disk reaches the block's replay.
        id: "node-gyp-python-rU",
        pattern: r"ValueError: invalid mode: 'rU'",
        fix: "d=$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))') && mkdir -p \"$d\" && printf '%s\\n' 'import builtins, io; builtins.open = (lambda o: lambda file, mode=\"r\", *a, **k: o(file, (mode.replace(\"U\", \"\") or \"r\") if isinstance(mode, str) else mode, *a, **k))(io.open)' > \"$d/belay-open-mode-u.pth\" && python3 -c 'open(\"/dev/null\", \"rU\").close()'",
        probe: None,
        blame: None,
        hint: "an old node-gyp (before 7) opens files with mode 'rU', which Python 3.11 removed: python3 takes 'U' again, as a no-op",
    },
    Rule {
        // A lockfile left behind its package.json (a dependency added or
        // bumped without installing): the frozen install refuses it, where
        // a developer's plain install resolves what it lacks. The install
        // line reads the mark (`plan::LOCKFILE_STALE`); yarn 1 then installs
        // with `--pure-lockfile`, npm with `install --no-save`, pnpm with
        // `--no-frozen-lockfile`. npm 6's `ci` (node 10 and older) does
        // not say so: it fails on the first dependency its lockfile lacks
        // with "Cannot read property 'mocha' of undefined".
        id: "lockfile-stale",
        pattern: r#"Your lockfile needs to be updated, but yarn was run with `--frozen-lockfile`|(?:`npm ci`|cipm) can only install packages when your package\.json and (?:package-lock\.json|npm-shrinkwrap\.json)[^\n]*(?:are|is) in sync|ERR_PNPM_OUTDATED_LOCKFILE|Cannot install with "frozen-lockfile" because pnpm-lock\.yaml is not up to date|(?m:^npm ERR! Cannot read property '[^'\n]+' of undefined$)"#,
        fix: "mkdir -p /etc/belay && touch /etc/belay/lockfile-stale",
        probe: Some("test -e /etc/belay/lockfile-stale"),
        blame: None,
        hint: "the lockfile does not match package.json: the install resolves what it lacks, as a developer's plain install does, instead of a frozen install",
    },
    Rule {
        // npm 7 and later refuse a tree whose peer dependencies conflict
        // (ERESOLVE), where npm 6, and the developers of a project from its
        // era, installed it with a warning: dns2 2.1.0's eslint 7 beside
        // eslint-config-standard 17's peer eslint 8. npm's own advice is
        // `--legacy-peer-deps`; in root's npm config (`~/.npmrc`), not a
        // flag, so that the block's replay and a developer's `npm install`
        // in the final image resolve alike. Not the global config: its
        // place follows npm's prefix, and a later node-engine repair's
        // npm has another. Before node-engine: the same log often warns
        // of an engine (EBADENGINE), which is not the failure.
        id: "npm-peer-conflict",
        pattern: r"\bcode ERESOLVE\b|ERESOLVE unable to resolve dependency tree|ERESOLVE could not resolve",
        fix: "npm config set legacy-peer-deps true && test \"$(npm config get legacy-peer-deps)\" = true",
        probe: Some("test \"$(npm config get legacy-peer-deps)\" = true"),
        blame: None,
        hint: "the project's peer dependencies conflict, which npm 7 and later refuse and npm 6 only warned of: install as npm 6 did (legacy-peer-deps, in root's npm config), as npm's own message advises",
    },
    Rule {
        // yarn 1 fails the install on a dependency's engines range that
        // caps node below the one running (upath 1.0.4: ">=4 <=9"); npm
        // only warns. Before node-engine: an older node is no fix. In
        // yarn's config, not a variable: a fix runs in its own exec.
        id: "yarn-dependency-engine-cap",
        pattern: r#"error \S+: The engine "node" is incompatible with this module\. Expected version "[^"]*<[^"]*"\. Got"#,
        fix: "yarn config set ignore-engines true",
        probe: None,
        blame: None,
        hint: "a dependency's engines range caps node below the one running, which yarn 1 refuses and npm only warns of: install ignoring engines, as npm does",
    },
    Rule {
        id: "node-engine",
        pattern: r"is older than the project's engines\.node|is older than node \d+, the oldest LTS line|is not node [\d.]+, the (line|release) the project's|the lines the project's CI tests|Unsupported engine|The engine \x22node\x22 is incompatible|requires (a )?node(\.?js)? (version )?>=",
        fix: "npm install -g --no-audit --no-fund --force node@{node} && hash -r && node --version",
        probe: None,
        blame: None,
        hint: "the node running is not the one the project's engines.node or pin asks for: install that node (and, for a line older than 18, an npm that runs on it) from the npm registry",
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
        id: "needs-git",
        pattern: r"Versioning for this project requires either an sdist tarball, or access to an upstream git repository|setuptools-scm was unable to detect version|Error getting the version from source `?vcs`?|No such file or directory: '(git)'|Cannot find git|(?:^|[\s:])(git): (?:command )?not found",
        fix: "{apt} git && git config --global --add safe.directory /workspace/repo",
        probe: Some("command -v git"),
        blame: None,
        hint: "the version comes from git metadata (pbr, setuptools-scm, versioneer, hatch-vcs, dunamai) and git is not installed",
    },
    Rule {
        id: "git-dubious-ownership",
        pattern: r"detected dubious ownership in repository at",
        fix: "git config --global --add safe.directory /workspace/repo",
        probe: None,
        blame: None,
        hint: "git refuses the checkout because another user owns it",
    },
    Rule {
        id: "shared-library-missing",
        pattern: r"(lib[\w.+-]*?\.so(?:\.\d+)*): cannot open shared object file",
        fix: "{apt} {soname:1}",
        probe: None,
        blame: None,
        hint: "a shared library is missing at run time: install the Debian package that ships it",
    },
    Rule {
        id: "library-missing-at-link",
        pattern: r"cannot find -l([\w.+-]+)",
        fix: "{apt} {soname:1}",
        probe: None,
        blame: None,
        hint: "the linker cannot find a library: install the Debian package that ships its development link",
    },
    Rule {
        id: "library-missing-at-load",
        pattern: r#"Library "([\w.+-]+)" not found|cannot load library '([^'/]+)'|no library called "([\w.+-]+)" was found|_p\.(GL|GLES[123]|GLU|GLUT|EGL)\.\w+[^\n]*\n[^\n]*'NoneType' object has no attribute"#,
        fix: "{apt} {soname:1}",
        probe: None,
        blame: None,
        hint: "a library loaded by name at run time (ctypes, cffi) is missing: install the Debian package that ships it",
    },
    Rule {
        id: "libxml2-dev-missing",
        pattern: r"make sure the libxml2 and libxslt development packages are installed",
        fix: "{apt} libxml2-dev libxslt1-dev pkg-config",
        probe: Some("dpkg -s libxml2-dev libxslt1-dev"),
        blame: None,
        hint: "lxml builds against libxml2 and libxslt: install their development packages",
    },
    Rule {
        id: "rust-compiler-missing",
        pattern: r"can't find Rust compiler|error: can't find Rust compiler|maturin failed.*\n.*(?:cargo|rustc)",
        fix: "if apt-cache show cargo-web >/dev/null 2>&1; then {apt} cargo-web; else {apt} cargo; fi",
        probe: Some("command -v cargo"),
        blame: None,
        hint: "a Python extension is written in Rust: install cargo and rustc",
    },
    Rule {
        id: "qt-binding-missing",
        pattern: r"QtBindingsNotFoundError|No Qt bindings could be found",
        fix: "{resolve} PyQt5",
        probe: None,
        blame: None,
        hint: "qtpy (or another Qt shim) found no Qt binding: install PyQt5, the one it tries first",
    },
    Rule {
        id: "python-extension-not-built",
        pattern: r"No module named '?([A-Za-z_]\w*)\._\w+'?",
        fix: "{apt} {ext:1} && {pip} --no-deps --force-reinstall --no-build-isolation -e /workspace/repo || {pip} --no-deps --force-reinstall -e /workspace/repo",
        probe: None,
        blame: None,
        hint: "a package's C extension was not built because its library was missing: install the library and rebuild",
    },
    // After the header, compiler and library rules: a source build that
    // fails for a missing header is that rule's. An exact pin whose release
    // has no wheel for this Python (aiohasupervisor's dev extra pins orjson
    // 3.10.6, which has none for 3.13) builds from source, and may not: a
    // newer release of the same package is let in through uv's system-wide
    // overrides, which every later install in the image reads (`!=` the
    // failed release: the resolver takes the newest other).
    Rule {
        id: "pinned-source-build-failed",
        pattern: r"Failed to (?:download and )?build `([A-Za-z0-9][A-Za-z0-9_.-]{0,100})==([0-9][A-Za-z0-9_.+!-]{0,60})`",
        fix: "mkdir -p /etc/uv && echo '{1}!={2}' >> /etc/uv/belay-overrides.txt && { echo 'override-dependencies = ['; sort -u /etc/uv/belay-overrides.txt | sed 's/.*/  \"&\",/'; echo ']'; } > /etc/uv/uv.toml",
        probe: None,
        blame: None,
        hint: "an exact pin has no wheel for this Python and its source does not build: uv may take a newer release of it (an override in /etc/uv/uv.toml)",
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
        id: "pytest-unittest-runtest",
        pattern: r"object has no attribute 'runTest'",
        fix: "{pip} 'pytest<8.2'",
        probe: None,
        blame: None,
        hint: "pytest 8.2 makes each unittest class at collection with `runTest`, which testtools' TestCase refuses: pin pytest below 8.2",
    },
    Rule {
        id: "project-extra-missing",
        pattern: r"(?m)^([\w/.-]+\.py):\d+: in <module>\n\s+(?:from|import) [^\n]+\nE\s+ModuleNotFoundError: No module named '([\w.]+)'",
        fix: "{resolve} -e '/workspace/repo[{extras:2}]'",
        probe: None,
        blame: None,
        hint: "the project's own package imports an optional dependency: install the project with the extras that declare it",
    },
    Rule {
        id: "protobuf-runtime-older-than-gencode",
        pattern: r"(?s)incompatible Protobuf Gencode/Runtime versions.*?gencode (\d+\.\d+)\.\d+ runtime \d+\.\d+\.\d+",
        // The gencode's major, at least its minor (`~=`: no `>` for the
        // safety filter to read as a redirection).
        fix: "{resolve} 'protobuf~={1}'",
        probe: None,
        blame: None,
        hint: "the generated _pb2 code is newer than the installed protobuf runtime: install a runtime at least as new as the generated code",
    },
    Rule {
        id: "protobuf-gencode-too-old",
        pattern: r"Descriptors cannot be created directly|generated code is out of date and must be regenerated with protoc",
        fix: "{resolve} 'protobuf<4'",
        probe: None,
        blame: None,
        hint: "the generated _pb2 code predates protobuf 4 and the installed runtime refuses it: install the last protobuf 3",
    },
    Rule {
        id: "local-module-not-installed",
        pattern: r"No module named '?([A-Za-z_][\w.]*[\w])",
        fix: "{pip} -e /workspace/repo",
        probe: None,
        blame: None,
        hint: "the project's own package is not installed in the venv",
    },
    Rule {
        id: "python-module-missing",
        pattern: r"No module named '?([A-Za-z_][\w.]*[\w])",
        fix: "{resolve} {module:1}",
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
        id: "command-missing-at-run",
        pattern: r"FileNotFoundError: \[Errno 2\] No such file or directory: '([a-z][\w.+-]*)'",
        fix: "{apt} {known_cmd:1}",
        probe: Some("command -v {1}"),
        blame: None,
        hint: "the code runs a command that is not installed: install the package that provides it",
    },
    Rule {
        id: "rust-lint-denied",
        pattern: r"note: the lint level is defined here\n[^\n]*\n[^\n]*\n[^\n]*#!?\[(?:deny|forbid)\(",
        fix: "mkdir -p \"${CARGO_HOME:-$HOME/.cargo}\" && { grep -qs cap-lints \"${CARGO_HOME:-$HOME/.cargo}/config.toml\" || { ! grep -qs '^\\[build\\]' \"${CARGO_HOME:-$HOME/.cargo}/config.toml\" || { echo \"belay: cargo's config.toml already has a [build] table: add --cap-lints warn to its rustflags by hand\" >&2; exit 1; }; printf '[build]\\nrustflags = [\"--cap-lints\", \"warn\"]\\n' >> \"${CARGO_HOME:-$HOME/.cargo}/config.toml\"; }; }",
        probe: Some("grep -qs cap-lints \"${CARGO_HOME:-$HOME/.cargo}/config.toml\""),
        blame: None,
        hint: "the crate denies a lint that this newer compiler raises (toolchain drift, not a broken build): cap lints at warn, as crater does",
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
