//! Host trust: CA bundle and proxy settings inherited into build containers.
//!
//! Behind a TLS-inspecting or corporate proxy, nothing that speaks HTTPS installs
//! in a container until it trusts the host's CA bundle. belay keeps the host
//! bundle at a path it owns ([`CONTAINER_CA_PATH`]), so a later
//! `update-ca-certificates` inside the container (triggered by any package that
//! pulls in `ca-certificates`) cannot drop it, and points the CA variables that
//! pip, requests, node, npm, cargo, git and curl read at that path.

use std::path::PathBuf;

use belay_record::Redactor;

/// Where the host CA bundle lives inside containers.
pub const CONTAINER_CA_PATH: &str = "/etc/belay/ca-certificates.crt";

/// Variables pointed at [`CONTAINER_CA_PATH`].
pub const CA_VARS: [&str; 8] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "NPM_CONFIG_CAFILE",
    "CARGO_HTTP_CAINFO",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
];

/// Proxy variables passed through (both spellings are read by different tools).
pub const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// Candidate host bundles, in order (after `SSL_CERT_FILE`).
const HOST_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

#[derive(Debug, Clone, Default)]
pub struct HostTrust {
    pub ca_source: Option<PathBuf>,
    pub ca_bundle: Option<Vec<u8>>,
    pub proxy_env: Vec<(String, String)>,
}

impl HostTrust {
    /// No inheritance (`--no-host-trust`).
    pub fn none() -> Self {
        Self::default()
    }

    /// Read the host's CA bundle and proxy settings.
    pub fn detect() -> Self {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("SSL_CERT_FILE") {
            candidates.push(PathBuf::from(p));
        }
        candidates.extend(HOST_BUNDLES.iter().map(PathBuf::from));
        let mut t = Self::default();
        for c in candidates {
            if let Ok(bytes) = fs_err::read(&c) {
                if !bytes.is_empty() {
                    t.ca_source = Some(c);
                    t.ca_bundle = Some(bytes);
                    break;
                }
            }
        }
        for v in PROXY_VARS {
            if let Ok(val) = std::env::var(v) {
                if !val.is_empty() {
                    t.proxy_env.push((v.to_string(), val));
                }
            }
        }
        t
    }

    pub fn enabled(&self) -> bool {
        self.ca_bundle.is_some() || !self.proxy_env.is_empty()
    }

    /// CA variables for containers: safe to keep in committed images (paths only).
    pub fn ca_env(&self) -> Vec<(String, String)> {
        match &self.ca_bundle {
            Some(_) => CA_VARS
                .iter()
                .map(|v| (v.to_string(), CONTAINER_CA_PATH.to_string()))
                .collect(),
            None => vec![],
        }
    }

    /// Everything for one command: CA variables and proxy settings. Proxies may
    /// carry credentials, so they go to each exec, never into a container's
    /// config, where `docker commit` would bake them into every image.
    pub fn container_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.ca_bundle.is_some() {
            env.extend(
                CA_VARS
                    .iter()
                    .map(|v| (v.to_string(), CONTAINER_CA_PATH.to_string())),
            );
        }
        env.extend(self.proxy_env.iter().cloned());
        env
    }

    /// Files to put into containers.
    pub fn container_files(&self) -> Vec<(String, Vec<u8>, u32)> {
        match &self.ca_bundle {
            Some(b) => vec![(CONTAINER_CA_PATH.to_string(), b.clone(), 0o644)],
            None => vec![],
        }
    }

    /// Proxy URLs may carry credentials: scrub them from everything belay writes.
    pub fn register_secrets(&self, redactor: &mut Redactor) {
        for (k, v) in &self.proxy_env {
            redactor.add_url_credentials(k, v);
        }
    }
}

/// The model keys belay reads by name, scrubbed whatever their length.
pub const MODEL_KEY_VARS: [&str; 5] = [
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "BELAY_LLM_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
];

/// The one redaction policy's host part, the same in every mode: the proxy
/// settings' credentials (which networked sandboxes receive), credentials in
/// any URL-valued variable, every variable whose name says it holds a secret,
/// and the model keys. A mode adds its own named secrets (step and job
/// secrets, the config's keys, `.env` values) to what this returns; it never
/// starts from an empty redactor.
pub fn host_redactor() -> Redactor {
    let mut r = Redactor::default();
    HostTrust::detect().register_secrets(&mut r);
    add_host_env(&mut r, std::env::vars());
    r
}

fn add_host_env(r: &mut Redactor, vars: impl Iterator<Item = (String, String)>) {
    // Collected into one redactor, so that the automaton is built once.
    let mut pairs = Vec::new();
    for (k, v) in vars {
        if v.is_empty() {
            continue;
        }
        if v.contains("://") && v.contains('@') {
            let mut u = Redactor::default();
            u.add_url_credentials(&k, &v);
            pairs.extend(u.secrets().iter().cloned());
        }
        if MODEL_KEY_VARS.contains(&k.as_str()) || (v.len() >= 8 && belay_record::looks_secret(&k))
        {
            pairs.push((k, v));
        }
    }
    r.extend_from(&Redactor::new(pairs));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_policy_covers_proxies_urls_keys_and_secret_names() {
        let mut r = Redactor::default();
        HostTrust {
            proxy_env: vec![(
                "HTTPS_PROXY".into(),
                "http://bob:proxy-pass-123@proxy:3128".into(),
            )],
            ..HostTrust::default()
        }
        .register_secrets(&mut r);
        add_host_env(
            &mut r,
            [
                ("DATABASE_URL", "postgres://app:db-pass-456@db/x"),
                ("GITHUB_TOKEN", "ghp_tokenvalue789"),
                ("OPENAI_API_KEY", "sk-1"),
                ("HOME", "/root"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let out = r.redact("proxy-pass-123 db-pass-456 ghp_tokenvalue789 key=sk-1 home=/root");
        for s in [
            "proxy-pass-123",
            "db-pass-456",
            "ghp_tokenvalue789",
            "sk-1 ",
        ] {
            assert!(!out.contains(s), "{s} in {out}");
        }
        assert!(out.contains("/root"), "{out}");
    }

    #[test]
    fn env_points_every_ca_variable_at_the_owned_path() {
        let t = HostTrust {
            ca_source: Some("/x".into()),
            ca_bundle: Some(b"PEM".to_vec()),
            proxy_env: vec![("HTTPS_PROXY".into(), "http://u:pw12345@p:3128".into())],
        };
        let env = t.container_env();
        for v in CA_VARS {
            assert!(
                env.contains(&(v.to_string(), CONTAINER_CA_PATH.to_string())),
                "{v}"
            );
        }
        assert!(env.iter().any(|(k, _)| k == "HTTPS_PROXY"));
        let mut r = Redactor::default();
        t.register_secrets(&mut r);
        assert!(!r.redact("http://u:pw12345@p:3128").contains("pw12345"));
        assert!(HostTrust::none().container_env().is_empty());
    }
}
