//! Host firewall rules for belay's internal networks.
//!
//! An internal Docker network has no route out, but the host itself is on it:
//! its gateway address is the host's, and so is every other address of the
//! host (the default bridge's, the machine's own). A process on the network
//! reaches any host service that listens on all addresses (a database, the
//! engine's swarm ports), and over IPv6 link-local too. The only host service
//! a sandbox may reach is belay's own (the egress proxy or the model
//! forwarder), on one port each.
//!
//! So, for each internal network, belay installs a chain `BELAY-<bridge>` in
//! the `INPUT` chain for packets arriving on that network's bridge: accept
//! TCP to the gateway on the allowed ports, refuse everything else (IPv4 and
//! IPv6). For an internal network, the same chain is jumped to for packets
//! the host would forward off the bridge (from `DOCKER-USER`, which the engine keeps first in
//! `FORWARD`, or from `FORWARD` itself), where the engine's own rules would
//! drop them. Refused, not dropped: a TCP connection gets a reset and
//! anything else an ICMP port-unreachable, so a program in the sandbox that
//! tries the network fails at once instead of waiting for its timeout.
//! [`Firewall`] removes its rules when dropped; [`sweep_stale`] removes the
//! rules of bridges that no longer exist (a killed run's).

use std::net::IpAddr;
use std::process::Command;

use crate::SandboxError;

/// The rules of one network, removed on drop.
#[derive(Debug)]
pub struct Firewall {
    chain: String,
    iface: String,
    tools: Vec<&'static str>,
}

/// A firewall tool that could not run, or refused a rule.
#[derive(Debug, thiserror::Error)]
enum ToolError {
    #[error("cannot run {tool}: {source}")]
    Spawn {
        tool: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} {args}: {stderr}")]
    Refused {
        tool: String,
        args: String,
        stderr: String,
    },
}

fn run(tool: &str, args: &[&str]) -> Result<String, ToolError> {
    let out = Command::new(tool)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .arg("-w")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| ToolError::Spawn {
            tool: tool.to_string(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ToolError::Refused {
            tool: tool.to_string(),
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The network cannot be fenced: the sandbox must not start on it.
fn fence_failed(message: impl std::fmt::Display) -> SandboxError {
    SandboxError::Docker {
        op: "fence the internal network",
        message: format!(
            "{message}. belay needs iptables (run as root, or install the iptables package) so that a sandbox on an internal network reaches only belay's proxy"
        ),
    }
}

fn chain_of(iface: &str) -> String {
    format!("BELAY-{iface}")
}

fn has_tool(tool: &str) -> bool {
    run(tool, &["-S", "INPUT"]).is_ok()
}

/// What becomes of packets the host would forward off the bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    /// Refused at once: an internal network, whose only way out is belay's
    /// listener (the engine would drop them, and a program would wait).
    Refuse,
    /// Left to the engine's rules: a network with a route out.
    Pass,
}

impl Firewall {
    /// Allow only TCP to `gateway` on `ports` from the bridge `iface`, and
    /// refuse the rest; what the host would forward off the bridge as
    /// `forwarded` says.
    pub fn lock(
        iface: &str,
        gateway: IpAddr,
        ports: &[u16],
        forwarded: Forwarded,
    ) -> Result<Firewall, SandboxError> {
        if !has_tool("iptables") {
            return Err(fence_failed("iptables is not usable here"));
        }
        let chain = chain_of(iface);
        let mut fw = Firewall {
            chain: chain.clone(),
            iface: iface.to_string(),
            tools: vec!["iptables"],
        };
        if has_tool("ip6tables") {
            fw.tools.push("ip6tables");
        } else {
            tracing::warn!(
                "ip6tables is not usable here: IPv6 on {iface} is not fenced (install the iptables package for ip6tables)"
            );
        }
        let gw = gateway.to_string();
        for tool in fw.tools.clone() {
            if run(tool, &["-N", &chain]).is_err() {
                run(tool, &["-F", &chain]).map_err(fence_failed)?;
            }
            if tool == "iptables" {
                for p in ports {
                    let port = p.to_string();
                    run(
                        tool,
                        &[
                            "-A", &chain, "-p", "tcp", "-d", &gw, "--dport", &port, "-j", "ACCEPT",
                        ],
                    )
                    .map_err(fence_failed)?;
                }
            }
            let tcp_reset = [
                "-A",
                &chain,
                "-p",
                "tcp",
                "-j",
                "REJECT",
                "--reject-with",
                "tcp-reset",
            ];
            run(tool, &tcp_reset).map_err(fence_failed)?;
            run(tool, &["-A", &chain, "-j", "REJECT"]).map_err(fence_failed)?;
            if run(tool, &["-C", "INPUT", "-i", iface, "-j", &chain]).is_err() {
                run(tool, &["-I", "INPUT", "1", "-i", iface, "-j", &chain])
                    .map_err(fence_failed)?;
            }
            if forwarded == Forwarded::Refuse {
                let out = forward_rule(iface, &chain);
                let parent = forward_parent(tool);
                if run(tool, &[&["-C", parent][..], &out].concat()).is_err() {
                    run(tool, &[&["-I", parent, "1"][..], &out].concat()).map_err(fence_failed)?;
                }
            }
        }
        Ok(fw)
    }

    pub fn chain(&self) -> &str {
        &self.chain
    }
}

/// The rule for packets the host would forward off the bridge (traffic
/// between two containers of the network stays on it and is not matched).
fn forward_rule<'a>(iface: &'a str, chain: &'a str) -> [&'a str; 7] {
    ["-i", iface, "!", "-o", iface, "-j", chain]
}

/// Where the forward rule goes: `DOCKER-USER`, which the engine keeps first
/// in `FORWARD` and never flushes, or `FORWARD` where there is none.
fn forward_parent(tool: &str) -> &'static str {
    if run(tool, &["-S", "DOCKER-USER"]).is_ok() {
        "DOCKER-USER"
    } else {
        "FORWARD"
    }
}

fn remove(tools: &[&str], iface: &str, chain: &str) {
    for tool in tools {
        while run(tool, &["-D", "INPUT", "-i", iface, "-j", chain]).is_ok() {}
        for parent in ["DOCKER-USER", "FORWARD"] {
            let out = forward_rule(iface, chain);
            while run(tool, &[&["-D", parent][..], &out].concat()).is_ok() {}
        }
        let _ = run(tool, &["-F", chain]);
        let _ = run(tool, &["-X", chain]);
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        remove(&self.tools, &self.iface, &self.chain);
    }
}

/// Remove the chains of bridges that no longer exist. How many were removed.
pub fn sweep_stale() -> usize {
    let mut n = 0;
    for tool in ["iptables", "ip6tables"] {
        let Ok(rules) = run(tool, &["-S"]) else {
            continue;
        };
        for line in rules.lines() {
            let Some(chain) = line.strip_prefix("-N BELAY-") else {
                continue;
            };
            let iface = chain.trim();
            if !std::path::Path::new("/sys/class/net").join(iface).exists() {
                remove(&[tool], iface, &chain_of(iface));
                n += 1;
            }
        }
    }
    n
}

/// The bridge interface name belay gives a network (at most 15 bytes).
pub fn bridge_name(network: &str) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(network.as_bytes());
    let hex: String = h.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("bly{hex}")
}
