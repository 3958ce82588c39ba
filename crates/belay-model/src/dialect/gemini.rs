//! Google Gemini, the Generative Language API:
//! `POST {base}/v1beta/models/{model}:generateContent`, streamed as
//! `:streamGenerateContent?alt=sse`. The model is in the path, not the body;
//! the key goes in `x-goog-api-key`.
//!
//! A request is `{contents: [{role: user|model, parts: [...]}],
//! systemInstruction, tools: [{functionDeclarations}], generationConfig}`; a
//! reply (and each stream chunk) is `{candidates: [{content: {role: model,
//! parts}, finishReason}], usageMetadata, modelVersion, responseId}`. Parts are
//! `{text}`, `{functionCall: {id?, name, args}}` and `{functionResponse: {id?,
//! name, response}}`. A stream has no completion event: it ends after the
//! chunk that carries the `finishReason`.

use serde_json::{json, Map, Value};

use super::DecodeError;
use super::{args_text, chunks, str_of, u64_at};
use crate::sse::Event;
use crate::types::{Message, Request, Response, ToolCall, Usage};

/// The API version a base URL without one gets (what the Gemini SDKs use).
pub const API_VERSION: &str = "v1beta";

/// Sent with a function call belay replays from its history: Gemini 3 asks
/// for the model's thought signature there, and this is the value Google
/// documents (and the Gemini CLI sends) for calls it did not just generate.
pub const SYNTHETIC_THOUGHT_SIGNATURE: &str = "skip_thought_signature_validator";

/// `v1`, `v1beta`, `v1alpha`...: a path segment that names an API version.
fn is_version(seg: &str) -> bool {
    seg.strip_prefix('v').is_some_and(|r| {
        r.starts_with(|c: char| c.is_ascii_digit()) && r.chars().all(|c| c.is_ascii_alphanumeric())
    })
}

/// The models collection under `base`: `{base}/v1beta/models`, or
/// `{base}/models` when the path of `base` already ends with a version.
pub fn models_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    let after_scheme = base.split_once("://").map_or(base, |(_, r)| r);
    let path = after_scheme.split_once('/').map_or("", |(_, p)| p);
    if is_version(path.rsplit('/').next().unwrap_or("")) {
        format!("{base}/models")
    } else {
        format!("{base}/{API_VERSION}/models")
    }
}

/// The model's id in a path: `models/gemini-2.5-pro` and `gemini-2.5-pro` are
/// the same model.
pub fn model_id(model: &str) -> &str {
    model.strip_prefix("models/").unwrap_or(model)
}

/// The URL of one call: the model and the method are in the path.
pub fn url(base: &str, model: &str, stream: bool) -> String {
    let root = models_url(base);
    let m = model_id(model);
    if stream {
        format!("{root}/{m}:streamGenerateContent?alt=sse")
    } else {
        format!("{root}/{m}:generateContent")
    }
}

/// A call's arguments as the object Gemini wants (`{}` when the text is not
/// a JSON object: the API refuses anything else).
fn args_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// The request body (the model and `stream` are in the URL).
pub fn body(req: &Request) -> Value {
    let mut contents: Vec<Value> = Vec::new();
    for m in &req.messages {
        match m {
            Message::User { content } => {
                contents.push(json!({"role": "user", "parts": [{"text": content}]}))
            }
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let mut parts = Vec::new();
                if !content.is_empty() {
                    parts.push(json!({"text": content}));
                }
                for (i, c) in tool_calls.iter().enumerate() {
                    let mut call = json!({"name": c.name, "args": args_object(&c.arguments)});
                    if !c.id.is_empty() {
                        call["id"] = json!(c.id);
                    }
                    let mut part = json!({ "functionCall": call });
                    // Only the first call of a turn carries a signature.
                    if i == 0 {
                        part["thoughtSignature"] = json!(SYNTHETIC_THOUGHT_SIGNATURE);
                    }
                    parts.push(part);
                }
                // Gemini refuses a turn without parts.
                if parts.is_empty() {
                    parts.push(json!({"text": "(no answer)"}));
                }
                contents.push(json!({"role": "model", "parts": parts}));
            }
            Message::Tool {
                call_id,
                name,
                content,
            } => {
                let mut resp = json!({"name": name, "response": {"output": content}});
                if !call_id.is_empty() {
                    resp["id"] = json!(call_id);
                }
                let part = json!({ "functionResponse": resp });
                // The answers to one turn's calls go back in one user turn.
                match contents.last_mut() {
                    Some(last)
                        if last["role"] == "user"
                            && last["parts"].as_array().is_some_and(|a| {
                                a.iter().all(|p| p.get("functionResponse").is_some())
                            }) =>
                    {
                        if let Some(a) = last["parts"].as_array_mut() {
                            a.push(part);
                        }
                    }
                    _ => contents.push(json!({"role": "user", "parts": [part]})),
                }
            }
        }
    }
    let mut b = json!({ "contents": contents });
    if let Some(i) = &req.instructions {
        b["systemInstruction"] = json!({"parts": [{"text": i}]});
    }
    if !req.tools.is_empty() {
        let decls: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({"name": t.name, "description": t.description,
                       "parametersJsonSchema": t.parameters})
            })
            .collect();
        b["tools"] = json!([{ "functionDeclarations": decls }]);
    }
    let mut config = Map::new();
    if req.json_output {
        config.insert("responseMimeType".into(), json!("application/json"));
    }
    if let Some(n) = req.max_output_tokens {
        config.insert("maxOutputTokens".into(), json!(n));
    }
    if let Some(t) = req.temperature {
        config.insert("temperature".into(), json!(t));
    }
    if !config.is_empty() {
        b["generationConfig"] = Value::Object(config);
    }
    b
}

/// `usageMetadata`: the prompt count includes the cached part; thoughts are
/// counted apart from the candidates, and belay counts them as output (as
/// OpenAI does) and as reasoning.
fn usage(v: &Value) -> Usage {
    let thoughts = u64_at(v, &["thoughtsTokenCount"]);
    Usage {
        input_tokens: u64_at(v, &["promptTokenCount"]) + u64_at(v, &["toolUsePromptTokenCount"]),
        cached_tokens: u64_at(v, &["cachedContentTokenCount"]),
        output_tokens: u64_at(v, &["candidatesTokenCount"]) + thoughts,
        reasoning_tokens: thoughts,
    }
}

/// Why a reply has no candidate: a blocked prompt says so.
fn no_candidate(v: &Value) -> DecodeError {
    match v
        .pointer("/promptFeedback/blockReason")
        .and_then(Value::as_str)
    {
        Some(reason) => format!("Gemini blocked the prompt ({reason})").into(),
        None => "a Gemini reply without `candidates`".into(),
    }
}

/// Add one reply (or stream chunk) to `r`: the first candidate's text and
/// calls, its finish reason, the usage, the id and the model. `calls` counts
/// the calls so far, to name those that come without an id.
fn take_chunk(v: &Value, r: &mut Response, calls: &mut usize) {
    if r.id.is_none() {
        r.id = str_of(v, "responseId");
    }
    if let Some(m) = str_of(v, "modelVersion") {
        r.model = Some(m);
    }
    if let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) {
        r.usage = usage(u);
    }
    let Some(cand) = v
        .get("candidates")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    else {
        return;
    };
    if let Some(parts) = cand.pointer("/content/parts").and_then(Value::as_array) {
        for p in parts {
            // Thought summaries are not the answer.
            if p.get("thought").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            if let Some(t) = p.get("text").and_then(Value::as_str) {
                r.text.push_str(t);
            }
            if let Some(fc) = p.get("functionCall") {
                let id = str_of(fc, "id").unwrap_or_else(|| match &r.id {
                    Some(rid) => format!("{rid}_call_{calls}"),
                    None => format!("call_{calls}"),
                });
                r.tool_calls.push(ToolCall {
                    id,
                    name: str_of(fc, "name").unwrap_or_default(),
                    arguments: args_text(fc.get("args")),
                });
                *calls += 1;
            }
        }
    }
    if let Some(f) = str_of(cand, "finishReason") {
        r.finish_reason = Some(f);
    }
}

/// A whole reply.
pub fn parse(v: &Value) -> Result<Response, DecodeError> {
    if v.get("candidates")
        .and_then(Value::as_array)
        .is_none_or(|c| c.is_empty())
    {
        return Err(no_candidate(v));
    }
    let mut r = Response::default();
    take_chunk(v, &mut r, &mut 0);
    Ok(r)
}

/// A streamed reply: every SSE event is one reply chunk.
#[derive(Debug, Default)]
pub struct Stream {
    resp: Response,
    calls: usize,
}

impl Stream {
    /// A chunk with a finish reason arrived: what came is the whole answer.
    pub fn finished(&self) -> bool {
        self.resp.finish_reason.is_some()
    }

    /// Take one chunk. Never `Ok(true)`: Gemini has no completion event, the
    /// stream ends after the chunk with the finish reason ([`Self::finished`]).
    pub fn on_event(&mut self, ev: &Event) -> Result<bool, DecodeError> {
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| format!("a Gemini stream chunk that is not JSON ({e})"))?;
        if let Some(msg) = super::error_message(&v) {
            return Err(msg.into());
        }
        if v.get("candidates").is_none() && v.pointer("/promptFeedback/blockReason").is_some() {
            return Err(no_candidate(&v));
        }
        take_chunk(&v, &mut self.resp, &mut self.calls);
        Ok(false)
    }

    pub fn into_response(self) -> Response {
        self.resp
    }
}

/// Server side: a call as a `functionCall` (arguments that are no JSON object
/// go as the string they are, to script a malformed call).
fn call_part(c: &ToolCall) -> Value {
    let args = match serde_json::from_str::<Value>(&c.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(c.arguments.clone()),
    };
    let mut call = json!({"name": c.name, "args": args});
    if !c.id.is_empty() {
        call["id"] = json!(c.id);
    }
    json!({ "functionCall": call })
}

fn usage_json(u: &Usage) -> Value {
    let mut v = json!({
        "promptTokenCount": u.input_tokens,
        "candidatesTokenCount": u.output_tokens.saturating_sub(u.reasoning_tokens),
        "totalTokenCount": u.input_tokens + u.output_tokens,
    });
    if u.cached_tokens > 0 {
        v["cachedContentTokenCount"] = json!(u.cached_tokens);
    }
    if u.reasoning_tokens > 0 {
        v["thoughtsTokenCount"] = json!(u.reasoning_tokens);
    }
    v
}

/// Gemini answers `STOP` for text and for function calls alike.
const FINISH: &str = "STOP";

fn chunk_json(parts: Vec<Value>, last: bool, r: &Response, id: &str, model: &str) -> Value {
    let mut cand = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    let mut v = json!({"candidates": [], "modelVersion": model, "responseId": id});
    if last {
        cand["finishReason"] = json!(FINISH);
        v["usageMetadata"] = usage_json(&r.usage);
    }
    v["candidates"] = json!([cand]);
    v
}

/// Server side: a whole reply (`:generateContent`).
pub fn reply(r: &Response, id: &str, model: &str) -> Value {
    let mut parts = Vec::new();
    if !r.text.is_empty() {
        parts.push(json!({"text": r.text}));
    }
    parts.extend(r.tool_calls.iter().map(call_part));
    chunk_json(parts, true, r, id, model)
}

/// Server side: the chunks of a streamed reply (`:streamGenerateContent`),
/// as SSE `(event, data)` pairs without an event name: the text in deltas,
/// then the calls, the last chunk with the finish reason and the usage.
/// (No part is an empty text: the Gemini SDK drops a chunk that has one.)
pub fn reply_events(r: &Response, id: &str, model: &str) -> Vec<(String, String)> {
    let mut parts: Vec<Vec<Value>> = chunks(&r.text, 24)
        .into_iter()
        .map(|d| vec![json!({ "text": d })])
        .collect();
    if !r.tool_calls.is_empty() {
        parts.push(r.tool_calls.iter().map(call_part).collect());
    }
    if parts.is_empty() {
        parts.push(Vec::new());
    }
    let last = parts.len() - 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            (
                String::new(),
                chunk_json(p, i == last, r, id, model).to_string(),
            )
        })
        .collect()
}

/// Google's canonical status for an HTTP status.
pub fn status_name(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        412 => "FAILED_PRECONDITION",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "NOT_IMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        s if (400..500).contains(&s) => "FAILED_PRECONDITION",
        _ => "INTERNAL",
    }
}

/// Server side: an error body, `{"error": {code, message, status}}`.
pub fn error_body(status: u16, message: &str) -> Value {
    json!({"error": {"code": status, "message": message, "status": status_name(status)}})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::types::ToolSpec;
    use proptest::prelude::*;

    fn call(id: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "terminal".into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn urls_put_the_model_and_the_method_in_the_path() {
        assert_eq!(
            url("https://generativelanguage.googleapis.com/", "gemini-2.5-pro", true),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            url("http://127.0.0.1:9", "models/gemini-2.5-flash", false),
            "http://127.0.0.1:9/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(
            url("http://h/api/v1", "m", false),
            "http://h/api/v1/models/m:generateContent"
        );
        // A port is no version.
        assert_eq!(models_url("http://v1:80"), "http://v1:80/v1beta/models");
    }

    /// The body as the Gemini CLI's own requests have it: the system prompt as
    /// `systemInstruction`, tools as `functionDeclarations` with a JSON
    /// schema, the model's turns as `model`, the answers to one turn's calls
    /// in one user turn.
    #[test]
    fn the_body_has_the_shape_gemini_wants() {
        let req = Request {
            instructions: Some("be brief".into()),
            messages: vec![
                Message::user("go"),
                Message::Assistant {
                    content: "ok".into(),
                    tool_calls: vec![call("a", "{\"command\":\"ls\"}"), call("b", "not json")],
                },
                Message::Tool {
                    call_id: "a".into(),
                    name: "terminal".into(),
                    content: "1".into(),
                },
                Message::Tool {
                    call_id: "b".into(),
                    name: "terminal".into(),
                    content: "2".into(),
                },
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![],
                },
            ],
            tools: vec![ToolSpec {
                name: "terminal".into(),
                description: "run".into(),
                parameters: json!({"type": "object"}),
            }],
            json_output: true,
            max_output_tokens: Some(100),
            temperature: Some(0.5),
        };
        let b = body(&req);
        assert_eq!(b["systemInstruction"]["parts"][0]["text"], "be brief");
        let c = b["contents"].as_array().unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(c[1]["role"], "model");
        let parts = c[1]["parts"].as_array().unwrap();
        assert_eq!(parts[1]["functionCall"]["args"]["command"], "ls");
        assert_eq!(parts[1]["thoughtSignature"], SYNTHETIC_THOUGHT_SIGNATURE);
        assert_eq!(parts[2]["functionCall"]["args"], json!({}));
        assert!(parts[2].get("thoughtSignature").is_none());
        assert_eq!(c[2]["role"], "user");
        let answers = c[2]["parts"].as_array().unwrap();
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[1]["functionResponse"]["id"], "b");
        assert_eq!(answers[1]["functionResponse"]["response"]["output"], "2");
        assert_eq!(c[3]["parts"][0]["text"], "(no answer)");
        let decl = &b["tools"][0]["functionDeclarations"][0];
        assert_eq!(decl["parametersJsonSchema"]["type"], "object");
        assert_eq!(
            b["generationConfig"],
            json!({"responseMimeType": "application/json", "maxOutputTokens": 100, "temperature": 0.5})
        );
        assert!(b.get("model").is_none() && b.get("stream").is_none());
    }

    /// What the real API sends: no call ids, thought parts, thoughts counted
    /// apart, unknown fields.
    #[test]
    fn a_real_reply_decodes() {
        let v = json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "thinking...", "thought": true},
                {"text": "Let me look."},
                {"functionCall": {"name": "ls", "args": {"dir": "."}}, "thoughtSignature": "abc"},
                {"functionCall": {"name": "cat", "args": {}}}]},
                "finishReason": "STOP", "index": 0, "safetyRatings": []}],
            "usageMetadata": {"promptTokenCount": 100, "cachedContentTokenCount": 40,
                "candidatesTokenCount": 10, "thoughtsTokenCount": 5, "totalTokenCount": 115},
            "modelVersion": "gemini-2.5-flash", "responseId": "r1"});
        let r = parse(&v).unwrap();
        assert_eq!(r.text, "Let me look.");
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(r.tool_calls[0].id, "r1_call_0");
        assert_eq!(r.tool_calls[1].id, "r1_call_1");
        assert_eq!(r.tool_calls[0].arguments, "{\"dir\":\".\"}");
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 100,
                cached_tokens: 40,
                output_tokens: 15,
                reasoning_tokens: 5
            }
        );
        assert_eq!(r.finish_reason.as_deref(), Some("STOP"));
        assert_eq!(r.model.as_deref(), Some("gemini-2.5-flash"));
        let blocked = json!({"promptFeedback": {"blockReason": "SAFETY"}});
        assert!(parse(&blocked).unwrap_err().0.contains("SAFETY"));
        assert!(parse(&json!({"x": 1})).is_err());
    }

    #[test]
    fn a_stream_is_whole_only_after_its_finish_reason() {
        let mut s = Stream::default();
        let ev = |d: &str| Event {
            event: "message".into(),
            data: d.into(),
        };
        s.on_event(&ev(r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"he"}]}}],"usageMetadata":{"promptTokenCount":3}}"#)).unwrap();
        assert!(!s.finished());
        s.on_event(&ev(r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"llo"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":2}}"#)).unwrap();
        assert!(s.finished());
        let r = s.into_response();
        assert_eq!((r.text.as_str(), r.usage.output_tokens), ("hello", 2));
        let e = Stream::default()
            .on_event(&ev(
                r#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}"#,
            ))
            .unwrap_err();
        assert_eq!(e.0, "quota");
    }

    #[test]
    fn the_server_side_never_sends_an_empty_text_part() {
        let r = Response {
            tool_calls: vec![call("c", "{}")],
            ..Default::default()
        };
        let evs = reply_events(&r, "i", "m");
        assert_eq!(evs.len(), 1);
        assert!(!evs[0].1.contains("\"text\""), "{}", evs[0].1);
        let empty = reply_events(&Response::default(), "i", "m");
        assert_eq!(empty.len(), 1);
        let v: Value = serde_json::from_str(&empty[0].1).unwrap();
        assert_eq!(v["candidates"][0]["content"]["parts"], json!([]));
        assert_eq!(v["candidates"][0]["finishReason"], "STOP");
        assert!(!reply(&r, "i", "m").to_string().contains("\"text\""));
    }

    #[test]
    fn errors_have_google_s_shape() {
        let e = error_body(429, "slow down");
        assert_eq!(
            e,
            json!({"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}})
        );
        assert_eq!(
            super::super::error_message(&e).as_deref(),
            Some("slow down")
        );
        assert_eq!(status_name(418), "FAILED_PRECONDITION");
        assert_eq!(status_name(502), "INTERNAL");
    }

    proptest! {
        /// Any text and calls (arguments objects or not) come back from the
        /// server side as they went, whole and streamed.
        #[test]
        fn replies_round_trip(
            text in "\\PC{0,80}",
            args in proptest::collection::vec(
                prop_oneof![
                    "[a-z]{1,8}".prop_map(|k| format!("{{\"{k}\":1}}")),
                    "[a-z{}\\[\\]\":, ]{0,12}",
                ],
                0..3,
            ),
            input in 0u64..1_000_000,
            output in 0u64..1_000,
        ) {
            let r = Response {
                text,
                tool_calls: args.iter().enumerate().map(|(i, a)| call(&format!("c{i}"), a)).collect(),
                usage: Usage { input_tokens: input, output_tokens: output, ..Default::default() },
                ..Default::default()
            };
            let whole = parse(&reply(&r, "id", "m")).unwrap();
            let mut s = Stream::default();
            for (event, data) in reply_events(&r, "id", "m") {
                prop_assert!(!s.finished());
                s.on_event(&Event { event, data }).unwrap();
            }
            prop_assert!(s.finished());
            // Arguments compare as JSON where they are JSON (an object goes
            // as an object, so its spacing may change).
            let norm = |a: &str| serde_json::from_str::<Value>(a).unwrap_or_else(|_| json!(["raw", a]));
            for got in [whole, s.into_response()] {
                prop_assert_eq!(&got.text, &r.text);
                prop_assert_eq!(got.tool_calls.len(), r.tool_calls.len());
                for (g, w) in got.tool_calls.iter().zip(&r.tool_calls) {
                    prop_assert_eq!((&g.id, &g.name), (&w.id, &w.name));
                    prop_assert_eq!(norm(&g.arguments), norm(&w.arguments));
                }
                prop_assert_eq!(got.usage, r.usage);
            }
        }

        /// Arbitrary chunks never panic the stream.
        #[test]
        fn garbage_chunks_never_panic(data in "\\PC{0,200}") {
            let _ = Stream::default().on_event(&Event { event: "message".into(), data });
        }
    }
}
