//! The HTTP front end: a loopback endpoint for other tools (a board, a CI
//! job) to submit jobs and read their status, with a bearer token. The
//! gates are open over HTTP only when the config says the token is the
//! owner's (`trusted = true`).
//!
//! `POST /jobs` (a job's fields; `body` required) → `201 {"id", "waits_for_approval"}`;
//! `GET /jobs` → the queue; `GET /jobs/{id}` → where it is, and its record
//! once done; `POST /jobs/{id}/{accept|decline|approve|discard}`.
//!
//! An id in a route is parsed by the one validator before anything uses it
//! (`400` otherwise), and no answer shows a path of the host: errors give
//! ids and a short reason.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use belay_record::Id;
use serde_json::{json, Value};

use crate::config::HttpConfig;
use crate::job::Request;
use crate::queue::{Dir, Queue};
use crate::services::Services;
use crate::worker::Stop;
use crate::{gates, JobsError};

#[derive(Clone)]
struct App {
    svc: Arc<Services>,
    wake: Arc<tokio::sync::Notify>,
    token: Arc<String>,
    cfg: HttpConfig,
}

fn authorized(app: &App, h: &HeaderMap) -> bool {
    let Some(v) = h.get("authorization").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(t) = v.strip_prefix("Bearer ") else {
        return false;
    };
    belay_record::same_secret(t.as_bytes(), app.token.as_bytes())
}

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(json!({"error": msg.into()}))).into_response()
}

fn refused(e: JobsError) -> Response {
    let code = match belay_record::Classify::exit_class(&e) {
        belay_record::ExitClass::Usage => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    err(code, e.reply())
}

/// The job id of a route, or the `400` that says why it is none.
fn route_id(raw: &str) -> Result<Id, Box<Response>> {
    Id::parse("job", raw).map_err(|e| Box::new(err(StatusCode::BAD_REQUEST, e.to_string())))
}

/// Text for a client, without host paths (a failure's reason may quote
/// one).
fn public_text(v: Option<&str>) -> Value {
    match v {
        Some(t) => Value::String(crate::public::without_paths(t).into_owned()),
        None => Value::Null,
    }
}

async fn submit(
    State(app): State<App>,
    h: HeaderMap,
    body: Result<Json<Request>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if !authorized(&app, &h) {
        return err(StatusCode::UNAUTHORIZED, "a bearer token is needed");
    }
    let mut s = match body {
        Ok(Json(s)) => s,
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("not a valid job: {e}")),
    };
    if s.id.is_some() {
        return err(
            StatusCode::BAD_REQUEST,
            "not a valid job: an id is belay's to give over HTTP",
        );
    }
    let sender = format!("http:{}", app.cfg.name);
    // Only the owner's token may speak for someone: an untrusted one asks
    // as itself, whatever it says.
    let requested_by = match (s.requested_by.take(), app.cfg.trusted) {
        (Some(r), true) => r,
        (None, true) => crate::config::LOCAL_SENDER.to_string(),
        (_, false) => sender.clone(),
    };
    let mut job = s.into_job(&sender, "http");
    job.requested_by = Some(requested_by);
    match gates::submit(&app.svc, job) {
        Ok(s) => {
            app.wake.notify_waiters();
            (
                StatusCode::CREATED,
                Json(json!({"id": s.id, "waits_for_approval": s.waits_for_approval})),
            )
                .into_response()
        }
        Err(e) => refused(e),
    }
}

fn describe(d: Dir, p: &std::path::Path) -> Option<Value> {
    let j = Queue::read(p).ok()?;
    Some(
        json!({"id": j.id, "state": d.as_str(), "sender": j.sender, "requested_by": j.requester(), "preview": j.preview(80), "failure": public_text(j.belay.failure.as_deref())}),
    )
}

async fn list(State(app): State<App>, h: HeaderMap) -> Response {
    if !authorized(&app, &h) {
        return err(StatusCode::UNAUTHORIZED, "a bearer token is needed");
    }
    let q = &app.svc.queue;
    // An untrusted token sees its own jobs only.
    let mine = format!("http:{}", app.cfg.name);
    let mut out = Vec::new();
    for d in Dir::ALL {
        for p in q.list(d).unwrap_or_default() {
            if let Some(v) = describe(d, &p) {
                if app.cfg.trusted || v["sender"] == mine.as_str() {
                    out.push(v);
                }
            }
        }
    }
    Json(json!({"jobs": out})).into_response()
}

async fn show(State(app): State<App>, h: HeaderMap, Path(raw): Path<String>) -> Response {
    if !authorized(&app, &h) {
        return err(StatusCode::UNAUTHORIZED, "a bearer token is needed");
    }
    let id = match route_id(&raw) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let q = &app.svc.queue;
    let mine = format!("http:{}", app.cfg.name);
    if !app.cfg.trusted {
        // Its own jobs only: those whose run names it as the sender.
        let own = q
            .find(&id)
            .and_then(|(_, p)| Queue::read(&p).ok())
            .map(|j| j.sender == mine)
            .or_else(|| {
                let ev = q.run_dir(&id).join(belay_record::EVENTS_FILE);
                // host-owned: the job's run under the queue, named by a parsed id.
                fs_err::read_to_string(ev)
                    .ok()
                    .map(|t| t.contains(&format!("\"sender\":\"{mine}\"")))
            })
            .unwrap_or(false);
        if !own {
            return err(StatusCode::NOT_FOUND, format!("no job {id} of this token"));
        }
    }
    if let Some((d, p)) = q.find(&id) {
        if let Some(v) = describe(d, &p) {
            return Json(v).into_response();
        }
    }
    // host-owned: the queue's done/ (0700), named by a parsed id.
    if let Ok(t) = fs_err::read_to_string(q.done_file(&id)) {
        if let Ok(mut rec) = serde_json::from_str::<Value>(&t) {
            let detail = public_text(rec["failure_detail"].as_str());
            if !detail.is_null() {
                rec["failure_detail"] = detail;
            }
            return Json(json!({"id": id, "state": "done", "record": rec})).into_response();
        }
    }
    err(StatusCode::NOT_FOUND, format!("no job {id}"))
}

async fn gate(
    State(app): State<App>,
    h: HeaderMap,
    Path((raw, verb)): Path<(String, String)>,
) -> Response {
    if !authorized(&app, &h) {
        return err(StatusCode::UNAUTHORIZED, "a bearer token is needed");
    }
    if !app.cfg.trusted {
        return err(
            StatusCode::FORBIDDEN,
            "the gates are the owner's: set trusted = true in [http] to open them to this token",
        );
    }
    let id = match route_id(&raw) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let by = crate::config::LOCAL_SENDER;
    // A gate runs to its end even if the client goes away (an approval
    // commits and pushes): it is a task of its own, awaited here.
    let svc = app.svc.clone();
    let task = tokio::spawn(async move {
        match verb.as_str() {
            "accept" => Some(gates::accept(&svc, &id, by).map(|m| (id, m))),
            "decline" => Some(gates::decline(&svc, &id, by).map(|m| (id, m))),
            "approve" => Some(gates::approve(&svc, &id, by).await.map(|m| (id, m))),
            "discard" => Some(gates::discard(&svc, &id, by).await.map(|m| (id, m))),
            _ => None,
        }
    });
    let r = match task.await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return err(
                StatusCode::NOT_FOUND,
                "no such gate: accept, decline, approve or discard",
            )
        }
        Err(e) => {
            return err(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the gate stopped: {e}"),
            )
        }
    };
    app.wake.notify_waiters();
    match r {
        Ok((id, m)) => Json(json!({"id": id, "message": m})).into_response(),
        Err(e) => refused(e),
    }
}

/// Serve until `stop`.
pub async fn run(
    svc: Arc<Services>,
    wake: Arc<tokio::sync::Notify>,
    stop: Stop,
) -> Result<(), JobsError> {
    let Some(cfg) = svc.cfg.http.clone() else {
        return Ok(());
    };
    let token = std::env::var(&cfg.token_env).map_err(|_| {
        JobsError::Config(format!(
            "[http] token_env names {}, which is not set: export a random token there",
            cfg.token_env
        ))
    })?;
    if token.len() < 16 {
        return Err(JobsError::Config(format!("[http] the token in {} is shorter than 16 characters: use a random one (openssl rand -hex 24)", cfg.token_env)));
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| JobsError::Environment(format!("cannot listen on {}: {e}", cfg.listen)))?;
    let app = App {
        svc: svc.clone(),
        wake,
        token: Arc::new(token),
        cfg: cfg.clone(),
    };
    let router = Router::new()
        .route("/jobs", post(submit).get(list))
        .route("/jobs/{id}", get(show))
        .route("/jobs/{id}/{verb}", post(gate))
        .with_state(app);
    svc.tell(&crate::events::JobEvent::HttpListening {
        url: format!("http://{}", cfg.listen),
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            stop.wait().await;
        })
        .await
        .map_err(|e| JobsError::Environment(format!("the HTTP endpoint stopped: {e}")))
}
