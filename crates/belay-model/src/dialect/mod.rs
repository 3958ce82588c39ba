//! The four wire dialects: request bodies, replies (whole and streamed), and
//! the server side of each (used by the replay server).
//!
//! Replies are read from `serde_json::Value` so that unknown fields, and the
//! small differences of local servers (Ollama, llama.cpp, vLLM), pass through.

pub mod anthropic;
pub mod chat;
pub mod gemini;
pub mod responses;

use serde_json::Value;

use crate::sse::Event;
use crate::types::{Api, Request, Response};

/// The URL of a dialect's endpoint under `base`. For Gemini, whose calls
/// name the model and the method in the path, it is the models collection
/// (`{base}/v1beta/models`); [`call_url`] is the URL of one call.
pub fn endpoint(api: Api, base: &str) -> String {
    let base = base.trim_end_matches('/');
    match api {
        Api::Responses => format!("{base}/responses"),
        Api::ChatCompletions => format!("{base}/chat/completions"),
        Api::Anthropic if base.ends_with("/v1") => format!("{base}/messages"),
        Api::Anthropic => format!("{base}/v1/messages"),
        Api::Gemini => gemini::models_url(base),
    }
}

/// The URL a call to `model` goes to: the dialect's endpoint, except for
/// Gemini, where it is `{base}/v1beta/models/{model}:generateContent` (or
/// `:streamGenerateContent?alt=sse`).
pub fn call_url(api: Api, base: &str, model: &str, stream: bool) -> String {
    match api {
        Api::Gemini => gemini::url(base, model, stream),
        _ => endpoint(api, base),
    }
}

/// The request body (Gemini's names neither the model nor `stream`: the URL does).
pub fn body(api: Api, req: &Request, model: &str, stream: bool) -> Value {
    match api {
        Api::Responses => responses::body(req, model, stream),
        Api::ChatCompletions => chat::body(req, model, stream),
        Api::Anthropic => anthropic::body(req, model, stream),
        Api::Gemini => gemini::body(req),
    }
}

/// Why a reply or a stream event could not be read (the client wraps it in
/// `ModelError::Decode` or `ModelError::Stream` with the endpoint).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

impl From<String> for DecodeError {
    fn from(s: String) -> Self {
        DecodeError(s)
    }
}

impl From<&str> for DecodeError {
    fn from(s: &str) -> Self {
        DecodeError(s.to_string())
    }
}

/// A whole (non-streamed) reply.
pub fn parse(api: Api, v: &Value) -> Result<Response, DecodeError> {
    match api {
        Api::Responses => responses::parse(v),
        Api::ChatCompletions => chat::parse(v),
        Api::Anthropic => anthropic::parse(v),
        Api::Gemini => gemini::parse(v),
    }
}

/// Server side: a whole reply in the dialect's shape.
pub fn reply(api: Api, r: &Response, id: &str, model: &str) -> Value {
    match api {
        Api::Responses => responses::reply(r, id, model),
        Api::ChatCompletions => chat::reply(r, id, model),
        Api::Anthropic => anthropic::reply(r, id, model),
        Api::Gemini => gemini::reply(r, id, model),
    }
}

/// Server side: a streamed reply as SSE `(event, data)` pairs.
/// `include_usage`: Chat Completions sends usage only when asked.
pub fn reply_events(
    api: Api,
    r: &Response,
    id: &str,
    model: &str,
    include_usage: bool,
) -> Vec<(String, String)> {
    match api {
        Api::Responses => responses::reply_events(r, id, model),
        Api::ChatCompletions => chat::reply_events(r, id, model, include_usage),
        Api::Anthropic => anthropic::reply_events(r, id, model),
        Api::Gemini => gemini::reply_events(r, id, model),
    }
}

/// Accumulates a streamed reply event by event.
#[derive(Debug)]
pub enum StreamState {
    Responses(responses::Stream),
    Chat(chat::Stream),
    Anthropic(anthropic::Stream),
    Gemini(gemini::Stream),
}

impl StreamState {
    pub fn new(api: Api) -> Self {
        match api {
            Api::Responses => StreamState::Responses(Default::default()),
            Api::ChatCompletions => StreamState::Chat(Default::default()),
            Api::Anthropic => StreamState::Anthropic(Default::default()),
            Api::Gemini => StreamState::Gemini(Default::default()),
        }
    }

    /// Take one event; `Ok(true)` when the stream says it is complete.
    pub fn on_event(&mut self, ev: &Event) -> Result<bool, DecodeError> {
        match self {
            StreamState::Responses(s) => s.on_event(ev),
            StreamState::Chat(s) => s.on_event(ev),
            StreamState::Anthropic(s) => s.on_event(ev),
            StreamState::Gemini(s) => s.on_event(ev),
        }
    }

    /// The stream ended without its completion event: is what arrived whole
    /// enough to use? (Some local servers omit `[DONE]` after a finish reason;
    /// Gemini has no completion event: its stream ends after the finish reason.)
    pub fn usable_without_end(&self) -> bool {
        match self {
            StreamState::Chat(s) => s.finished(),
            StreamState::Gemini(s) => s.finished(),
            StreamState::Responses(_) | StreamState::Anthropic(_) => false,
        }
    }

    pub fn into_response(self) -> Response {
        match self {
            StreamState::Responses(s) => s.into_response(),
            StreamState::Chat(s) => s.into_response(),
            StreamState::Anthropic(s) => s.into_response(),
            StreamState::Gemini(s) => s.into_response(),
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

/// An answer that does not decode is the model's failure (exit 1).
impl belay_record::Classify for DecodeError {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Failed
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::types::{ToolCall, Usage};

    /// Tool calls equal as calls: Anthropic carries arguments as an object,
    /// so their JSON text may come back with its keys in another order.
    fn same_calls(a: &[ToolCall], b: &[ToolCall]) -> bool {
        let norm = |c: &ToolCall| {
            let v: Value = serde_json::from_str(&c.arguments).unwrap();
            (c.id.clone(), c.name.clone(), v)
        };
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| norm(x) == norm(y))
    }

    /// What the server side writes, the client side reads back: whole and
    /// streamed, text (non-ASCII, over several deltas), a tool call and usage.
    #[test]
    fn every_dialect_round_trips() {
        let r = Response {
            text: "héllo wörld, a longer text that spans several deltas".into(),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "edit".into(),
                arguments: "{\"path\":\"a.txt\",\"old\":\"x\",\"new\":\"y\"}".into(),
            }],
            usage: Usage {
                input_tokens: 12,
                cached_tokens: 4,
                output_tokens: 6,
                reasoning_tokens: 0,
            },
            ..Default::default()
        };
        for api in [
            Api::Responses,
            Api::ChatCompletions,
            Api::Anthropic,
            Api::Gemini,
        ] {
            let whole = parse(api, &reply(api, &r, "id_1", "m")).unwrap();
            assert_eq!(whole.text, r.text, "{api}");
            assert!(
                same_calls(&whole.tool_calls, &r.tool_calls),
                "{api}: {:?}",
                whole.tool_calls
            );
            assert_eq!(whole.usage, r.usage, "{api}");
            let mut s = StreamState::new(api);
            let mut done = false;
            for (event, data) in reply_events(api, &r, "id_1", "m", true) {
                assert!(!done, "{api}: an event after the completion event");
                done = s.on_event(&Event { event, data }).unwrap();
            }
            // Gemini has no completion event: its stream ends after the finish reason.
            assert!(
                done || (api == Api::Gemini && s.usable_without_end()),
                "{api}: no completion event"
            );
            let streamed = s.into_response();
            assert_eq!(streamed.text, r.text, "{api}");
            assert!(
                same_calls(&streamed.tool_calls, &r.tool_calls),
                "{api}: {:?}",
                streamed.tool_calls
            );
            assert_eq!(streamed.usage, r.usage, "{api}");
        }
    }
}
