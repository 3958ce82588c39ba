//! `monitor --mode http`: a small status page and its JSON, on loopback only.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

/// What the page shows; the monitor replaces it each tick.
pub type Snapshot = Arc<Mutex<serde_json::Value>>;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn page(State(s): State<Snapshot>) -> impl IntoResponse {
    let v = s.lock().map(|v| v.clone()).unwrap_or_default();
    let status = v.get("status").cloned().unwrap_or_default();
    let alerts = v
        .get("alerts")
        .and_then(|a| a.as_array())
        .cloned()
        .unwrap_or_default();
    let mut rows = String::new();
    for a in &alerts {
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(a.get("detector").and_then(|x| x.as_str()).unwrap_or("")),
            esc(a.get("severity").and_then(|x| x.as_str()).unwrap_or("")),
            esc(a.get("message").and_then(|x| x.as_str()).unwrap_or("")),
        ));
    }
    if rows.is_empty() {
        rows.push_str("<tr><td colspan=3>no alerts</td></tr>");
    }
    let pretty = serde_json::to_string_pretty(&status).unwrap_or_default();
    Html(format!(
        "<!doctype html><html><head><meta charset=utf-8><meta http-equiv=refresh content=10><title>belay rounds: {project}</title></head>\
         <body><h1>belay rounds: {project}</h1><h2>Status</h2><pre id=status>{status}</pre>\
         <h2>Alerts</h2><table id=alerts><tr><th>detector</th><th>severity</th><th>message</th></tr>{rows}</table>\
         <p><a href=/status.json>status.json</a></p></body></html>",
        project = esc(v.get("project").and_then(|p| p.as_str()).unwrap_or("")),
        status = esc(&pretty),
    ))
}

async fn json(State(s): State<Snapshot>) -> impl IntoResponse {
    Json(s.lock().map(|v| v.clone()).unwrap_or_default())
}

/// Every request: a `Host` naming this server on loopback, else 421 (a
/// DNS-rebinding page sends its own name and must not read the status, which
/// holds paths, stashes and usage). Every answer: never sniffed nor cached.
async fn guard(State(port): State<u16>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut resp = if belay_record::is_loopback_host(host, port) {
        next.run(req).await
    } else {
        (
            StatusCode::MISDIRECTED_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "this monitor answers only to its loopback address\n",
        )
            .into_response()
    };
    let hs = resp.headers_mut();
    hs.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    hs.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Bind `127.0.0.1:port` (the address, for a port of 0) and serve until the
/// task is dropped. Only `127.0.0.1:PORT`, `localhost:PORT` and `[::1]:PORT`
/// are answered as `Host` (`guard`).
pub async fn bind(
    port: u16,
    snapshot: Snapshot,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(page))
        .route("/status.json", get(json))
        .with_state(snapshot)
        .layer(middleware::from_fn_with_state(addr.port(), guard));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, task))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, host: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET /status.json HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn only_its_loopback_host_reads_the_status() {
        let snap = std::sync::Arc::new(std::sync::Mutex::new(
            serde_json::json!({"status": {"secret_path": "/home/u/p"}}),
        ));
        let (addr, task) = super::bind(0, snap).await.unwrap();
        let p = addr.port();
        for host in [
            format!("127.0.0.1:{p}"),
            format!("localhost:{p}"),
            format!("[::1]:{p}"),
        ] {
            let r = get(addr, &host).await;
            assert!(r.starts_with("HTTP/1.1 200"), "{host}: {r}");
            assert!(r.contains("secret_path"), "{r}");
            let lower = r.to_ascii_lowercase();
            assert!(lower.contains("x-content-type-options: nosniff"), "{r}");
            assert!(lower.contains("cache-control: no-store"), "{r}");
        }
        for host in [
            format!("rebind.example:{p}"),
            format!("127.0.0.1:{}", p.wrapping_add(1)),
            "x".to_string(),
        ] {
            let r = get(addr, &host).await;
            assert!(r.starts_with("HTTP/1.1 421"), "{host}: {r}");
            assert!(!r.contains("secret_path"), "{r}");
            assert!(
                r.to_ascii_lowercase().contains("cache-control: no-store"),
                "{r}"
            );
        }
        task.abort();
    }
}
