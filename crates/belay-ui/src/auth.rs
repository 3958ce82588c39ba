//! Every request: the right `Host` (on loopback), the token, and for a POST
//! the page's own `Origin`; every response: the security headers.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::App;

/// The token a request presents: `Authorization: Bearer …` (the page's
/// fetches, tools), else `?token=…` (what cannot carry a header: the page's
/// first load, its scripts, its event streams, a download link). There is
/// no cookie: a browser sends a cookie of 127.0.0.1 to every port of it, so
/// any other local server the browser visits would receive the token.
fn presented<'a>(h: &'a HeaderMap, query: Option<&'a str>) -> Option<&'a str> {
    if let Some(t) = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(t);
    }
    query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")))
}

fn refuse(code: StatusCode, why: &str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{why}\n"),
    )
        .into_response()
}

pub(crate) async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let h = req.headers();
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if let Some(port) = app.loopback_port {
        if !belay_record::is_loopback_host(&host, port) {
            return refuse(
                StatusCode::MISDIRECTED_REQUEST,
                "this dashboard answers only to its loopback address",
            );
        }
    }
    let ok = presented(h, req.uri().query())
        .is_some_and(|t| belay_record::same_secret(t.as_bytes(), app.token.as_bytes()));
    if !ok {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "the dashboard needs its access token: open the URL `belay ui` printed",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        // A browser always says where a POST comes from; only the page's own
        // origin may act (a tool without an Origin uses the bearer token).
        if let Some(origin) = h.get(header::ORIGIN) {
            let own = format!("http://{host}");
            if origin.to_str().ok() != Some(own.as_str()) {
                return refuse(StatusCode::FORBIDDEN, "a cross-origin request is refused");
            }
        }
        if h.get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|s| s != "same-origin" && s != "none")
        {
            return refuse(StatusCode::FORBIDDEN, "a cross-site request is refused");
        }
    }
    let mut resp = next.run(req).await;
    let hs = resp.headers_mut();
    hs.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    hs.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    hs.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    hs.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}
