//! The `Host` a local web server answers (the dashboard, the rounds monitor).
//! A page of any site can point its own name at 127.0.0.1 (DNS rebinding)
//! and read a loopback server as same-origin; its requests still carry that
//! name in `Host`, so a server that answers only its loopback names is safe.

/// The `Host` values of a loopback server on `port`: `127.0.0.1:PORT`,
/// `localhost:PORT` and `[::1]:PORT`.
pub fn loopback_hosts(port: u16) -> [String; 3] {
    [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ]
}

/// Whether a request's `Host` names the loopback server on `port` (one of
/// [`loopback_hosts`], in any case).
pub fn is_loopback_host(host: &str, port: u16) -> bool {
    loopback_hosts(port)
        .iter()
        .any(|a| a.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_with_the_port_pass() {
        for ok in ["127.0.0.1:8080", "LOCALHOST:8080", "[::1]:8080"] {
            assert!(is_loopback_host(ok, 8080), "{ok}");
        }
        for bad in [
            "",
            "127.0.0.1",
            "localhost",
            "127.0.0.1:8081",
            "evil.example:8080",
            "localhost.evil.example:8080",
            "127.0.0.1:8080.evil.example",
        ] {
            assert!(!is_loopback_host(bad, 8080), "{bad}");
        }
    }
}
