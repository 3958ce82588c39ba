//! `monitor --mode http`: a small status page and its JSON, on loopback only.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::response::{Html, IntoResponse};
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

/// Bind `127.0.0.1:port` (the address, for a port of 0) and serve until the
/// task is dropped.
pub async fn bind(
    port: u16,
    snapshot: Snapshot,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(page))
        .route("/status.json", get(json))
        .with_state(snapshot);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, task))
}
