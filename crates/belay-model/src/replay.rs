//! The scripted model server (`belay model replay`).
//!
//! It answers OpenAI Responses, Chat Completions, Anthropic Messages and
//! Google Gemini requests, streamed or not, from a script of turns, and appends
//! every request it receives to a JSONL log. Tests use it in place of the
//! remote model; users use it to rehearse a pipeline without spending tokens.
//! The script format is documented in `docs/models-and-agents.md`.
//!
//! Matching: each request takes the first unused turn, in script order, whose
//! `match` (if any) holds. A turn is used once unless it says `repeat: true`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::dialect;
use crate::types::{Api, Response, ToolCall, Usage};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read the replay script {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open the request log {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The request log cannot be read back ([`read_log`]).
    #[error("cannot read {}: {source}", path.display())]
    ReadLog {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A line of the request log is not a logged request.
    #[error("{}:{line}: {source}", path.display())]
    LogLine {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

impl belay_record::Classify for ReplayError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            ReplayError::Read { .. }
            | ReplayError::Invalid { .. }
            | ReplayError::LogLine { .. } => ExitClass::Usage,
            ReplayError::Bind { .. } => ExitClass::Infra,
            ReplayError::Log { source, .. } | ReplayError::ReadLog { source, .. } => {
                belay_record::io_class(source)
            }
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            ReplayError::ReadLog { source, .. } => belay_record::io_code(source),
            ReplayError::LogLine { .. } => "BELAY-E101",
            e => belay_record::Classify::exit_class(e).error_code(),
        }
    }
}

/// A replay script.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The model name replies carry (default: the one the request asked for).
    #[serde(default)]
    pub model: Option<String>,
    pub turns: Vec<Turn>,
}

/// One scripted answer.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// A label, written to the request log.
    #[serde(default)]
    pub name: Option<String>,
    /// Conditions the request must meet to take this turn.
    #[serde(default, rename = "match")]
    pub matcher: Option<Matcher>,
    #[serde(default)]
    pub reply: Option<Reply>,
    /// Answer with an HTTP error instead (429 and 5xx make clients retry).
    #[serde(default)]
    pub error: Option<ErrorReply>,
    /// Token counts to report (default: estimated from the text sizes).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Stay available after use (a default answer).
    #[serde(default)]
    pub repeat: bool,
    /// Wait before answering.
    #[serde(default)]
    pub delay_ms: u64,
    /// Streaming: close the connection after this many events (a dropped stream).
    #[serde(default)]
    pub drop_after: Option<usize>,
    /// Streaming: after this many events, go silent for `stall_ms`.
    #[serde(default)]
    pub stall_after: Option<usize>,
    #[serde(default)]
    pub stall_ms: u64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Matcher {
    /// Every string must occur in the request body.
    #[serde(default)]
    pub contains: OneOrMany,
    /// No string may occur in the request body.
    #[serde(default)]
    pub not_contains: OneOrMany,
    #[serde(default)]
    pub api: Option<Api>,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(untagged)]
pub enum OneOrMany {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn items(&self) -> &[String] {
        match self {
            OneOrMany::None => &[],
            OneOrMany::One(s) => std::slice::from_ref(s),
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    #[serde(default)]
    pub text: Option<String>,
    /// A JSON value, sent as the message text.
    #[serde(default)]
    pub json: Option<Value>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptCall>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptCall {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    /// An object, or a string sent as is (to script malformed arguments).
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorReply {
    pub status: u16,
    #[serde(default)]
    pub message: Option<String>,
    /// Seconds, sent as `Retry-After`.
    #[serde(default)]
    pub retry_after: Option<f64>,
}

/// Parse a script (YAML or JSON); `origin` names it in errors.
pub fn parse_script(text: &str, origin: &str) -> Result<Script, ReplayError> {
    let script: Script = serde_saphyr::from_str(text).map_err(|e| ReplayError::Invalid {
        origin: origin.to_string(),
        message: e.to_string(),
    })?;
    for (i, t) in script.turns.iter().enumerate() {
        let bad = |m: String| ReplayError::Invalid {
            origin: origin.to_string(),
            message: format!(
                "turn {} ({}): {m}",
                i + 1,
                t.name.as_deref().unwrap_or("unnamed")
            ),
        };
        match (&t.reply, &t.error) {
            (Some(_), Some(_)) => return Err(bad("has both `reply` and `error`; keep one".into())),
            (None, None) => return Err(bad("needs a `reply` or an `error`".into())),
            (Some(r), None) if r.text.is_some() && r.json.is_some() => {
                return Err(bad("`reply` has both `text` and `json`; keep one".into()))
            }
            (_, Some(e)) if !(400..=599).contains(&e.status) => {
                return Err(bad(format!("error status {} is not 4xx or 5xx", e.status)))
            }
            _ => {}
        }
    }
    Ok(script)
}

pub fn load_script(path: &Path) -> Result<Script, ReplayError> {
    let text = fs_err::read_to_string(path).map_err(|source| ReplayError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_script(&text, &path.display().to_string())
}

/// One line of the request log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoggedRequest {
    pub seq: u64,
    pub at: String,
    pub method: String,
    pub path: String,
    pub api: Option<Api>,
    pub model: Option<String>,
    pub stream: bool,
    /// Index (0-based) of the turn that answered, if one did.
    pub turn: Option<usize>,
    pub turn_name: Option<String>,
    pub status: u16,
    pub body: Value,
}

/// Read a request log.
pub fn read_log(path: &Path) -> Result<Vec<LoggedRequest>, ReplayError> {
    let text = fs_err::read_to_string(path).map_err(|source| ReplayError::ReadLog {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| ReplayError::LogLine {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

struct Inner {
    script: Script,
    used: Vec<bool>,
    seq: u64,
    log: Option<(PathBuf, std::fs::File)>,
}

type Shared = Arc<Mutex<Inner>>;

/// A running replay server.
pub struct ReplayServer {
    addr: SocketAddr,
    state: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl ReplayServer {
    /// Bind and serve in the background.
    pub async fn start(
        script: Script,
        addr: SocketAddr,
        log: Option<PathBuf>,
    ) -> Result<ReplayServer, ReplayError> {
        let log = match log {
            Some(p) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .map_err(|source| ReplayError::Log {
                        path: p.clone(),
                        source,
                    })?;
                Some((p, f))
            }
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ReplayError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ReplayError::Bind { addr, source })?;
        let state: Shared = Arc::new(Mutex::new(Inner {
            used: vec![false; script.turns.len()],
            script,
            seq: 0,
            log,
        }));
        // Agent conversations grow past axum's 2 MB default; cap at 256 MiB.
        let app = axum::Router::new()
            .fallback(handle)
            .layer(axum::extract::DefaultBodyLimit::max(256 * 1024 * 1024))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("replay server stopped: {e}");
            }
        });
        Ok(ReplayServer { addr, state, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`: the Anthropic base URL, and Gemini's
    /// (`GOOGLE_GEMINI_BASE_URL`; calls go to `/v1beta/models/{model}:…`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`: the OpenAI base URL.
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.state.lock().map(|s| s.seq).unwrap_or(0)
    }

    /// Scripted turns not used yet (repeating turns excluded).
    pub fn remaining(&self) -> usize {
        self.state
            .lock()
            .map(|s| {
                s.script
                    .turns
                    .iter()
                    .zip(&s.used)
                    .filter(|(t, u)| !t.repeat && !**u)
                    .count()
            })
            .unwrap_or(0)
    }

    /// Wait until the server task ends (it runs until the process stops).
    pub async fn wait(mut self) {
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
    }
}

impl Drop for ReplayServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A Gemini call's path, `…/models/{model}:{method}`: the model and the method.
fn gemini_call(path: &str) -> Option<(&str, &str)> {
    let (_, rest) = path.rsplit_once("/models/")?;
    let (model, method) = rest.split_once(':')?;
    (!model.is_empty() && !model.contains('/')).then_some((model, method))
}

/// A request from a Gemini client: a Gemini version in the path, or the
/// headers Google's SDKs send.
fn from_gemini_client(path: &str, headers: &HeaderMap) -> bool {
    path.starts_with("/v1beta/")
        || path.starts_with("/v1alpha/")
        || headers.contains_key("x-goog-api-key")
        || headers.contains_key("x-goog-api-client")
}

fn api_of(path: &str) -> Option<Api> {
    if matches!(
        gemini_call(path),
        Some((_, "generateContent" | "streamGenerateContent"))
    ) {
        Some(Api::Gemini)
    } else if path.ends_with("/responses") {
        Some(Api::Responses)
    } else if path.ends_with("/chat/completions") {
        Some(Api::ChatCompletions)
    } else if path.ends_with("/messages") {
        Some(Api::Anthropic)
    } else {
        None
    }
}

/// Every string value in a JSON document, joined by newlines: what `match`
/// compares with (so that quotes, newlines and non-ASCII match as written).
fn decoded_strings(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(a) => a.iter().for_each(|x| decoded_strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| decoded_strings(x, out)),
        _ => {}
    }
}

fn matches(t: &Turn, api: Api, model: Option<&str>, raw: &str, decoded: &str) -> bool {
    let Some(m) = &t.matcher else {
        return true;
    };
    let has = |s: &String| decoded.contains(s.as_str()) || raw.contains(s.as_str());
    m.api.is_none_or(|a| a == api)
        && m.model.as_deref().is_none_or(|x| Some(x) == model)
        && m.contains.items().iter().all(has)
        && !m.not_contains.items().iter().any(has)
}

fn error_body(api: Option<Api>, status: u16, message: &str) -> Value {
    match api {
        Some(Api::Anthropic) => {
            json!({"type": "error", "error": {"type": if status == 429 {"rate_limit_error"} else {"api_error"}, "message": message}})
        }
        Some(Api::Gemini) => dialect::gemini::error_body(status, message),
        Some(Api::Responses | Api::ChatCompletions) | None => {
            json!({"error": {"message": message, "type": if status == 429 {"rate_limit_exceeded"} else {"server_error"}, "code": status}})
        }
    }
}

/// Gemini's stream without `alt=sse`: one JSON array, a chunk per element.
fn json_array_frames(events: &[(String, String)]) -> Vec<Bytes> {
    let last = events.len().saturating_sub(1);
    events
        .iter()
        .enumerate()
        .map(|(i, (_, data))| {
            let mut f = String::from(if i == 0 { "[" } else { ",\r\n" });
            f.push_str(data);
            if i == last {
                f.push(']');
            }
            Bytes::from(f)
        })
        .collect()
}

/// What a request that uses no turn is answered (model lists, token counts),
/// or `None` for a request that needs a turn or goes to no endpoint.
fn meta_answer(
    method: &Method,
    path: &str,
    gemini_client: bool,
    model: Option<&str>,
    body_len: usize,
) -> Option<Value> {
    let gemini_model = |id: &str| {
        json!({"name": format!("models/{id}"), "version": "001", "displayName": id,
               "description": "a belay replay model",
               "inputTokenLimit": 1_048_576, "outputTokenLimit": 65_536,
               "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"]})
    };
    let id = model.unwrap_or("replay");
    if *method == Method::GET && path.ends_with("/models") {
        return Some(if gemini_client {
            json!({ "models": [gemini_model(id)] })
        } else {
            json!({"object": "list", "data": [{"id": id, "object": "model", "owned_by": "belay-replay"}]})
        });
    }
    if *method == Method::GET && gemini_client {
        if let Some((_, m)) = path.rsplit_once("/models/") {
            if !m.is_empty() && !m.contains(['/', ':']) {
                return Some(gemini_model(m));
            }
        }
    }
    if *method == Method::POST && path.ends_with("/messages/count_tokens") {
        return Some(json!({"input_tokens": body_len / 4}));
    }
    if *method == Method::POST && matches!(gemini_call(path), Some((_, "countTokens"))) {
        return Some(json!({"totalTokens": body_len / 4}));
    }
    None
}

fn sse_frame(event: &str, data: &str) -> Bytes {
    if event.is_empty() {
        Bytes::from(format!("data: {data}\n\n"))
    } else {
        Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
    }
}

fn scripted_response(turn: &Turn, seq: u64, body_len: usize) -> Response {
    let reply = turn.reply.clone().unwrap_or_default();
    let text = match (&reply.text, &reply.json) {
        (Some(t), _) => t.clone(),
        (None, Some(j)) => j.to_string(),
        (None, None) => String::new(),
    };
    let tool_calls: Vec<ToolCall> = reply
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, c)| ToolCall {
            id: c.id.clone().unwrap_or_else(|| format!("call_{seq}_{i}")),
            name: c.name.clone(),
            arguments: match &c.arguments {
                Value::String(s) => s.clone(),
                Value::Null => "{}".into(),
                v => v.to_string(),
            },
        })
        .collect();
    let out_chars = text.len()
        + tool_calls
            .iter()
            .map(|c| c.arguments.len() + c.name.len())
            .sum::<usize>();
    let usage = turn.usage.unwrap_or(Usage {
        input_tokens: (body_len / 4) as u64,
        cached_tokens: 0,
        output_tokens: (out_chars / 4) as u64 + 1,
        reasoning_tokens: 0,
    });
    Response {
        text,
        tool_calls,
        usage,
        ..Default::default()
    }
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let path = uri.path().to_string();
    let body_text = String::from_utf8_lossy(&body);
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // Gemini names the model and whether to stream in the path, the others in the body.
    let gemini = gemini_call(&path);
    let model = match gemini {
        Some((m, _)) => Some(m.to_string()),
        None => parsed
            .get("model")
            .and_then(Value::as_str)
            .map(String::from),
    };
    let stream = match gemini {
        Some((_, m)) => m == "streamGenerateContent",
        None => parsed
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    // Gemini streams SSE only with `?alt=sse`; without, one JSON array.
    let sse = gemini.is_none()
        || uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
    let gemini_client = gemini.is_some() || from_gemini_client(&path, &headers);
    let api = api_of(&path).filter(|_| method == Method::POST);
    let mut decoded = String::new();
    decoded_strings(&parsed, &mut decoded);

    // Pick the turn under the lock; answer outside it.
    let (seq, picked, listed_model) = {
        let Ok(mut s) = state.lock() else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "replay state poisoned").into_response();
        };
        s.seq += 1;
        let seq = s.seq;
        let picked = api.and_then(|api| {
            let i = (0..s.script.turns.len()).find(|&i| {
                !s.used[i]
                    && matches(
                        &s.script.turns[i],
                        api,
                        model.as_deref(),
                        &body_text,
                        &decoded,
                    )
            })?;
            if !s.script.turns[i].repeat {
                s.used[i] = true;
            }
            Some((i, s.script.turns[i].clone(), s.script.model.clone()))
        });
        (seq, picked, s.script.model.clone())
    };

    // Logged before answering: a client that hangs up mid-answer is still on record.
    let meta = match api {
        Some(_) => None,
        None => meta_answer(
            &method,
            &path,
            gemini_client,
            listed_model.as_deref().or(model.as_deref()),
            body.len(),
        ),
    };
    let status: u16 = match (api, &picked) {
        (None, _) if meta.is_some() => 200,
        (None, _) => 404,
        (Some(_), None) => 400,
        (Some(_), Some((_, t, _))) => t.error.as_ref().map(|e| e.status).unwrap_or(200),
    };
    let record = LoggedRequest {
        seq,
        at: belay_record::now_rfc3339(),
        method: method.to_string(),
        path: path.clone(),
        api,
        model: model.clone(),
        stream,
        turn: picked.as_ref().map(|p| p.0),
        turn_name: picked.as_ref().and_then(|p| p.1.name.clone()),
        status,
        body: parsed.clone(),
    };
    if let Ok(mut s) = state.lock() {
        if let Some((p, f)) = &mut s.log {
            if let Ok(mut line) = serde_json::to_string(&record) {
                line.push('\n');
                use std::io::Write;
                if let Err(e) = f.write_all(line.as_bytes()) {
                    tracing::error!("cannot append to {}: {e}", p.display());
                }
            }
        }
    }
    drop(record);

    match (api, &picked) {
        (None, _) => match meta {
            Some(v) => axum::Json(v).into_response(),
            None => {
                let msg = format!("belay replay: no such endpoint {method} {path}");
                let shape = gemini_client.then_some(Api::Gemini);
                (
                    StatusCode::NOT_FOUND,
                    axum::Json(error_body(shape, 404, &msg)),
                )
                    .into_response()
            }
        },
        (Some(api), None) => {
            let msg = format!(
                "belay replay: no scripted turn left for request #{seq} ({method} {path}); every turn that matches is used"
            );
            tracing::warn!("{msg}");
            (
                StatusCode::BAD_REQUEST,
                axum::Json(error_body(Some(api), 400, &msg)),
            )
                .into_response()
        }
        (Some(api), Some((_, turn, script_model))) => {
            if turn.delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(turn.delay_ms)).await;
            }
            let how = Delivery { stream, sse };
            answer(
                api,
                turn,
                seq,
                model.as_deref(),
                script_model.as_deref(),
                how,
                &parsed,
                body.len(),
            )
            .1
        }
    }
}

/// How a reply goes out: whole, or streamed as SSE or (Gemini without
/// `alt=sse`) as one JSON array sent chunk by chunk.
#[derive(Debug, Clone, Copy)]
struct Delivery {
    stream: bool,
    sse: bool,
}

#[allow(clippy::too_many_arguments)]
fn answer(
    api: Api,
    turn: &Turn,
    seq: u64,
    req_model: Option<&str>,
    script_model: Option<&str>,
    how: Delivery,
    req: &Value,
    body_len: usize,
) -> (u16, axum::response::Response) {
    let Delivery { stream, sse } = how;
    if let Some(e) = &turn.error {
        let msg = e
            .message
            .clone()
            .unwrap_or_else(|| format!("scripted error {}", e.status));
        let mut r = (
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(error_body(Some(api), e.status, &msg)),
        )
            .into_response();
        if let Some(ra) = e.retry_after {
            if let Ok(v) = ra.to_string().parse() {
                r.headers_mut().insert("retry-after", v);
            }
        }
        return (e.status, r);
    }
    let model = script_model.or(req_model).unwrap_or("replay");
    let resp = scripted_response(turn, seq, body_len);
    let id = format!("replay_{seq}");
    if !stream {
        let v = dialect::reply(api, &resp, &id, model);
        return (200, axum::Json(v).into_response());
    }
    let include_usage = req
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let events = dialect::reply_events(api, &resp, &id, model, include_usage);
    let frames: Vec<Bytes> = if sse {
        events.iter().map(|(e, d)| sse_frame(e, d)).collect()
    } else {
        json_array_frames(&events)
    };
    let drop_after = turn.drop_after;
    let stall = turn
        .stall_after
        .map(|n| (n, Duration::from_millis(turn.stall_ms)));
    let s = futures_util::stream::unfold(0usize, move |i| {
        let frames = frames.clone();
        async move {
            if let Some((n, d)) = stall {
                if i == n {
                    tokio::time::sleep(d).await;
                }
            }
            if drop_after == Some(i) {
                return Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "scripted drop",
                    )),
                    usize::MAX,
                ));
            }
            let f = frames.get(i)?.clone();
            Some((Ok::<Bytes, std::io::Error>(f), i + 1))
        }
    });
    let mut r = Body::from_stream(s).into_response();
    r.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static(if sse {
            "text/event-stream"
        } else {
            "application/json"
        }),
    );
    r.headers_mut().insert(
        "cache-control",
        axum::http::HeaderValue::from_static("no-cache"),
    );
    (200, r)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn script_errors_name_the_turn_and_the_line() {
        let e = parse_script(
            "turns:\n  - name: a\n    reply: {text: hi}\n    error: {status: 429}\n",
            "s.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("turn 1 (a)") && e.contains("both"), "{e}");
        let e = parse_script("turns:\n  - reply: {txt: hi}\n", "s.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("s.yaml: ") && e.contains("txt") && e.contains("line 2"),
            "{e}"
        );
        let e = parse_script("turns:\n  - error: {status: 200}\n", "s.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not 4xx"), "{e}");
    }

    #[test]
    fn json_scripts_parse_too() {
        let s = parse_script(
            r#"{"turns":[{"reply":{"json":{"a":[1,2]}},"repeat":true}]}"#,
            "s.json",
        )
        .unwrap();
        assert!(s.turns[0].repeat);
        let r = scripted_response(&s.turns[0], 1, 40);
        assert_eq!(r.text, r#"{"a":[1,2]}"#);
        assert_eq!(r.usage.input_tokens, 10);
    }
}
