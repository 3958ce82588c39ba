//! [`ImageRegistry`] over the Engine API: push, pull and distribution inspect.
//!
//! A registry's refusal (it is down, the tag is unknown, a push is denied)
//! comes back from the daemon as an error response or a stream error. It is
//! the registry's failure, not the engine's, so it never makes the runtime's
//! infra failure sticky; only a daemon that stops answering does.

use std::time::Instant;

use async_trait::async_trait;
use bollard::auth::DockerCredentials;
use bollard::query_parameters as qp;
use futures_util::StreamExt;

use std::sync::Arc;

use super::DockerRuntime;
use crate::distribution::{is_loopback_host, Distribution, RemoteImage};
use crate::infra::classify_api_error;
use crate::registry::{
    credentials_for, registry_host, ImageRegistry, PushReport, LOOKUP_TIMEOUT, TRANSFER_TIMEOUT,
};
use crate::{split_image_ref, SandboxError};

impl DockerRuntime {
    pub(super) fn credentials(&self, image_ref: &str) -> Option<DockerCredentials> {
        let host = registry_host(image_ref)?;
        let (username, password) = credentials_for(host)?;
        Some(DockerCredentials {
            username: Some(username),
            password: Some(password),
            serveraddress: Some(host.to_string()),
            ..Default::default()
        })
    }

    /// A failed registry request: the daemon's own failure (it is gone) is
    /// sticky infra; anything the daemon reports back is the registry's.
    fn registry_err(
        &self,
        op: &'static str,
        image_ref: &str,
        e: bollard::errors::Error,
    ) -> SandboxError {
        use bollard::errors::Error as E;
        match &e {
            E::DockerResponseServerError { .. } | E::DockerStreamError { .. } => {}
            _ => {
                if let Some(f) = classify_api_error(&e) {
                    return SandboxError::Infra(self.sticky.raise(f));
                }
            }
        }
        SandboxError::Registry {
            op,
            image: image_ref.to_string(),
            message: super::docker_message(&e),
        }
    }
}

/// The daemon's words for "the registry has no such tag (or repository)".
fn is_unknown(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    let msg = match e {
        E::DockerResponseServerError {
            status_code: 404, ..
        } => return true,
        E::DockerResponseServerError { message, .. } => message,
        E::DockerStreamError { error } => error,
        _ => return false,
    };
    let m = msg.to_ascii_lowercase();
    m.contains("manifest unknown") || m.contains("name unknown") || m.contains("not found")
}

fn timed_out(op: &'static str, image_ref: &str, secs: u64) -> SandboxError {
    SandboxError::Registry {
        op,
        image: image_ref.to_string(),
        message: format!("no answer within {secs} s"),
    }
}

#[async_trait]
impl ImageRegistry for DockerRuntime {
    async fn push(&self, image_ref: &str) -> Result<PushReport, SandboxError> {
        self.check()?;
        let t0 = Instant::now();
        let (repo, tag) = split_image_ref(image_ref);
        let opts = qp::PushImageOptions {
            tag: Some(tag.to_string()),
            platform: None,
        };
        let work = async {
            let mut report = PushReport::default();
            let mut stream = self
                .slow
                .push_image(repo, Some(opts), self.credentials(image_ref));
            while let Some(item) = stream.next().await {
                let info = item.map_err(|e| self.registry_err("push", image_ref, e))?;
                let status = info.status.unwrap_or_default();
                if status == "Pushed" {
                    report.layers_pushed += 1;
                } else if status == "Layer already exists" || status.starts_with("Mounted from") {
                    report.layers_existing += 1;
                } else if let Some(d) = status
                    .split_once(": digest: ")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                {
                    report.digest = Some(d.to_string());
                }
            }
            Ok::<_, SandboxError>(report)
        };
        let mut report = tokio::time::timeout(TRANSFER_TIMEOUT, work)
            .await
            .map_err(|_| timed_out("push", image_ref, TRANSFER_TIMEOUT.as_secs()))??;
        if report.digest.is_none() {
            return Err(SandboxError::Registry {
                op: "push",
                image: image_ref.to_string(),
                message: "the engine finished without the registry's digest".into(),
            });
        }
        report.duration_ms = t0.elapsed().as_millis() as u64;
        Ok(report)
    }

    async fn pull(&self, image_ref: &str) -> Result<bool, SandboxError> {
        self.check()?;
        let (repo, tag) = split_image_ref(image_ref);
        let opts = qp::CreateImageOptions {
            from_image: Some(repo.to_string()),
            tag: Some(tag.to_string()),
            ..Default::default()
        };
        let work = async {
            let mut stream = self
                .slow
                .create_image(Some(opts), None, self.credentials(image_ref));
            while let Some(item) = stream.next().await {
                match item {
                    Ok(_) => {}
                    Err(e) if is_unknown(&e) => return Ok(false),
                    Err(e) => return Err(self.registry_err("pull", image_ref, e)),
                }
            }
            Ok(true)
        };
        tokio::time::timeout(TRANSFER_TIMEOUT, work)
            .await
            .map_err(|_| timed_out("pull", image_ref, TRANSFER_TIMEOUT.as_secs()))?
    }

    async fn remote_digest(&self, image_ref: &str) -> Result<Option<String>, SandboxError> {
        self.check()?;
        let work = self
            .docker
            .inspect_registry_image(image_ref, self.credentials(image_ref));
        match tokio::time::timeout(LOOKUP_TIMEOUT, work).await {
            Err(_) => Err(timed_out("look up", image_ref, LOOKUP_TIMEOUT.as_secs())),
            Ok(Ok(d)) => Ok(d.descriptor.digest),
            Ok(Err(e)) if is_unknown(&e) => Ok(None),
            Ok(Err(e)) => Err(self.registry_err("look up", image_ref, e)),
        }
    }

    async fn tag(&self, image: &str, new_ref: &str) -> Result<(), SandboxError> {
        crate::ContainerRuntime::tag_image(self, image, new_ref).await
    }

    async fn untag(&self, image_ref: &str) -> Result<(), SandboxError> {
        crate::ContainerRuntime::remove_image(self, image_ref).await
    }

    async fn remote_image(&self, image_ref: &str) -> Result<Option<RemoteImage>, SandboxError> {
        self.distribution(image_ref).await?.image(image_ref).await
    }

    async fn remote_tag(
        &self,
        src: &str,
        image: &RemoteImage,
        dst: &str,
    ) -> Result<String, SandboxError> {
        self.distribution(dst).await?.tag(src, image, dst).await
    }
}

impl DockerRuntime {
    /// The direct client of `image_ref`'s registry, speaking plain HTTP where
    /// the engine does: to loopback, and to the registries the daemon lists
    /// as insecure (by name, or by an IP address in its insecure ranges).
    async fn distribution(&self, image_ref: &str) -> Result<Arc<Distribution>, SandboxError> {
        let host = registry_host(image_ref)
            .ok_or_else(|| SandboxError::Registry {
                op: "read",
                image: image_ref.to_string(),
                message: "it names no registry".into(),
            })?
            .to_string();
        let mut clients = self.distributions.lock().await;
        if let Some(c) = clients.get(&host) {
            return Ok(c.clone());
        }
        let plain = is_loopback_host(&host) || {
            let cfg = self
                .docker
                .info()
                .await
                .map_err(|e| self.registry_err("read", image_ref, e))?
                .registry_config
                .unwrap_or_default();
            insecure_in(&cfg, &host)
        };
        let c = Arc::new(Distribution::new(&host, plain)?);
        clients.insert(host, c.clone());
        Ok(c)
    }
}

/// Whether the daemon's registry config makes `host` insecure: listed with
/// `Secure: false`, or an IP address inside one of its insecure ranges.
fn insecure_in(cfg: &bollard::models::RegistryServiceConfig, host: &str) -> bool {
    if cfg
        .index_configs
        .as_ref()
        .and_then(|m| m.get(host))
        .and_then(|i| i.secure)
        == Some(false)
    {
        return true;
    }
    let name = host.rsplit_once(':').map_or(host, |(n, _)| n);
    let Ok(ip) = name
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    else {
        return false;
    };
    cfg.insecure_registry_cidrs
        .iter()
        .flatten()
        .any(|c| in_cidr(ip, c))
}

fn in_cidr(ip: std::net::IpAddr, cidr: &str) -> bool {
    use std::net::IpAddr;
    let Some((net, bits)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(bits)) = (net.parse::<IpAddr>(), bits.parse::<u32>()) else {
        return false;
    };
    let (a, b, width) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u32::from(a) as u128, u32::from(b) as u128, 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    if bits > width {
        return false;
    }
    let shift = width - bits;
    shift >= 128 || (a >> shift) == (b >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insecure_registries_by_name_and_by_range() {
        let mut cfg = bollard::models::RegistryServiceConfig {
            insecure_registry_cidrs: Some(vec!["127.0.0.0/8".into(), "10.1.0.0/16".into()]),
            ..Default::default()
        };
        cfg.index_configs = Some(
            [(
                "reg.lan:5000".to_string(),
                bollard::models::IndexInfo {
                    secure: Some(false),
                    ..Default::default()
                },
            )]
            .into_iter()
            .collect(),
        );
        assert!(insecure_in(&cfg, "reg.lan:5000"));
        assert!(insecure_in(&cfg, "10.1.2.3:5000"));
        assert!(!insecure_in(&cfg, "10.2.0.1:5000"));
        assert!(!insecure_in(&cfg, "reg.example:5000"));
        assert!(in_cidr("::1".parse().unwrap(), "::1/128"));
        assert!(in_cidr("10.0.0.1".parse().unwrap(), "0.0.0.0/0"));
        assert!(!in_cidr("10.0.0.1".parse().unwrap(), "10.0.0.0/33"));
    }
}
