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
//! forwarder or proxy ([`crate::firewall`]). [`Route::close`] closes it.
//!
//! Where the host holds the internal network's gateway (Docker on Linux), the
//! forwarder or proxy listens there. Where it does not (Podman's internal
//! networks have no gateway; a VM-backed engine such as Docker Desktop,
//! OrbStack or Colima keeps its networks inside the VM), a **relay**
//! container on the route's network carries the bytes to it: the relay is
//! belay's own binary (`belay relay`), unprivileged, on a second, fenced
//! network whose gateway the host holds (or, inside a VM, reaching the
//! host through `host.docker.internal`). `BELAY_NET_RELAY=1` uses the relay
//! on any engine.

use std::net::{IpAddr, SocketAddr};

use crate::egress::{url_host, url_port, Allow, EgressProxy, TcpForward};
use crate::firewall::{Firewall, Forwarded};
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
    fence: Option<Firewall>,
    /// In relay mode: the steps' network closed to the host entirely.
    inner_fence: Option<Firewall>,
    /// The relay container and its uplink network, in relay mode.
    relay: Option<(String, String)>,
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
    /// The firewall chain that fences the network (empty inside a VM-backed
    /// engine, where the host has no bridge to fence).
    pub fn firewall_chain(&self) -> &str {
        self.fence.as_ref().map(Firewall::chain).unwrap_or("")
    }

    /// The relay container, when the route goes through one.
    pub fn relay(&self) -> Option<&str> {
        self.relay.as_ref().map(|(c, _)| c.as_str())
    }

    /// Close the route: the listener and the fence go, the relay and its
    /// uplink are removed, then the route's network.
    pub async fn close(self, rt: &dyn ContainerRuntime) {
        let Route {
            network,
            forward,
            proxy,
            fence,
            inner_fence,
            relay,
            ..
        } = self;
        drop((forward, proxy, fence, inner_fence));
        if let Some((c, up)) = relay {
            let _ = rt.remove(&c).await;
            let _ = rt.remove_network(&up).await;
        }
        let _ = rt.remove_network(&network).await;
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

/// The relay's program inside its container, and its port there.
const RELAY_BIN: &str = "/opt/belay/belay";
pub const RELAY_PORT: u16 = 3128;

/// Whether `BELAY_NET_RELAY=1` asks for the relay on any engine.
fn relay_forced() -> bool {
    std::env::var_os("BELAY_NET_RELAY").is_some_and(|v| v == "1")
}

/// Fence `net` so that only `allowed` on the host is reachable from it.
fn fence(
    net: &str,
    info: &NetworkInfo,
    allowed: SocketAddr,
    forwarded: Forwarded,
) -> Result<Firewall, SandboxError> {
    let bridge = info.bridge.as_deref().ok_or_else(|| {
        infra(format!(
            "network {net} has no bridge interface belay can fence: remove it (`docker network rm {net}`) and rerun"
        ))
    })?;
    Firewall::lock(bridge, allowed.ip(), &[allowed.port()], forwarded)
}

/// What listens on the host side of a route.
enum Listen {
    /// A TCP forwarder to this upstream.
    Forward(String),
    /// The allowlisting proxy.
    Proxy(Allow),
}

enum Listener {
    Forward(TcpForward),
    Proxy(EgressProxy),
}

impl Listener {
    fn addr(&self) -> SocketAddr {
        match self {
            Listener::Forward(f) => f.addr,
            Listener::Proxy(p) => p.addr,
        }
    }
}

async fn listen(what: &Listen, bind: SocketAddr) -> std::io::Result<Listener> {
    Ok(match what {
        Listen::Forward(up) => Listener::Forward(TcpForward::start(bind, up.clone()).await?),
        Listen::Proxy(allow) => Listener::Proxy(EgressProxy::start(bind, allow.clone()).await?),
    })
}

/// An attached route: the listener, where containers on the network reach
/// it, the fence, and the relay.
struct Attached {
    listener: Listener,
    reach: SocketAddr,
    fence: Option<Firewall>,
    /// In relay mode: the steps' network closed to the host entirely.
    inner_fence: Option<Firewall>,
    relay: Option<(String, String)>,
}

/// The run id in a route's network name (`belay-<run>-<what>`).
fn run_of(network: &str) -> String {
    let n = network.strip_prefix("belay-").unwrap_or(network);
    n.rsplit_once('-').map(|(r, _)| r).unwrap_or(n).to_string()
}

/// Make the internal network, start the listener where its containers can
/// reach it (the gateway, or through a relay), and fence what they reach.
async fn attach(
    rt: &dyn ContainerRuntime,
    network: &str,
    what: Listen,
) -> Result<Attached, SandboxError> {
    let info = rt.ensure_network(network, true).await?;
    let gateway: Option<IpAddr> = info.gateway.parse().ok().filter(|_| !relay_forced());
    if let Some(ip) = gateway {
        if let Ok(listener) = listen(&what, SocketAddr::new(ip, 0)).await {
            let fence = fence(network, &info, listener.addr(), Forwarded::Refuse)?;
            return Ok(Attached {
                reach: listener.addr(),
                listener,
                fence: Some(fence),
                inner_fence: None,
                relay: None,
            });
        }
    }
    // The relay: on an uplink network whose gateway the host holds (fenced
    // to the listener), or inside a VM, through host.docker.internal.
    let up = format!("{network}-up");
    let up_info = rt.ensure_network(&up, false).await?;
    match relay_attach(rt, network, &info, &up, &up_info, &what).await {
        Ok(a) => Ok(a),
        Err(e) => {
            let _ = rt.remove_network(&up).await;
            Err(e)
        }
    }
}

/// The steps' internal network in relay mode: whatever address the host has
/// on it (Docker's gateway with `BELAY_NET_RELAY=1`, an engine's DNS server)
/// is closed to it entirely; steps reach only the relay. Where the host has
/// no interface for the network (inside a VM), there is nothing to close.
fn close_internal(network: &str, info: &NetworkInfo) -> Result<Option<Firewall>, SandboxError> {
    let Some(bridge) = info.bridge.as_deref() else {
        return Ok(None);
    };
    if !std::path::Path::new("/sys/class/net").join(bridge).exists() {
        return Ok(None);
    }
    let _ = network;
    Firewall::lock(bridge, IpAddr::from([0, 0, 0, 0]), &[], Forwarded::Refuse).map(Some)
}

async fn relay_attach(
    rt: &dyn ContainerRuntime,
    network: &str,
    info: &NetworkInfo,
    up: &str,
    up_info: &NetworkInfo,
    what: &Listen,
) -> Result<Attached, SandboxError> {
    if let Ok(gw) = up_info.gateway.parse::<IpAddr>() {
        // Some engines (Podman) raise the bridge only when a container joins:
        // the relay is made first, then the listener binds its target.
        let port = free_port()?;
        let target = SocketAddr::new(gw, port);
        let relay = start_relay(rt, network, up, &target.to_string(), vec![]).await?;
        let mut bound = None;
        let mut not_local = false;
        for _ in 0..40 {
            match listen(what, target).await {
                Ok(l) => {
                    bound = Some(l);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    let _ = rt.remove(&relay.0).await;
                    return Err(infra(format!(
                        "the port chosen for the route ({target}) was taken meanwhile: rerun"
                    )));
                }
                Err(e) => not_local = e.kind() == std::io::ErrorKind::AddrNotAvailable,
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        match bound {
            Some(listener) => {
                let fenced = fence(up, up_info, listener.addr(), Forwarded::Pass)
                    .and_then(|f| Ok((f, close_internal(network, info)?)));
                let (fence, inner) = match fenced {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = rt.remove(&relay.0).await;
                        return Err(e);
                    }
                };
                return Ok(Attached {
                    listener,
                    reach: relay.1,
                    fence: Some(fence),
                    inner_fence: inner,
                    relay: Some((relay.0, up.to_string())),
                });
            }
            None => {
                let _ = rt.remove(&relay.0).await;
                if !not_local {
                    return Err(infra(format!(
                        "cannot listen on the uplink {up}'s gateway {gw}"
                    )));
                }
                // The gateway is not this host's: a VM-backed engine.
            }
        }
    }
    let listener = listen(what, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(|e| {
            infra(format!(
                "cannot start the route's listener on 127.0.0.1: {e}"
            ))
        })?;
    let target = format!("host.docker.internal:{}", listener.addr().port());
    let relay = start_relay(
        rt,
        network,
        up,
        &target,
        vec!["host.docker.internal:host-gateway".to_string()],
    )
    .await?;
    Ok(Attached {
        listener,
        reach: relay.1,
        fence: None,
        inner_fence: None,
        relay: Some((relay.0, up.to_string())),
    })
}

/// A free port number on this host (to bind once the relay is up).
fn free_port() -> Result<u16, SandboxError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| infra(format!("cannot find a free port for the route: {e}")))
}

/// The relay container on `up`, joined to `network`, carrying to `target`:
/// its id, and where containers on `network` reach it.
async fn start_relay(
    rt: &dyn ContainerRuntime,
    network: &str,
    up: &str,
    target: &str,
    extra_hosts: Vec<String>,
) -> Result<(String, SocketAddr), SandboxError> {
    // belay's own binary; on a host that is not Linux (a VM-backed engine on
    // macOS), BELAY_RELAY_BIN names a Linux build of belay.
    let exe = match std::env::var_os("BELAY_RELAY_BIN") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::env::current_exe()
            .map_err(|e| infra(format!("cannot find belay's own binary for the relay: {e}")))?,
    };
    let relay = rt
        .create(&crate::ContainerSpec {
            image: crate::bootstrap::DEFAULT_BASE_IMAGE.into(),
            run_id: run_of(network),
            kind: "relay".into(),
            network_name: Some(up.to_string()),
            mounts: vec![crate::Mount {
                host: exe,
                container: RELAY_BIN.into(),
                read_only: true,
            }],
            read_only_rootfs: true,
            drop_capabilities: true,
            memory_bytes: Some(128 << 20),
            pids_limit: Some(64),
            idle_user: Some("65534:65534".into()),
            extra_hosts,
            cmd: Some(vec![
                RELAY_BIN.into(),
                "relay".into(),
                "--listen".into(),
                format!("0.0.0.0:{RELAY_PORT}"),
                "--to".into(),
                target.to_string(),
            ]),
            ..Default::default()
        })
        .await?;
    let ip = match rt.connect_network(&relay, network).await {
        Ok(ip) => ip,
        Err(e) => {
            let _ = rt.remove(&relay).await;
            return Err(e);
        }
    };
    match ip.parse::<IpAddr>() {
        Ok(ip) => Ok((relay, SocketAddr::new(ip, RELAY_PORT))),
        Err(_) => {
            let _ = rt.remove(&relay).await;
            Err(infra(format!(
                "the relay's address on {network} is `{ip}`, not an IP"
            )))
        }
    }
}

impl Attached {
    fn into_route(
        self,
        network: &str,
        url: String,
        env: Vec<(String, String)>,
        allow: Option<Allow>,
    ) -> Route {
        let (forward, proxy) = match self.listener {
            Listener::Forward(f) => (Some(f), None),
            Listener::Proxy(p) => (None, Some(p)),
        };
        Route {
            network: network.to_string(),
            url,
            env,
            allow,
            forward,
            proxy,
            fence: self.fence,
            inner_fence: self.inner_fence,
            relay: self.relay,
        }
    }
}

const START_HINT: &str = "Check the engine's networks (`docker network ls`, `docker network inspect`), remove the run's `belay-<run>-…` networks and rerun";

fn proxy_env(url: &str) -> Vec<(String, String)> {
    ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|k| (k.to_string(), url.to_string()))
        .collect()
}

/// A base URL's scheme and path (`http`, `/v1`).
fn scheme_and_path(base_url: &str) -> (&str, &str) {
    let (scheme, rest) = base_url.split_once("://").unwrap_or(("http", base_url));
    (scheme, rest.find('/').map(|i| &rest[i..]).unwrap_or(""))
}

/// Where to forward to, for a model endpoint on the host's loopback
/// (`host` is the URL's); `None` for any other host (a proxy lets it through).
fn loopback_upstream(base_url: &str, host: &str) -> Option<String> {
    if !(host == "localhost" || host.starts_with("127.") || host == "::1") {
        return None;
    }
    let (scheme, _) = scheme_and_path(base_url);
    let port = url_port(base_url).unwrap_or(if scheme == "https" { 443 } else { 80 });
    Some(if host == "::1" {
        format!("[::1]:{port}")
    } else {
        format!("127.0.0.1:{port}")
    })
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
    let (scheme, path) = scheme_and_path(base_url);
    if let Some(upstream) = loopback_upstream(base_url, &host) {
        let a = attach(rt, network, Listen::Forward(upstream))
            .await
            .map_err(|e| hint(e, "cannot forward to the model endpoint"))?;
        let url = format!("{scheme}://{}{path}", a.reach);
        return Ok(a.into_route(network, url, Vec::new(), None));
    }
    let allow = Allow::hosts([host], url_port(base_url));
    let a = attach(rt, network, Listen::Proxy(allow.clone()))
        .await
        .map_err(|e| hint(e, "cannot start the model proxy"))?;
    let purl = format!("http://{}", a.reach);
    Ok(a.into_route(network, base_url.to_string(), proxy_env(&purl), Some(allow)))
}

/// The egress route on the internal network `network`: its only way out is
/// the proxy with `allow`.
pub async fn egress_route(
    rt: &dyn ContainerRuntime,
    network: &str,
    allow: Allow,
) -> Result<Route, SandboxError> {
    let a = attach(rt, network, Listen::Proxy(allow.clone()))
        .await
        .map_err(|e| hint(e, "cannot start the egress proxy"))?;
    let url = format!("http://{}", a.reach);
    Ok(a.into_route(network, url.clone(), proxy_env(&url), Some(allow)))
}

fn hint(e: SandboxError, what: &str) -> SandboxError {
    match e {
        SandboxError::Route(m) => infra(format!("{what}: {m}. {START_HINT}")),
        e => e,
    }
}

/// Where a socket route's relay listens: the container's own loopback.
pub const SOCKET_RELAY_PORT: u16 = 3128;
/// Where a socket route's directory (holding `route.sock`) is in the container.
const SOCKET_DIR: &str = "/run/belay-route";

/// The model route without a network: the container has none at all (only
/// its loopback), and its one way out is a Unix socket from belay, mounted
/// read-only. belay's own binary is the container's main process (`belay
/// relay`, under the idle user, which the agent's commands cannot signal),
/// listening on the container's loopback and carrying each connection to
/// the socket; on the host the socket leads to the model endpoint (a
/// forwarder) or to the proxy that lets through only the endpoint's host.
///
/// No network is made or removed, no firewall rule is written, and the
/// container starts without a network interface: each call saves the
/// network's lifecycle, and anything but the model is refused at once (no
/// route, no name service). Where the relay cannot run in the image (belay's
/// binary needs glibc), the caller falls back to [`model_route`].
pub struct SocketRoute {
    /// The base URL the agent gets (in the container).
    pub url: String,
    /// Variables for the container (the proxy settings, where the proxy is
    /// the way out).
    pub env: Vec<(String, String)>,
    /// What the proxy lets through (none for a forwarder).
    pub allow: Option<Allow>,
    dir: tempfile::TempDir,
    exe: std::path::PathBuf,
    _bridge: crate::egress::UnixForward,
    proxy: Option<EgressProxy>,
}

impl std::fmt::Debug for SocketRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketRoute")
            .field("url", &self.url)
            .field("dir", &self.dir.path())
            .finish()
    }
}

/// belay's own binary, for a relay (`BELAY_RELAY_BIN` names another build).
fn relay_exe() -> Result<std::path::PathBuf, SandboxError> {
    match std::env::var_os("BELAY_RELAY_BIN") {
        Some(p) => Ok(std::path::PathBuf::from(p)),
        None => std::env::current_exe()
            .map_err(|e| infra(format!("cannot find belay's own binary for the relay: {e}"))),
    }
}

impl SocketRoute {
    /// The route's socket directory and belay's binary, read-only.
    pub fn mounts(&self) -> Vec<crate::Mount> {
        vec![
            crate::Mount {
                host: self.dir.path().to_path_buf(),
                container: SOCKET_DIR.into(),
                read_only: true,
            },
            crate::Mount {
                host: self.exe.clone(),
                container: RELAY_BIN.into(),
                read_only: true,
            },
        ]
    }

    /// The container's main process: the relay, ending when `lifeline`'s
    /// lock is free (belay gone), as the idle process would.
    pub fn relay_cmd(&self, lifeline: Option<&str>) -> Vec<String> {
        let mut cmd = vec![
            RELAY_BIN.to_string(),
            "relay".into(),
            "--listen".into(),
            format!("127.0.0.1:{SOCKET_RELAY_PORT}"),
            "--to".into(),
            format!("unix:{SOCKET_DIR}/route.sock"),
        ];
        if let Some(l) = lifeline {
            cmd.extend(["--lifeline".into(), l.to_string()]);
        }
        cmd
    }

    /// The proxy's decisions since the last call (none for a forwarder).
    pub fn drain_decisions(&self) -> Vec<crate::egress::Decision> {
        self.proxy.as_ref().map(|p| p.drain()).unwrap_or_default()
    }
}

/// The model route for `base_url` through a socket in a directory of its
/// own (a fresh one under the temporary directory, for a short socket
/// path: at most 108 bytes; only belay can write it). Dropping the route
/// closes it: the listener, the socket and its directory go.
pub async fn model_socket_route(base_url: &str) -> Result<SocketRoute, SandboxError> {
    let host = url_host(base_url).ok_or_else(|| {
        SandboxError::BadUrl(format!(
            "the model base URL `{base_url}` has no host: give a URL such as http://127.0.0.1:8081/v1"
        ))
    })?;
    let exe = relay_exe()?;
    let tmp = std::env::temp_dir();
    let dir = tempfile::Builder::new()
        .prefix("belay-route-")
        .tempdir_in(&tmp)
        .map_err(|e| SandboxError::io("create a directory in", &tmp, e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        // The container's idle user passes through to the socket; no one lists or writes it.
        fs_err::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(|e| SandboxError::io("set the mode of", dir.path(), e))?;
    }
    let sock = dir.path().join("route.sock");
    let (scheme, path) = scheme_and_path(base_url);
    let inside = format!("127.0.0.1:{SOCKET_RELAY_PORT}");
    let bridge = |up: String| {
        let sock = sock.clone();
        async move {
            crate::egress::UnixForward::start(sock.clone(), up)
                .await
                .map_err(|e| SandboxError::io("listen on", &sock, e))
        }
    };
    if let Some(upstream) = loopback_upstream(base_url, &host) {
        return Ok(SocketRoute {
            url: format!("{scheme}://{inside}{path}"),
            env: Vec::new(),
            allow: None,
            _bridge: bridge(upstream).await?,
            dir,
            exe,
            proxy: None,
        });
    }
    let allow = Allow::hosts([host], url_port(base_url));
    let proxy = EgressProxy::start(SocketAddr::from(([127, 0, 0, 1], 0)), allow.clone())
        .await
        .map_err(|e| infra(format!("cannot start the model proxy: {e}")))?;
    Ok(SocketRoute {
        url: base_url.to_string(),
        env: proxy_env(&format!("http://{inside}")),
        allow: Some(allow),
        _bridge: bridge(proxy.addr.to_string()).await?,
        dir,
        exe,
        proxy: Some(proxy),
    })
}
