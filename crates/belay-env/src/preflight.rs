//! The container preflight: facts read from the real base image, recorded as
//! `runtime_notes` in `context.json` and used by planning (and later repair).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Tools whose presence the preflight records.
const TOOLS: &[&str] = &[
    "sh",
    "apt-get",
    "apk",
    "dnf",
    "yum",
    "bash",
    "setsid",
    "python3",
    "pip3",
    "node",
    "npm",
    "yarn",
    "pnpm",
    "cargo",
    "rustc",
    "rustup",
    "go",
    "java",
    "javac",
    "mvn",
    "gradle",
    "gcc",
    "g++",
    "cc",
    "make",
    "cmake",
    "meson",
    "ninja",
    "pkg-config",
    "git",
    "curl",
    "ps",
    "ssh",
    "wget",
    "sudo",
];

/// A POSIX sh script printing `key=value` lines. It installs nothing, writes
/// nothing and needs no network.
pub fn script() -> String {
    let mut s = String::from(
        "set +e\n\
         if [ -r /etc/os-release ]; then . /etc/os-release; fi\n\
         echo \"os_id=${ID:-unknown}\"\n\
         echo \"os_version=${VERSION_ID:-unknown}\"\n\
         echo \"os_pretty=${PRETTY_NAME:-unknown}\"\n\
         echo \"os_codename=${VERSION_CODENAME:-}\"\n\
         echo \"arch=$(uname -m)\"\n\
         echo \"user=$(id -un 2>/dev/null || id -u)\"\n\
         echo \"nproc=$(nproc 2>/dev/null || echo 1)\"\n\
         echo \"workspace=$(test -d /workspace/repo && echo present || echo missing)\"\n",
    );
    s.push_str(&format!(
        "for t in {}; do p=$(command -v \"$t\" 2>/dev/null) && echo \"tool.$t=$p\"; done\n",
        TOOLS.join(" ")
    ));
    s.push_str(
        "command -v python3 >/dev/null && echo \"version.python3=$(python3 -c 'import sys;print(\"%d.%d.%d\" % sys.version_info[:3])' 2>/dev/null)\"\n\
         command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null && echo \"python3.venv=ok\"\n\
         command -v node >/dev/null && echo \"version.node=$(node --version 2>/dev/null | tr -d v)\"\n\
         command -v npm >/dev/null && echo \"version.npm=$(npm --version 2>/dev/null)\"\n\
         command -v cargo >/dev/null && echo \"version.cargo=$(cargo --version 2>/dev/null | cut -d' ' -f2)\"\n\
         command -v rustc >/dev/null && echo \"version.rustc=$(rustc --version 2>/dev/null | cut -d' ' -f2)\"\n\
         command -v go >/dev/null && echo \"version.go=$(go version 2>/dev/null | cut -d' ' -f3 | sed 's/^go//')\"\n\
         command -v java >/dev/null && echo \"version.java=$(java -version 2>&1 | head -n1 | cut -d'\"' -f2)\"\n\
         command -v gcc >/dev/null && echo \"version.gcc=$(gcc -dumpfullversion 2>/dev/null)\"\n\
         if command -v apt-cache >/dev/null && [ -n \"$(ls /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)\" ]; then apt-cache policy python3 nodejs cargo golang-go default-jdk-headless 2>/dev/null | awk '/^[^ ]/ {p=$1; sub(\":$\", \"\", p)} /Candidate:/ && $2 != \"(none)\" {print \"apt_candidate.\" p \"=\" $2}'; fi\n\
         exit 0\n",
    );
    s
}

/// Facts about the base image.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RuntimeNotes {
    pub os_id: String,
    pub os_version: String,
    pub os_pretty: String,
    /// `VERSION_CODENAME` (`bookworm`), empty when the image does not say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub os_codename: String,
    pub arch: String,
    pub user: String,
    pub nproc: u32,
    /// apt, apk, dnf or yum.
    pub package_manager: Option<String>,
    pub tools: BTreeMap<String, String>,
    pub versions: BTreeMap<String, String>,
    /// Versions the package manager would install (apt candidates); empty until
    /// `apt-get update` has run in the image.
    pub apt_candidates: BTreeMap<String, String>,
    pub python_venv: bool,
    /// True when these notes come from the real image; false for `env plan`
    /// without Docker, which assumes a Debian base.
    pub observed: bool,
}

impl RuntimeNotes {
    pub fn parse(output: &str) -> Self {
        let mut n = RuntimeNotes {
            observed: true,
            nproc: 1,
            ..Default::default()
        };
        for line in output.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let v = v.trim().to_string();
            match k.trim() {
                "os_id" => n.os_id = v,
                "os_version" => n.os_version = v,
                "os_pretty" => n.os_pretty = v,
                "os_codename" => n.os_codename = v,
                "arch" => n.arch = v,
                "user" => n.user = v,
                "nproc" => n.nproc = v.parse().unwrap_or(1),
                "python3.venv" => n.python_venv = v == "ok",
                k => {
                    if let Some(t) = k.strip_prefix("tool.") {
                        n.tools.insert(t.to_string(), v);
                    } else if let Some(t) = k.strip_prefix("version.") {
                        if !v.is_empty() {
                            n.versions.insert(t.to_string(), v);
                        }
                    } else if let Some(t) = k.strip_prefix("apt_candidate.") {
                        n.apt_candidates.insert(t.to_string(), v);
                    }
                }
            }
        }
        n.package_manager = ["apt-get", "apk", "dnf", "yum"]
            .iter()
            .find(|t| n.tools.contains_key(**t))
            .map(|t| t.trim_end_matches("-get").to_string());
        n
    }

    /// What `env plan` assumes without Docker: the default Debian base image.
    pub fn assumed_debian() -> Self {
        let mut tools = BTreeMap::new();
        for t in ["apt-get", "bash", "setsid"] {
            tools.insert(t.to_string(), format!("/usr/bin/{t}"));
        }
        RuntimeNotes {
            os_id: "debian".into(),
            os_version: "12".into(),
            os_pretty: "Debian GNU/Linux 12 (bookworm) (assumed: no container preflight)".into(),
            arch: "x86_64".into(),
            user: "root".into(),
            nproc: 2,
            package_manager: Some("apt".into()),
            tools,
            observed: false,
            ..Default::default()
        }
    }

    /// The Debian suite of the image: its codename, or the one its version
    /// number stands for.
    pub fn debian_suite(&self) -> Option<String> {
        if !self.os_codename.is_empty() {
            return Some(self.os_codename.clone());
        }
        if self.os_id != "debian" {
            return None;
        }
        let suite = match self.os_version.split('.').next()? {
            "11" => "bullseye",
            "12" => "bookworm",
            "13" => "trixie",
            "14" => "forky",
            _ => return None,
        };
        Some(suite.to_string())
    }

    pub fn has(&self, tool: &str) -> bool {
        self.tools.contains_key(tool)
    }

    /// `major.minor` of a recorded version.
    pub fn major_minor(&self, tool: &str) -> Option<(u32, u32)> {
        parse_major_minor(self.versions.get(tool)?)
    }
}

pub fn parse_major_minor(v: &str) -> Option<(u32, u32)> {
    let mut it = v.trim_start_matches('v').split(['.', '-', '+', '~']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script is plain POSIX sh that only reads: run it on this host.
    #[test]
    fn script_runs_under_sh_and_parses() {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script())
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let n = RuntimeNotes::parse(&text);
        assert!(!n.os_id.is_empty() && n.os_id != "unknown", "{text}");
        assert!(!n.arch.is_empty());
        assert!(n.has("sh") || n.has("bash"), "{text}");
        let has_lists = std::fs::read_dir("/var/lib/apt/lists")
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
            })
            .unwrap_or(false);
        if has_lists && n.has("apt-get") {
            assert!(
                !n.apt_candidates.is_empty(),
                "apt candidates missing:\n{text}"
            );
        }
    }

    #[test]
    fn parses_preflight_output() {
        let out = "os_id=debian\nos_version=12\narch=x86_64\nuser=root\nnproc=2\ntool.apt-get=/usr/bin/apt-get\ntool.python3=/usr/bin/python3\nversion.python3=3.11.2\nversion.node=\ngarbage line\napt_candidate.nodejs=18.19.0+dfsg-6~deb12u2\n";
        let n = RuntimeNotes::parse(out);
        assert!(n.observed);
        assert_eq!(n.package_manager.as_deref(), Some("apt"));
        assert_eq!(n.major_minor("python3"), Some((3, 11)));
        assert!(
            !n.versions.contains_key("node"),
            "empty versions are dropped"
        );
        assert_eq!(n.apt_candidates["nodejs"], "18.19.0+dfsg-6~deb12u2");
    }
}
