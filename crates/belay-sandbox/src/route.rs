//! The ways out of a sandbox, made on the host and fenced by the firewall:
//!
//! * the **model route**: an internal network whose one way out is either a
//!   TCP forwarder to a model endpoint on the host's loopback, or a proxy that
//!   lets through only the endpoint's host; an agent in the container gets the
//!   base URL (and proxy variables) to use;
//! * the **egress route**: an internal network whose one way out is the
//!   egress proxy with an allow list (the package registries).
//!
//! Either way the host's own ports stay closed to the network but for the
//! forwarder or proxy ([`crate::firewall`]). Dropping the [`Route`] closes it.

use std::net::{IpAddr, SocketAddr};

use crate::egress::{url_host, url_port, Allow, EgressProxy, TcpForward};
use crate::firewall::Firewall;
use crate::{ContainerRuntime, NetworkInfo, SandboxError};

/// An open route. The network stays; the forwarder, proxy and fence live as
/// long as this value.
pub struct Route {
    /// The internal network containers join to use the route.
    pub network: String,
    /// The model route: the base URL to give the agent. The egress route: the
    /// proxy's URL.
    pub url: String,
    /// Variables for the container (the proxy settings, where a proxy is the
    /// way out).
    pub env: Vec<(String, String)>,
    /// What the proxy lets through (none for a forwarder).
    pub allow: Option<Allow>,
    forward: Option<TcpForward>,
    proxy: Option<EgressProxy>,
    fence: Firewall,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("network", &self.network)
            .field("url", &self.url)
            .finish()
    }
}

impl Route {
    /// The firewall chain that fences the network.
    pub fn firewall_chain(&self) -> &str {
        self.fence.chain()
    }

    /// The proxy's decisions since the last call (none for a forwarder).
    pub fn drain_decisions(&self) -> Vec<crate::egress::Decision> {
        self.proxy.as_ref().map(|p| p.drain()).unwrap_or_default()
    }

    /// Whether the way out is a forwarder (a loopback endpoint).
    pub fn is_forward(&self) -> bool {
        self.forward.is_some()
    }
}

fn infra(msg: String) -> SandboxError {
    SandboxError::Route(msg)
}

/// The internal network `name` and the host's address on it.
async fn internal_network(
    rt: &dyn ContainerRuntime,
    name: &str,
) -> Result<(NetworkInfo, IpAddr), SandboxError> {
    let info = rt.ensure_network(name, true).await?;
    let ip: IpAddr = info.gateway.parse().map_err(|_| {
        infra(format!(
            "network {name} has no usable gateway ({}): remove it (`docker network rm {name}`) and rerun",
            info.gateway
        ))
    })?;
    Ok((info, ip))
}

/// Fence `net` so that only `allowed` on the host is reachable from it.
fn fence(net: &str, info: &NetworkInfo, allowed: SocketAddr) -> Result<Firewall, SandboxError> {
    let bridge = info.bridge.as_deref().ok_or_else(|| {
        infra(format!(
            "network {net} has no bridge interface belay can fence: remove it (`docker network rm {net}`) and rerun"
        ))
    })?;
    Firewall::lock(bridge, allowed.ip(), &[allowed.port()])
}

const START_HINT: &str = "The internal network's gateway must be an address of this host: remove the network (`docker network rm`) and rerun";

fn proxy_env(url: &str) -> Vec<(String, String)> {
    ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|k| (k.to_string(), url.to_string()))
        .collect()
}

/// The model route for `base_url` on the internal network `network`.
pub async fn model_route(
    rt: &dyn ContainerRuntime,
    network: &str,
    base_url: &str,
) -> Result<Route, SandboxError> {
    let host = url_host(base_url).ok_or_else(|| {
        SandboxError::BadUrl(format!(
            "the model base URL `{base_url}` has no host: give a URL such as http://127.0.0.1:8081/v1"
        ))
    })?;
    let (info, ip) = internal_network(rt, network).await?;
    let (scheme, rest) = base_url.split_once("://").unwrap_or(("http", base_url));
    let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("");
    let loopback = host == "localhost" || host.starts_with("127.") || host == "::1";
    if loopback {
        let default_port = if scheme == "https" { 443 } else { 80 };
        let port = url_port(base_url).unwrap_or(default_port);
        let upstream = if host == "::1" {
            format!("[::1]:{port}")
        } else {
            format!("127.0.0.1:{port}")
        };
        let fwd = TcpForward::start(SocketAddr::new(ip, 0), upstream)
            .await
            .map_err(|e| {
                infra(format!(
                    "cannot forward to the model endpoint: {e}. {START_HINT}"
                ))
            })?;
        let fence = fence(network, &info, fwd.addr)?;
        return Ok(Route {
            network: network.to_string(),
            url: format!("{scheme}://{}{path}", fwd.addr),
            env: Vec::new(),
            allow: None,
            forward: Some(fwd),
            proxy: None,
            fence,
        });
    }
    let allow = Allow::hosts([host], url_port(base_url));
    let proxy = EgressProxy::start(SocketAddr::new(ip, 0), allow.clone())
        .await
        .map_err(|e| infra(format!("cannot start the model proxy: {e}. {START_HINT}")))?;
    let purl = format!("http://{}", proxy.addr);
    let fence = fence(network, &info, proxy.addr)?;
    Ok(Route {
        network: network.to_string(),
        url: base_url.to_string(),
        env: proxy_env(&purl),
        allow: Some(allow),
        forward: None,
        proxy: Some(proxy),
        fence,
    })
}

/// The egress route on the internal network `network`: its only way out is
/// the proxy with `allow`.
pub async fn egress_route(
    rt: &dyn ContainerRuntime,
    network: &str,
    allow: Allow,
) -> Result<Route, SandboxError> {
    let (info, ip) = internal_network(rt, network).await?;
    let proxy = EgressProxy::start(SocketAddr::new(ip, 0), allow.clone())
        .await
        .map_err(|e| {
            infra(format!(
                "cannot start the egress proxy on {ip}: {e}. {START_HINT}"
            ))
        })?;
    let url = format!("http://{}", proxy.addr);
    let fence = fence(network, &info, proxy.addr)?;
    Ok(Route {
        network: network.to_string(),
        env: proxy_env(&url),
        url,
        allow: Some(allow),
        forward: None,
        proxy: Some(proxy),
        fence,
    })
}
