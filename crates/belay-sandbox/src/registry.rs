//! Images in an OCI registry: the operations a checkpoint store needs (push,
//! pull, a manifest lookup without a download), the registry address belay
//! accepts, and the engine credentials of that registry.
//!
//! The engine does the talking: a push or pull goes through the Engine API, so
//! the daemon's own rules apply (plain HTTP only to loopback or to its
//! `insecure-registries`), and a lookup is the engine's distribution inspect,
//! one manifest HEAD that downloads nothing.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;

pub use crate::distribution::RemoteImage;
use crate::SandboxError;

/// What one push did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct PushReport {
    /// The manifest digest the registry answered with.
    pub digest: Option<String>,
    /// Layers uploaded.
    pub layers_pushed: u32,
    /// Layers the registry had already (or mounted from another repository).
    pub layers_existing: u32,
    pub duration_ms: u64,
}

/// Image operations against a registry, through the engine.
#[async_trait]
pub trait ImageRegistry: Send + Sync {
    /// Push `image_ref` (`host[:port]/repo:tag`, present on the engine).
    async fn push(&self, image_ref: &str) -> Result<PushReport, SandboxError>;
    /// Pull `image_ref`. `Ok(false)`: the registry has no such tag.
    async fn pull(&self, image_ref: &str) -> Result<bool, SandboxError>;
    /// The manifest digest of `image_ref` in its registry, downloading
    /// nothing. `Ok(None)`: no such tag.
    async fn remote_digest(&self, image_ref: &str) -> Result<Option<String>, SandboxError>;
    /// Give the local image `image` (id or ref) the name `new_ref` too.
    async fn tag(&self, image: &str, new_ref: &str) -> Result<(), SandboxError>;
    /// Remove the local name `image_ref` (the image stays while another name
    /// or a child needs it).
    async fn untag(&self, image_ref: &str) -> Result<(), SandboxError>;
    /// The image `image_ref` names in its registry, with its labels, read
    /// straight from the registry without pulling anything
    /// ([`crate::distribution`]). `Ok(None)`: no such tag. An error means
    /// only that this cannot be read directly (the registry is not
    /// reachable from here, or not over the protocol tried): the caller falls
    /// back to the engine.
    async fn remote_image(&self, image_ref: &str) -> Result<Option<RemoteImage>, SandboxError> {
        Err(no_direct_access(image_ref))
    }
    /// Give `image`, read by [`ImageRegistry::remote_image`] from `src`, the
    /// name `dst` in the same registry, without pulling it. Returns the
    /// manifest digest.
    async fn remote_tag(
        &self,
        src: &str,
        image: &RemoteImage,
        dst: &str,
    ) -> Result<String, SandboxError> {
        let _ = (src, image);
        Err(no_direct_access(dst))
    }
}

fn no_direct_access(image_ref: &str) -> SandboxError {
    SandboxError::Registry {
        op: "read",
        image: image_ref.to_string(),
        message: "this store does not read registries directly".into(),
    }
}

/// How long one push or pull may take before it counts as failed.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long a manifest lookup may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Check a `--registry` value: `host[:port]`, optionally with a path prefix
/// (`host:5000/team`), no scheme. Returns it without a trailing slash.
pub fn parse_registry(s: &str) -> Result<String, SandboxError> {
    let bad = |why: &str| {
        SandboxError::BadUrl(format!(
            "--registry {s:?}: {why}. Give the registry as host[:port] (for example 127.0.0.1:5000), \
             optionally with a repository prefix (registry.example:5000/team)"
        ))
    };
    let s = s.trim().trim_end_matches('/');
    if s.is_empty() {
        return Err(bad("it is empty"));
    }
    if s.contains("://") {
        return Err(bad("a scheme is not part of it (the engine picks HTTPS, or plain HTTP for loopback and its insecure-registries)"));
    }
    let (host, path) = s.split_once('/').unwrap_or((s, ""));
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
    {
        return Err(bad("its host is not a host name or IPv4 address"));
    }
    // Docker reads the first path component as a registry only when it has a
    // dot or a port, or is localhost; anything else would name a Docker Hub
    // repository and push there.
    if port.is_none() && !name.contains('.') && name != "localhost" {
        return Err(bad(
            "a host without a dot or a port would be read as a Docker Hub repository",
        ));
    }
    if let Some(p) = port {
        if p.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(bad("its port is not a number from 1 to 65535"));
        }
    }
    if !path.is_empty()
        && !path.split('/').all(|c| {
            !c.is_empty()
                && c.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ".-".contains(ch))
        })
    {
        return Err(bad(
            "its repository prefix may only hold lowercase letters, digits, '.', '-' and '/'",
        ));
    }
    // Host names are case-blind, and image names must be lowercase.
    Ok(s.to_ascii_lowercase())
}

/// The registry host of an image ref, when it names one (`host:5000/x:t`).
pub fn registry_host(image_ref: &str) -> Option<&str> {
    let (first, rest) = image_ref.split_once('/')?;
    (!rest.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost"))
        .then_some(first)
}

/// The engine credentials for `host` from the Docker client's config
/// (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`): its `auths`
/// entry, as `docker login` writes it. Credential helpers are not read.
pub fn credentials_for(host: &str) -> Option<(String, String)> {
    let path = match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => PathBuf::from(d).join("config.json"),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".docker/config.json"),
    };
    let text = fs_err::read_to_string(&path).ok()?;
    credentials_in(&text, host)
}

fn credentials_in(config: &str, host: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(config).ok()?;
    let auths = v.get("auths")?.as_object()?;
    let entry = auths.iter().find_map(|(k, e)| {
        let k = k
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('/');
        (k == host).then_some(e)
    })?;
    let auth = entry.get("auth")?.as_str()?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let (user, pass) = raw.split_once(':')?;
    Some((user.to_string(), pass.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_host_and_port_with_an_optional_prefix() {
        assert_eq!(parse_registry("127.0.0.1:5000").unwrap(), "127.0.0.1:5000");
        assert_eq!(parse_registry("localhost:5000/").unwrap(), "localhost:5000");
        assert_eq!(
            parse_registry("Reg.Example:5000").unwrap(),
            "reg.example:5000"
        );
        assert_eq!(
            parse_registry("reg.example.com/team/envs").unwrap(),
            "reg.example.com/team/envs"
        );
        for bad in [
            "",
            "http://127.0.0.1:5000",
            "myregistry",
            "host:notaport",
            "host:0",
            "reg.example.com/Team",
            "reg.example.com//x",
            "reg.example.com/under_score",
            "we ird:5000",
        ] {
            let e = parse_registry(bad).unwrap_err().to_string();
            assert!(e.contains("host[:port]"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_registry_of_a_ref() {
        assert_eq!(
            registry_host("127.0.0.1:5000/belay:r-001-x-success"),
            Some("127.0.0.1:5000")
        );
        assert_eq!(registry_host("localhost/belay:x"), Some("localhost"));
        assert_eq!(registry_host("belay:r-001-x-success"), None);
        assert_eq!(registry_host("library/debian:12"), None);
    }

    #[test]
    fn credentials_come_from_the_auths_entry() {
        let auth = base64::engine::general_purpose::STANDARD.encode("ci:s3cret:with-colon");
        let cfg = format!(
            r#"{{"auths": {{"https://reg.example:5000/": {{"auth": "{auth}"}}, "other": {{}}}}}}"#
        );
        assert_eq!(
            credentials_in(&cfg, "reg.example:5000"),
            Some(("ci".into(), "s3cret:with-colon".into()))
        );
        assert_eq!(credentials_in(&cfg, "127.0.0.1:5000"), None);
        assert_eq!(credentials_in("not json", "reg.example:5000"), None);
    }
}
