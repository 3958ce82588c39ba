//! The page: plain HTML, CSS and JavaScript, embedded in the binary, so it
//! works offline and loads nothing from elsewhere.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::state::App;

#[derive(rust_embed::Embed)]
#[folder = "assets/"]
struct Assets;

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

fn serve(name: &str) -> Response {
    match Assets::get(name) {
        Some(f) => (
            [
                (header::CONTENT_TYPE, content_type(name)),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            f.data.into_owned(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

/// The page, its assets named with the token (a script tag sends no
/// header); the token is hex, so it is safe in an attribute.
pub(crate) async fn index(State(app): State<Arc<App>>) -> Response {
    let Some(f) = Assets::get("index.html") else {
        return (StatusCode::NOT_FOUND, "no page").into_response();
    };
    let html = String::from_utf8_lossy(&f.data)
        .replace(".js\"", &format!(".js?token={}\"", app.token))
        .replace(".css\"", &format!(".css?token={}\"", app.token));
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response()
}

pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    serve(&file)
}

/// The bytes the page adds to the binary.
pub fn embedded_size() -> usize {
    Assets::iter()
        .filter_map(|n| Assets::get(&n).map(|f| f.data.len()))
        .sum()
}
