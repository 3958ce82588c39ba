//! The three wire dialects: request bodies, replies (whole and streamed), and
//! the server side of each (used by the replay server).
//!
//! Replies are read from `serde_json::Value` so that unknown fields, and the
//! small differences of local servers (Ollama, llama.cpp, vLLM), pass through.

pub mod anthropic;
pub mod chat;
pub mod responses;

use serde_json::Value;

use crate::sse::Event;
use crate::types::{Api, Request, Response};

/// The URL of a dialect's endpoint under `base`.
pub fn endpoint(api: Api, base: &str) -> String {
    let base = base.trim_end_matches('/');
    match api {
        Api::Responses => format!("{base}/responses"),
        Api::ChatCompletions => format!("{base}/chat/completions"),
        Api::Anthropic if base.ends_with("/v1") => format!("{base}/messages"),
        Api::Anthropic => format!("{base}/v1/messages"),
    }
}

/// The request body.
pub fn body(api: Api, req: &Request, model: &str, stream: bool) -> Value {
    match api {
        Api::Responses => responses::body(req, model, stream),
        Api::ChatCompletions => chat::body(req, model, stream),
        Api::Anthropic => anthropic::body(req, model, stream),
    }
}

/// A whole (non-streamed) reply.
pub fn parse(api: Api, v: &Value) -> Result<Response, String> {
    match api {
        Api::Responses => responses::parse(v),
        Api::ChatCompletions => chat::parse(v),
        Api::Anthropic => anthropic::parse(v),
    }
}

/// Accumulates a streamed reply event by event.
#[derive(Debug)]
pub enum StreamState {
    Responses(responses::Stream),
    Chat(chat::Stream),
    Anthropic(anthropic::Stream),
}

impl StreamState {
    pub fn new(api: Api) -> Self {
        match api {
            Api::Responses => StreamState::Responses(Default::default()),
            Api::ChatCompletions => StreamState::Chat(Default::default()),
            Api::Anthropic => StreamState::Anthropic(Default::default()),
        }
    }

    /// Take one event; `Ok(true)` when the stream says it is complete.
    pub fn on_event(&mut self, ev: &Event) -> Result<bool, String> {
        match self {
            StreamState::Responses(s) => s.on_event(ev),
            StreamState::Chat(s) => s.on_event(ev),
            StreamState::Anthropic(s) => s.on_event(ev),
        }
    }

    /// The stream ended without its completion event: is what arrived whole
    /// enough to use? (Some local servers omit `[DONE]` after a finish reason.)
    pub fn usable_without_end(&self) -> bool {
        match self {
            StreamState::Chat(s) => s.finished(),
            _ => false,
        }
    }

    pub fn into_response(self) -> Response {
        match self {
            StreamState::Responses(s) => s.into_response(),
            StreamState::Chat(s) => s.into_response(),
            StreamState::Anthropic(s) => s.into_response(),
        }
    }
}

/// The error message inside an error body, whatever the dialect.
pub fn error_message(v: &Value) -> Option<String> {
    let e = v.get("error")?;
    e.get("message")
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| e.as_str().map(String::from))
}

fn str_of(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(String::from)
}

fn u64_at(v: &Value, path: &[&str]) -> u64 {
    let mut cur = v;
    for k in path {
        match cur.get(k) {
            Some(n) => cur = n,
            None => return 0,
        }
    }
    cur.as_u64().unwrap_or(0)
}

/// Tool-call arguments as JSON text, whether the model gave an object or a string.
fn args_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "{}".into(),
        Some(other) => other.to_string(),
    }
}

/// Split text into stream deltas (on char boundaries).
pub(crate) fn chunks(text: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut count = 0;
    for (i, _) in text.char_indices() {
        if count == size {
            out.push(&text[start..i]);
            start = i;
            count = 0;
        }
        count += 1;
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}
