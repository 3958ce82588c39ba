//! The egress proxy: a networked step whose pipeline names `egress.presets`
//! runs on an internal Docker network with no route out; its only way out is
//! this proxy on the host's address on that network, which lets through the
//! hosts of the presets and refuses the rest (HTTP `CONNECT` for TLS, and
//! absolute-form plain HTTP).
//!
//! The `package-registries` preset is read from this machine's own package
//! configuration, so that mirrors and corporate registries are what is allowed:
//! the apt sources, pip's index (its configuration, or pip's own default), and
//! npm's registry. No registry address is written into belay.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One decision of the proxy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    pub host: String,
    pub port: u16,
    pub allowed: bool,
}

/// The `host[:port]` part of a URL (`scheme://[user@]host[:port]/...`).
fn authority(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let hostport = rest.split(['/', '?', '#']).next()?;
    Some(
        hostport
            .rsplit_once('@')
            .map(|(_, h)| h)
            .unwrap_or(hostport),
    )
}

/// The host of a URL, lowercased.
pub fn url_host(url: &str) -> Option<String> {
    let hostport = authority(url)?;
    let host = match hostport.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => hostport.split(':').next()?,
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// The explicit port of a URL, if it names one.
pub fn url_port(url: &str) -> Option<u16> {
    let hostport = authority(url)?;
    let after = hostport
        .rsplit_once(']')
        .map(|(_, r)| r)
        .unwrap_or(hostport);
    after.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

fn command_lines(program: &str, args: &[&str]) -> Vec<String> {
    std::process::Command::new(program)
        .args(args)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// What the proxy lets through: hosts, and ports (80 and 443, and any port a
/// configured registry URL names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allow {
    pub hosts: BTreeSet<String>,
    pub ports: BTreeSet<u16>,
    /// Any host on the internet on the allowed ports (`egress: {class:
    /// browser}`: broad, but every connection is logged). A name that
    /// resolves to a loopback, private, link-local or otherwise
    /// non-public address is still refused, and the proxy dials the address
    /// it checked, so DNS cannot point it back at the host's services.
    pub public: bool,
}

impl Allow {
    pub fn hosts(hosts: impl IntoIterator<Item = String>, extra_port: Option<u16>) -> Self {
        let mut ports: BTreeSet<u16> = [80, 443].into();
        ports.extend(extra_port);
        Allow {
            hosts: hosts.into_iter().collect(),
            ports,
            public: false,
        }
    }

    /// The browser class: every public host on ports 80 and 443.
    pub fn public_web() -> Self {
        Allow {
            hosts: BTreeSet::new(),
            ports: [80, 443].into(),
            public: true,
        }
    }
}

/// Whether an address is on the public internet: not loopback, private,
/// link-local, shared (CGNAT), unique-local, multicast, documentation,
/// benchmarking or unspecified.
pub fn is_public(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v) => {
            let o = v.octets();
            !(v.is_loopback()
                || v.is_private()
                || v.is_link_local()
                || v.is_broadcast()
                || v.is_multicast()
                || v.is_unspecified()
                || v.is_documentation()
                || o[0] == 0
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 100 && (64..128).contains(&o[1]))
                || (o[0] == 198 && (o[1] == 18 || o[1] == 19))
                || o[0] >= 240)
        }
        IpAddr::V6(v) => {
            if let Some(m) = v.to_ipv4_mapped() {
                return is_public(IpAddr::V4(m));
            }
            let s = v.segments();
            !(v.is_loopback()
                || v.is_unspecified()
                || v.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                // NAT64 (both prefixes), 6to4, discard-only, IPv4-compatible.
                || (s[0] == 0x0064 && s[1] == 0xff9b)
                || s[0] == 0x2002
                || (s[0] == 0x0100 && s[1..4] == [0, 0, 0])
                || s[..6] == [0, 0, 0, 0, 0, 0])
        }
    }
}

/// Whether an address is one of this host's own (binding it succeeds only then).
fn is_local(ip: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Why the browser class refuses a host (the proxy's 403 says it).
#[derive(Debug, thiserror::Error)]
enum NotPublic {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} has no address")]
    NoAddress { host: String },
    #[error("{host} resolves to {ip}, which is not a public address")]
    Private { host: String, ip: std::net::IpAddr },
    #[error("{host} resolves to {ip}, an address of this host")]
    Local { host: String, ip: std::net::IpAddr },
}

/// Resolve `host` and keep it only when every address is public: (the
/// address to dial, or why not).
async fn public_address(host: &str, port: u16) -> Result<SocketAddr, NotPublic> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| NotPublic::Resolve {
            host: host.to_string(),
            source,
        })?
        .collect();
    let Some(first) = addrs.first().copied() else {
        return Err(NotPublic::NoAddress {
            host: host.to_string(),
        });
    };
    if let Some(a) = addrs.iter().find(|a| !is_public(a.ip())) {
        return Err(NotPublic::Private {
            host: host.to_string(),
            ip: a.ip(),
        });
    }
    // The proxy runs in the host's own network: one of the host's own public
    // addresses would reach its services past the bridge's fence.
    if let Some(a) = addrs.iter().find(|a| is_local(a.ip())) {
        return Err(NotPublic::Local {
            host: host.to_string(),
            ip: a.ip(),
        });
    }
    Ok(first)
}

/// The package registries this machine is configured for: the apt sources,
/// pip's index (its configuration, or pip's own default hosts) and npm's
/// registry. Each is asked once.
pub fn package_registries() -> Allow {
    let mut urls: Vec<String> = crate::bootstrap::all_host_sources(std::path::Path::new("/"))
        .into_iter()
        .map(|s| s.uri)
        .collect();
    for var in ["PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"] {
        if let Ok(v) = std::env::var(var) {
            urls.extend(v.split_whitespace().map(String::from));
        }
    }
    for key in ["global.index-url", "global.extra-index-url"] {
        urls.extend(command_lines(
            "python3",
            &["-m", "pip", "config", "get", key],
        ));
    }
    urls.extend(command_lines("npm", &["config", "get", "registry"]));
    let mut allow = Allow::hosts(urls.iter().filter_map(|u| url_host(u)), None);
    allow.ports.extend(urls.iter().filter_map(|u| url_port(u)));
    // pip's defaults are host names, not URLs.
    allow.hosts.extend(
        command_lines(
            "python3",
            &["-c", "from pip._internal.models.index import PyPI; print(PyPI.netloc); print(PyPI.file_storage_domain)"],
        )
        .into_iter()
        .map(|h| h.to_ascii_lowercase()),
    );
    allow
}

/// A running proxy.
pub struct EgressProxy {
    pub addr: SocketAddr,
    decisions: Arc<Mutex<Vec<Decision>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EgressProxy {
    /// Listen on `bind` (the host's address on the internal network).
    pub async fn start(bind: SocketAddr, allow: Allow) -> std::io::Result<EgressProxy> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let decisions = Arc::new(Mutex::new(Vec::new()));
        let allow = Arc::new(allow);
        let d = decisions.clone();
        // Bounded: a step cannot exhaust the host's descriptors through the proxy.
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    let _ = sock.write_all(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\nbelay egress: too many connections\n").await;
                    continue;
                };
                let allow = allow.clone();
                let d = d.clone();
                tokio::spawn(async move {
                    let _ = serve(sock, &allow, &d).await;
                    drop(permit);
                });
            }
        });
        Ok(EgressProxy {
            addr,
            decisions,
            task,
        })
    }

    /// The decisions since the last call.
    pub fn drain(&self) -> Vec<Decision> {
        self.decisions
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default()
    }
}

const HEAD_MAX: usize = 64 * 1024;
const MAX_CONNECTIONS: usize = 256;
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn serve(
    mut sock: TcpStream,
    allow: &Allow,
    log: &Mutex<Vec<Decision>>,
) -> std::io::Result<()> {
    // The request head, within a time limit.
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    let end = loop {
        let n = match tokio::time::timeout_at(deadline, sock.read(&mut buf)).await {
            Ok(r) => r?,
            Err(_) => return Ok(()),
        };
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if head.len() > HEAD_MAX {
            return sock
                .write_all(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n",
                )
                .await;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let first = text.lines().next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let (method, target, version) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    let (host, port, connect) = if method.eq_ignore_ascii_case("CONNECT") {
        let (h, p) = target.rsplit_once(':').unwrap_or((target, "443"));
        (
            h.trim_matches(['[', ']']).to_ascii_lowercase(),
            p.parse().unwrap_or(443),
            true,
        )
    } else {
        let Some(h) = url_host(target) else {
            return sock.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\nbelay egress: use a proxy request (absolute URL or CONNECT)\n").await;
        };
        let rest = target.split_once("://").map(|(_, r)| r).unwrap_or(target);
        let hostport = rest.split('/').next().unwrap_or("");
        let port = hostport
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or(80);
        (h, port, false)
    };
    let listed = allow.hosts.contains(&host) && allow.ports.contains(&port);
    // The browser class: a public host on an allowed port, dialled at the
    // address that was checked.
    let mut checked: Option<SocketAddr> = None;
    let mut why_not = None;
    if !listed && allow.public && allow.ports.contains(&port) {
        match public_address(&host, port).await {
            Ok(a) => checked = Some(a),
            Err(e) => why_not = Some(e),
        }
    }
    let allowed = listed || checked.is_some();
    if let Ok(mut l) = log.lock() {
        // Refusals are capped (a step could flood them); what got through is
        // always recorded, up to a far larger bound.
        if l.len() < 10_000 || (allowed && l.len() < 200_000) {
            l.push(Decision {
                host: host.clone(),
                port,
                allowed,
            });
        }
    }
    if !allowed {
        let body = match why_not {
            Some(w) => format!("belay egress: {host}:{port} is refused: {w}\n"),
            None => format!("belay egress: {host}:{port} is not allowed for this step (only the package registries, or the model endpoint, are)\n"),
        };
        let resp = format!("HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        return sock.write_all(resp.as_bytes()).await;
    }
    let dial = async {
        match checked {
            Some(a) => TcpStream::connect(a).await,
            None => TcpStream::connect((host.as_str(), port)).await,
        }
    };
    let dial = tokio::time::timeout(CONNECT_TIMEOUT, dial);
    let mut upstream = match dial.await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connect timed out",
        ))
    }) {
        Ok(u) => u,
        Err(e) => {
            let resp = format!("HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\nbelay egress: cannot reach {host}:{port}: {e}\n");
            return sock.write_all(resp.as_bytes()).await;
        }
    };
    if connect {
        sock.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await?;
        upstream.write_all(&head[end..]).await?;
    } else {
        // Absolute form to origin form.
        let rest = target.split_once("://").map(|(_, r)| r).unwrap_or(target);
        let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("/");
        // One request per connection, addressed to the host that was checked:
        // a second request on a kept-alive connection, or another `Host`,
        // would reach past the allowlist.
        let host_header = if port == 80 {
            host.clone()
        } else {
            format!("{host}:{port}")
        };
        let mut out =
            format!("{method} {path} {version}\r\nHost: {host_header}\r\nConnection: close\r\n");
        for line in text.lines().skip(1) {
            let lower = line.to_ascii_lowercase();
            if line.is_empty()
                || [
                    "host:",
                    "connection:",
                    "keep-alive:",
                    "proxy-connection:",
                    "proxy-authorization:",
                ]
                .iter()
                .any(|h| lower.starts_with(h))
            {
                continue;
            }
            out.push_str(line);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        upstream.write_all(out.as_bytes()).await?;
        upstream.write_all(&head[end..]).await?;
    }
    let _ = tokio::io::copy_bidirectional(&mut sock, &mut upstream).await;
    Ok(())
}

/// A TCP forwarder: `listen` -> `upstream`, byte for byte. Puts a model server
/// that listens on the host's loopback within reach of an internal network.
pub struct TcpForward {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TcpForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpForward {
    /// Forward `listen` to `upstream`: `host:port`, or `unix:PATH` for a
    /// Unix socket (a socket route's relay, inside the container).
    pub async fn start(listen: SocketAddr, upstream: String) -> std::io::Result<TcpForward> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let upstream = Arc::new(upstream);
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let up = upstream.clone();
                tokio::spawn(async move {
                    match up.strip_prefix("unix:") {
                        Some(path) => {
                            if let Ok(mut u) = tokio::net::UnixStream::connect(path).await {
                                let _ = tokio::io::copy_bidirectional(&mut sock, &mut u).await;
                            }
                        }
                        None => {
                            if let Ok(mut u) = TcpStream::connect(up.as_str()).await {
                                let _ = tokio::io::copy_bidirectional(&mut sock, &mut u).await;
                            }
                        }
                    }
                });
            }
        });
        Ok(TcpForward { addr, task })
    }
}

/// A forwarder from a Unix socket to a TCP address, byte for byte: the host
/// side of a socket route, whose socket a container with no network at all
/// reaches through a read-only mount. Removes its socket when dropped.
pub struct UnixForward {
    pub path: std::path::PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for UnixForward {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl UnixForward {
    /// Listen on the socket `path` (made anew, open to every user of the
    /// container: its directory is what guards it) and carry each
    /// connection to `upstream` (`host:port`).
    pub async fn start(path: std::path::PathBuf, upstream: String) -> std::io::Result<UnixForward> {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        let upstream = Arc::new(upstream);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    continue;
                };
                let up = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(mut u) = TcpStream::connect(up.as_str()).await {
                        let _ = tokio::io::copy_bidirectional(&mut sock, &mut u).await;
                    }
                    drop(permit);
                });
            }
        });
        Ok(UnixForward { path, task })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn hosts_of_urls() {
        assert_eq!(
            url_host("http://user:pw@Mirror.Example:8080/debian").as_deref(),
            Some("mirror.example")
        );
        assert_eq!(url_host("https://[::1]:3128/").as_deref(), Some("::1"));
        assert_eq!(
            url_host("registry.example/"),
            Some("registry.example".into())
        );
        assert_eq!(url_host("http:///x"), None);
    }

    #[test]
    fn public_addresses_are_the_internet_only() {
        for a in [
            "93.184.216.34",
            "2606:2800:220:1:248:1893:25c8:1946",
            "1.1.1.1",
        ] {
            assert!(is_public(a.parse().unwrap()), "{a}");
        }
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.17.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "224.0.0.1",
            "198.18.0.1",
            "240.0.0.1",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a}");
        }
    }

    #[tokio::test]
    async fn the_browser_class_refuses_a_name_that_points_at_the_host() {
        let p = EgressProxy::start("127.0.0.1:0".parse().unwrap(), Allow::public_web())
            .await
            .unwrap();
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        s.write_all(b"CONNECT localhost:443 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        assert!(
            out.starts_with("HTTP/1.1 403") && out.contains("not a public address"),
            "{out}"
        );
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        s.write_all(b"CONNECT example.com:22 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        assert!(
            out.starts_with("HTTP/1.1 403"),
            "a port other than 80/443: {out}"
        );
        assert_eq!(p.drain().len(), 2, "every connection is logged");
    }

    #[tokio::test]
    async fn allows_listed_hosts_and_refuses_the_rest() {
        // An upstream on loopback, allowed by name.
        let up = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_port = up.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = up.accept().await {
                let mut b = [0u8; 1024];
                let n = s.read(&mut b).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&b[..n]).into_owned();
                let line = req.lines().next().unwrap_or("").to_string();
                let body = format!("upstream saw: {line}");
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        let allow = Allow::hosts(["localhost".to_string()], Some(up_port));
        let p = EgressProxy::start("127.0.0.1:0".parse().unwrap(), allow)
            .await
            .unwrap();
        let ask = |req: String| async move {
            let mut s = TcpStream::connect(p_addr(&req)).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out).await;
            out
        };
        fn p_addr(req: &str) -> SocketAddr {
            req.lines()
                .last()
                .unwrap()
                .trim_start_matches("#")
                .parse()
                .unwrap()
        }
        let a = p.addr;
        let ok = ask(format!(
            "GET http://localhost:{up_port}/simple/ HTTP/1.0\r\nHost: localhost\r\n\r\n#{a}"
        ))
        .await;
        assert!(ok.contains("upstream saw: GET /simple/ HTTP/1.0"), "{ok}");
        let port = ask(format!(
            "CONNECT localhost:22 HTTP/1.1\r\nHost: x\r\n\r\n#{a}"
        ))
        .await;
        assert!(
            port.starts_with("HTTP/1.1 403"),
            "a port outside the list: {port}"
        );
        let denied = ask(format!(
            "CONNECT elsewhere.example.invalid:443 HTTP/1.1\r\nHost: x\r\n\r\n#{a}"
        ))
        .await;
        assert!(
            denied.starts_with("HTTP/1.1 403") && denied.contains("elsewhere.example.invalid"),
            "{denied}"
        );
        let d = p.drain();
        assert_eq!(d.len(), 3);
        assert!(d[0].allowed && !d[1].allowed);
    }
}
