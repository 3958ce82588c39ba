//! Offline base images: `debootstrap` from the host's configured apt mirror, then
//! an import through the Engine API. For machines that cannot reach an image
//! registry (air-gapped, mirror-only, or ours).
//!
//! The mirror is read from the host's apt sources, never written into code, and
//! the matching sources are copied into the image so that `apt-get` inside it
//! uses the same mirror.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::SandboxError;

/// The base image belay uses when no `--base-image` / `--base-dockerfile` is given.
pub const DEFAULT_BASE_IMAGE: &str = "belay-base:bookworm";
pub const DEFAULT_SUITE: &str = "bookworm";
/// The image agents run in by default: the base with git and CA certificates
/// (`scripts/setup-host.sh --agents` builds it with `belay image bootstrap --include`).
pub const AGENT_IMAGE: &str = "belay-agent:bookworm";

/// One apt source entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    pub uri: String,
    pub suites: Vec<String>,
    pub components: Vec<String>,
    pub signed_by: Option<String>,
}

/// Parse deb822 (`*.sources`) text. Only `Types: deb` entries are kept.
pub fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for para in text.split("\n\n") {
        let mut types = Vec::new();
        let mut src = AptSource {
            uri: String::new(),
            suites: vec![],
            components: vec![],
            signed_by: None,
        };
        let mut enabled = true;
        for line in para.lines() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let words = || v.split_whitespace().map(String::from).collect::<Vec<_>>();
            match k.trim().to_ascii_lowercase().as_str() {
                "types" => types = words(),
                "uris" => src.uri = words().into_iter().next().unwrap_or_default(),
                "suites" => src.suites = words(),
                "components" => src.components = words(),
                "signed-by" => src.signed_by = Some(v.trim().to_string()),
                "enabled" => enabled = v.trim() != "no",
                _ => {}
            }
        }
        if enabled
            && types.iter().any(|t| t == "deb")
            && !src.uri.is_empty()
            && !src.suites.is_empty()
        {
            out.push(src);
        }
    }
    out
}

/// Parse one-line (`sources.list`) text: `deb [opts] URI SUITE COMPONENTS...`.
pub fn parse_one_line(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut rest = match line.strip_prefix("deb ") {
            Some(r) => r.trim(),
            None => continue,
        };
        let mut signed_by = None;
        if rest.starts_with('[') {
            let Some(end) = rest.find(']') else { continue };
            for opt in rest[1..end].split_whitespace() {
                if let Some(v) = opt.strip_prefix("signed-by=") {
                    signed_by = Some(v.to_string());
                }
            }
            rest = rest[end + 1..].trim();
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        out.push(AptSource {
            uri: uri.to_string(),
            suites: vec![suite.to_string()],
            components: words.map(String::from).collect(),
            signed_by,
        });
    }
    out
}

/// The host's apt sources for `suite` (and its `-updates` / `-security`
/// companions), read from `root`/etc/apt.
pub fn host_sources(root: &Path, suite: &str) -> Vec<AptSource> {
    let related = |s: &str| s == suite || s.strip_prefix(suite).is_some_and(|r| r.starts_with('-'));
    all_host_sources(root)
        .into_iter()
        .filter_map(|mut s| {
            s.suites.retain(|x| related(x));
            (!s.suites.is_empty()).then_some(s)
        })
        .collect()
}

/// Every apt source under `root`/etc/apt, whatever its suite.
pub fn all_host_sources(root: &Path) -> Vec<AptSource> {
    let mut all = Vec::new();
    let apt = root.join("etc/apt");
    if let Ok(t) = fs_err::read_to_string(apt.join("sources.list")) {
        all.extend(parse_one_line(&t));
    }
    if let Ok(rd) = fs_err::read_dir(apt.join("sources.list.d")) {
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let Ok(t) = fs_err::read_to_string(&f) else {
                continue;
            };
            match f.extension().and_then(|e| e.to_str()) {
                Some("sources") => all.extend(parse_deb822(&t)),
                Some("list") => all.extend(parse_one_line(&t)),
                _ => {}
            }
        }
    }
    all
}

/// The mirror to debootstrap from: the first source that carries `suite` itself.
pub fn mirror_for(sources: &[AptSource], suite: &str) -> Option<String> {
    sources
        .iter()
        .find(|s| s.suites.iter().any(|x| x == suite) && s.components.iter().any(|c| c == "main"))
        .map(|s| s.uri.clone())
}

/// Render sources as deb822 for the image. A `Signed-By` keyring that the image
/// lacks is dropped (apt then uses the keyrings the image ships).
pub fn render_sources(sources: &[AptSource], rootfs: &Path) -> String {
    let mut out = String::from("# Written by belay image bootstrap from the host's apt sources.\n");
    for s in sources {
        out.push_str(&format!(
            "\nTypes: deb\nURIs: {}\nSuites: {}\nComponents: {}\n",
            s.uri,
            s.suites.join(" "),
            s.components.join(" ")
        ));
        if let Some(k) = &s.signed_by {
            if k.starts_with('/') && rootfs.join(k.trim_start_matches('/')).exists() {
                out.push_str(&format!("Signed-By: {k}\n"));
            }
        }
    }
    out
}

/// Run `debootstrap --variant=minbase [--include=PKG,…] SUITE DIR MIRROR`
/// as a child in its own process group with an explicit environment.
pub async fn debootstrap(
    suite: &str,
    dir: &Path,
    mirror: &str,
    include: &[String],
    log: &Path,
) -> Result<(), SandboxError> {
    if let Some(bad) = include.iter().find(|p| {
        p.is_empty()
            || !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    }) {
        return Err(SandboxError::Bootstrap(format!(
            "`{bad}` is not a Debian package name"
        )));
    }
    if !which("debootstrap") {
        return Err(SandboxError::Bootstrap(
            "debootstrap is not installed. Install it with `apt-get install -y debootstrap` and retry".into(),
        ));
    }
    if !rustix::process::geteuid().is_root() {
        return Err(SandboxError::Bootstrap(
            "debootstrap needs root to create a root filesystem. Run `belay image bootstrap` as root (or with sudo)".into(),
        ));
    }
    let log_file =
        std::fs::File::create(log).map_err(|e| SandboxError::io("cannot create log", log, e))?;
    let err_file = log_file
        .try_clone()
        .map_err(|e| SandboxError::io("cannot create log", log, e))?;
    let mut cmd = tokio::process::Command::new("debootstrap");
    cmd.arg("--variant=minbase");
    if !include.is_empty() {
        cmd.arg(format!("--include={}", include.join(",")));
    }
    cmd.arg(suite)
        .arg(dir)
        .arg(mirror)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(err_file)
        .process_group(0)
        .kill_on_drop(true);
    for v in crate::trust::PROXY_VARS {
        if let Ok(val) = std::env::var(v) {
            cmd.env(v, val);
        }
    }
    let status = cmd
        .status()
        .await
        .map_err(|e| SandboxError::io("cannot run debootstrap for", dir, e))?;
    if !status.success() {
        let tail = fs_err::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        return Err(SandboxError::Bootstrap(format!(
            "debootstrap of {suite} from {mirror} failed ({status}); check that the mirror is reachable. \
             Last lines of {}:\n{tail}",
            log.display()
        )));
    }
    Ok(())
}

/// The mirror for `suite`: the host's apt source for it, else the host's
/// main Debian source (not a security or vendor one), which serves every suite.
pub fn host_mirror(root: &Path, suite: &str) -> Option<String> {
    let all = all_host_sources(root);
    mirror_for(&host_sources(root, suite), suite).or_else(|| {
        all.iter()
            .find(|s| {
                s.components.iter().any(|c| c == "main")
                    && !s.uri.contains("security")
                    && s.suites.iter().any(|x| !x.contains('-'))
            })
            .map(|s| s.uri.clone())
    })
}

/// What `belay image bootstrap` builds.
#[derive(Debug, Clone)]
pub struct ImageRequest {
    pub suite: String,
    pub tag: String,
    pub include: Vec<String>,
    /// Defaults to [`host_mirror`].
    pub mirror: Option<String>,
    /// Where debootstrap's log and the root filesystem go (removed after).
    pub work_dir: PathBuf,
}

/// Build a base image offline: debootstrap `suite` from the mirror, write the
/// matching apt sources into it, and import it as `tag`. `note` hears what
/// happens. Returns the image id.
pub async fn build_image(
    rt: &dyn crate::ContainerRuntime,
    req: &ImageRequest,
    note: &(dyn Fn(&str) + Send + Sync),
) -> Result<String, SandboxError> {
    let root = Path::new("/");
    let sources = host_sources(root, &req.suite);
    let Some(mirror) = req.mirror.clone().or_else(|| host_mirror(root, &req.suite)) else {
        return Err(SandboxError::Bootstrap(format!(
            "no apt source for suite {} in /etc/apt/sources.list or /etc/apt/sources.list.d; pass --mirror URL",
            req.suite
        )));
    };
    let rootfs = req.work_dir.join("rootfs");
    fs_err::create_dir_all(&req.work_dir)
        .map_err(|e| SandboxError::io("cannot create", &req.work_dir, e))?;
    let log = req.work_dir.join("debootstrap.log");
    note(&format!(
        "debootstrap {} from {mirror} (log: {})",
        req.suite,
        log.display()
    ));
    let result = async {
        debootstrap(&req.suite, &rootfs, &mirror, &req.include, &log).await?;
        let list = if sources.is_empty() {
            vec![AptSource {
                uri: mirror.clone(),
                suites: vec![req.suite.clone()],
                components: vec!["main".into()],
                signed_by: None,
            }]
        } else {
            sources.clone()
        };
        let text = render_sources(&list, &rootfs);
        let apt = rootfs.join("etc/apt");
        let dir = apt.join("sources.list.d");
        fs_err::create_dir_all(&dir).map_err(|e| SandboxError::io("cannot create", &dir, e))?;
        let _ = fs_err::remove_file(apt.join("sources.list"));
        let file = dir.join("belay.sources");
        fs_err::write(&file, text).map_err(|e| SandboxError::io("cannot write", &file, e))?;
        note(&format!("importing {}", req.tag));
        let changes = vec![
            "LABEL belay=true".to_string(),
            "LABEL belay.kind=base".to_string(),
            format!("LABEL belay.suite={}", req.suite),
            "ENV LANG=C.UTF-8".to_string(),
            "CMD [\"bash\"]".to_string(),
        ];
        rt.import_rootfs(&rootfs, &req.tag, changes).await
    }
    .await;
    let _ = fs_err::remove_dir_all(&rootfs);
    if result.is_ok() {
        let _ = fs_err::remove_dir_all(&req.work_dir);
    }
    result
}

pub(crate) fn which(bin: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].iter().map(PathBuf::from))
        .any(|d| d.join(bin).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "Types: deb\n# comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\nTypes: deb\nURIs: https://vendor.example/node\nSuites: nodistro\nComponents: main\n";

    #[test]
    fn picks_the_suite_and_its_companions_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("etc/apt/sources.list.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("debian.sources"), DEB822).unwrap();
        std::fs::write(
            d.join("vendor.list.disabled"),
            "deb http://x.example/ bookworm main\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("etc/apt/sources.list"),
            "deb [signed-by=/k.gpg] http://other.example/ cloud-sdk-bookworm main\n",
        )
        .unwrap();
        let s = host_sources(dir.path(), "bookworm");
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(
            mirror_for(&s, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        let rendered = render_sources(&s, dir.path());
        assert!(rendered.contains("Suites: bookworm-security"));
        assert!(
            !rendered.contains("Signed-By"),
            "keyring absent from rootfs must be dropped"
        );
        assert!(!rendered.contains("nodistro"));
    }

    #[test]
    fn one_line_format() {
        let s = parse_one_line("deb [arch=amd64 signed-by=/a.gpg] http://m/debian bookworm main contrib # x\n# deb http://n/ x y\ndeb-src http://m/ bookworm main\n");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].signed_by.as_deref(), Some("/a.gpg"));
        assert_eq!(s[0].components, vec!["main", "contrib"]);
    }
}
