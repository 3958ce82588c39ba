//! The JSON and text the page reads: the registry's runs, one run's records,
//! its logs (a piece, a search, a download) and its commits' patches.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use belay_record::{Id, Mode, RunEntry, RunStatus, StreamRedactor};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::approvals::{self, Waiting};
use crate::files;
use crate::state::App;

pub(crate) fn not_found(what: impl Into<String>) -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"error": what.into()}))).into_response()
}

pub(crate) fn bad(what: impl Into<String>) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": what.into()}))).into_response()
}

pub(crate) fn internal(what: impl std::fmt::Display) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({"error": what.to_string()})),
    )
        .into_response()
}

/// JSON, through the redactor.
pub(crate) fn redacted_json(app: &App, mut v: Value) -> Response {
    app.redactor.redact_value(&mut v);
    Json(v).into_response()
}

fn text(app: &App, t: &str) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        app.redactor.redact(t).into_owned(),
    )
        .into_response()
}

/// The run `id` of the registry, or the response that says why not. The id
/// of the URL is parsed by the one validator of ids first (`400`).
pub(crate) fn find(app: &App, id: &str) -> Result<RunEntry, Box<Response>> {
    let id = Id::parse("run", id).map_err(|e| Box::new(bad(e.to_string())))?;
    match app.registry.find(id.as_str()) {
        // The registry names the directory; only one that is a run's (a real
        // directory, not a link, with the run's lock or log) is read.
        Ok(Some(e)) if files::is_run_dir(&e.dir) => Ok(e),
        Ok(Some(_)) => Err(Box::new(not_found(format!(
            "the registry's directory of run {id} is not a run directory"
        )))),
        Ok(None) => Err(Box::new(not_found(format!("no run {id} in the registry")))),
        Err(e) => Err(Box::new(internal(e))),
    }
}

/// The state directory an env run shares with the rest of its batch.
fn batch_of(e: &RunEntry) -> Option<String> {
    if e.mode != Mode::Env {
        return None;
    }
    let runs = e.dir.parent()?;
    let state = runs.parent()?;
    state
        .file_name()
        .is_some_and(|n| n == ".belay-state")
        .then(|| state.display().to_string())
}

fn entry_json(e: &RunEntry, waiting: &HashMap<String, Waiting>) -> Value {
    let mut v = serde_json::to_value(e).unwrap_or_default();
    let attention = waiting
        .get(&e.run_id)
        .map(|w| w.reason.clone())
        .or_else(|| {
            (e.status == RunStatus::Interrupted)
                .then(|| "interrupted: its process is gone; resume it".to_string())
        });
    v["attention"] = attention.into();
    v["batch"] = batch_of(e).into();
    v
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    mode: Option<String>,
    status: Option<String>,
    failed: Option<String>,
    attention: Option<String>,
    /// Words every listed run holds (in its id, mode, title, outcome or
    /// repository), case-insensitive.
    q: Option<String>,
    /// Paging: the first row (0 is the newest) and how many.
    offset: Option<usize>,
    limit: Option<usize>,
}

/// Whether a run holds every word of the search.
/// The search sees what the page shows: the text redacted first, so that
/// no search can probe a redacted value character by character.
fn matches(app: &App, e: &RunEntry, words: &[String]) -> bool {
    if words.is_empty() {
        return true;
    }
    let hay = app
        .redactor
        .redact(&format!(
            "{} {} {} {} {} {}",
            e.run_id,
            e.mode.as_str(),
            e.status.as_str(),
            e.title.as_deref().unwrap_or(""),
            e.summary.as_deref().unwrap_or(""),
            e.repo
                .as_deref()
                .map(|r| r.display().to_string())
                .unwrap_or_default()
        ))
        .to_lowercase();
    words.iter().all(|w| hay.contains(w.as_str()))
}

pub(crate) async fn runs(State(app): State<Arc<App>>, Query(q): Query<ListQuery>) -> Response {
    let list = match app.registry.list() {
        Ok(l) => l,
        Err(e) => return internal(e),
    };
    let waiting = approvals::waiting_runs(&app, &list);
    let mode: Option<Mode> = q
        .mode
        .as_deref()
        .filter(|m| !m.is_empty())
        .and_then(|m| m.parse().ok());
    let status: Option<RunStatus> = q
        .status
        .as_deref()
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse().ok());
    let on = |f: &Option<String>| f.as_deref().is_some_and(|v| v == "1" || v == "true");
    let words: Vec<String> =
        q.q.as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_lowercase)
            .collect();
    let rows: Vec<Value> = list
        .iter()
        .filter(|e| mode.is_none_or(|m| e.mode == m))
        .filter(|e| status.is_none_or(|s| e.status == s))
        .filter(|e| !on(&q.failed) || e.status == RunStatus::Failed)
        .filter(|e| matches(&app, e, &words))
        .map(|e| entry_json(e, &waiting))
        .filter(|v| !on(&q.attention) || !v["attention"].is_null())
        .collect();
    let total = rows.len();
    let offset = q.offset.unwrap_or(0).min(total);
    let limit = q.limit.unwrap_or(usize::MAX).max(1);
    let page: Vec<Value> = rows.into_iter().skip(offset).take(limit).collect();
    redacted_json(
        &app,
        json!({"runs": page, "total": total, "offset": offset, "all": list.len()}),
    )
}

fn parsed(dir: &std::path::Path, name: &str, max: u64) -> Value {
    files::read_record(dir, name, max)
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// The parts of an env manifest the page shows (not every execution).
fn manifest_view(m: Value) -> Value {
    if m.is_null() {
        return m;
    }
    let keep = [
        "ok",
        "status",
        "error",
        "final_image",
        "base_image",
        "dockerfile_path",
        "dockerfile_legacy_path",
        "final_clean_replay_enabled",
        "final_clean_replay_ok",
        "final_clean_replay_image",
        "final_clean_replay_failure_stage",
        "final_clean_replay_note",
        "oracle",
        "cache",
        "repairs",
        "blocks",
        "checkpoints",
        "llm_usage",
        "duration_s",
        "complete",
    ];
    let mut out = serde_json::Map::new();
    for k in keep {
        if let Some(v) = m.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    // A block's script may be long; the page shows its head.
    if let Some(Value::Array(blocks)) = out.get_mut("blocks") {
        for b in blocks {
            if let Some(Value::String(s)) = b.get_mut("script") {
                if s.len() > 4000 {
                    let cut = (0..=4000)
                        .rev()
                        .find(|i| s.is_char_boundary(*i))
                        .unwrap_or(0);
                    s.truncate(cut);
                    s.push_str("\n…");
                }
            }
        }
    }
    Value::Object(out)
}

/// The commits belay recorded in the run, oldest first.
fn commits(dir: &std::path::Path) -> Vec<Value> {
    // host-owned: the run's commits/, the patches belay records.
    let Ok(rd) = std::fs::read_dir(dir.join("commits")) else {
        return vec![];
    };
    let mut v: Vec<(std::time::SystemTime, String)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let sha = name.strip_suffix(".patch")?.to_string();
            let t = e.metadata().and_then(|m| m.modified()).ok()?;
            Some((t, sha))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, s)| json!(s)).collect()
}

pub(crate) async fn run(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    let e = match find(&app, &id) {
        Ok(e) => e,
        Err(r) => return *r,
    };
    let all = app.registry.list().unwrap_or_default();
    let waiting = approvals::waiting_runs(&app, std::slice::from_ref(&e));
    let mut v = entry_json(&e, &waiting);
    let present: Vec<&str> = files::RECORDS
        .iter()
        .copied()
        .filter(|f| files::inside(&e.dir, f).is_some())
        .collect();
    v["files"] = json!(present);
    v["state"] = parsed(&e.dir, "state.json", 4 << 20);
    v["summary_record"] = parsed(&e.dir, "summary.json", 1 << 20);
    v["published"] = parsed(&e.dir, "published.json", 1 << 20);
    v["manifest"] = manifest_view(parsed(&e.dir, "manifest.json", 16 << 20));
    v["commits"] = json!(commits(&e.dir));
    v["actions"] = json!(waiting.get(&e.run_id).map(|w| &w.actions));
    v["held_diff"] = json!(waiting.get(&e.run_id).and_then(approvals::held_patch));
    // The other projects of its batch.
    if let Some(b) = batch_of(&e) {
        let peers: Vec<Value> = all
            .iter()
            .filter(|x| batch_of(x).as_deref() == Some(b.as_str()))
            .map(|x| entry_json(x, &HashMap::new()))
            .collect();
        v["batch_runs"] = json!(peers);
    }
    redacted_json(&app, v)
}

pub(crate) async fn logs(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    let e = match find(&app, &id) {
        Ok(e) => e,
        Err(r) => return *r,
    };
    redacted_json(&app, json!({"logs": files::logs(&e.dir)}))
}

#[derive(Deserialize)]
pub(crate) struct LogQuery {
    path: String,
    /// Search: the lines holding this.
    q: Option<String>,
    /// A piece from this byte on (else the tail).
    from: Option<u64>,
    max: Option<u64>,
    /// The whole file, as a download.
    download: Option<String>,
}

pub(crate) async fn log(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<LogQuery>,
) -> Response {
    let e = match find(&app, &id) {
        Ok(e) => e,
        Err(r) => return *r,
    };
    // Only a log (the allowlist), every name of its path an id; then opened
    // beneath the run directory, through no link, a regular file.
    if let Err(why) = files::log_path(&q.path) {
        return bad(why.to_string());
    }
    let Some(file) = files::inside(&e.dir, &q.path) else {
        return not_found(format!("no log {} in run {id}", q.path));
    };
    if q.download.is_some() {
        let name = q.path.rsplit('/').next().unwrap_or("log").to_string();
        return download(&app, tokio::fs::File::from_std(file), &name);
    }
    if let Some(needle) = q.q.as_deref().filter(|n| !n.is_empty()) {
        let needle = needle.to_string();
        let red = app.redactor.clone();
        let r = tokio::task::spawn_blocking(move || files::search(file, &needle, 500, &red)).await;
        return match r {
            Ok(Ok((hits, more))) => redacted_json(&app, json!({"hits": hits, "more": more})),
            Ok(Err(e)) => internal(e),
            Err(e) => internal(e),
        };
    }
    let max = q.max.unwrap_or(256 << 10).min(4 << 20);
    let from = q.from;
    match tokio::task::spawn_blocking(move || files::slice(file, from, max)).await {
        Ok(Ok((start, end, t))) => {
            redacted_json(&app, json!({"from": start, "to": end, "text": t}))
        }
        Ok(Err(e)) => internal(e),
        Err(e) => internal(e),
    }
}

/// The whole file, streamed through the redactor (a secret split across
/// two reads is still caught).
fn download(app: &App, f: tokio::fs::File, name: &str) -> Response {
    let name = name.replace('"', "");
    let mut red = Some(StreamRedactor::new(app.redactor.clone()));
    let chunks = tokio_util_stream(f).map(move |chunk| {
        let mut out = Vec::new();
        match chunk {
            Ok(Some(b)) => {
                if let Some(r) = red.as_mut() {
                    r.push(&b, &mut out);
                }
            }
            Ok(None) => {
                if let Some(mut r) = red.take() {
                    r.finish(&mut out);
                }
            }
            Err(e) => return Err(e),
        }
        Ok::<_, std::io::Error>(bytes_of(out))
    });
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        Body::from_stream(chunks),
    )
        .into_response()
}

fn bytes_of(v: Vec<u8>) -> axum::body::Bytes {
    axum::body::Bytes::from(v)
}

/// The file in 64 KiB reads, then one `None` to flush the redactor.
fn tokio_util_stream(
    f: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<Option<Vec<u8>>>> {
    futures_util::stream::unfold(Some(f), |f| async move {
        use tokio::io::AsyncReadExt;
        let mut f = f?;
        let mut buf = vec![0u8; 64 << 10];
        match f.read(&mut buf).await {
            Ok(0) => Some((Ok(None), None)),
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Some(buf)), Some(f)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// A text record of run `id` (`rel` inside its directory, at most `max`
/// bytes), redacted, or why not.
fn record_text(app: &App, id: &str, rel: &str, max: u64, missing: String) -> Response {
    let e = match find(app, id) {
        Ok(e) => e,
        Err(r) => return *r,
    };
    match files::read_record(&e.dir, rel, max) {
        Some(t) => text(app, &t),
        None => not_found(missing),
    }
}

/// A commit's patch, as the engine recorded it.
pub(crate) async fn commit(
    State(app): State<Arc<App>>,
    Path((id, sha)): Path<(String, String)>,
) -> Response {
    if sha.is_empty() || sha.len() > 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return bad("a commit is named by its hex SHA");
    }
    let missing = format!("run {id} recorded no commit {sha}");
    record_text(&app, &id, &format!("commits/{sha}.patch"), 8 << 20, missing)
}

/// One of a run's named records (the Dockerfile, the manifest…).
pub(crate) async fn file(
    State(app): State<Arc<App>>,
    Path((id, name)): Path<(String, String)>,
) -> Response {
    if let Err(e) = Id::parse("record", &name) {
        return bad(e.to_string());
    }
    if !files::RECORDS.contains(&name.as_str()) {
        return bad(format!("{name} is not one of a run's records"));
    }
    let missing = format!("run {id} has no {name}");
    record_text(&app, &id, &name, 16 << 20, missing)
}
