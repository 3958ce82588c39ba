//! Anthropic Messages: `POST {base}/v1/messages`.

use serde_json::{json, Value};

use super::DecodeError;
use super::{chunks, str_of, u64_at};
use crate::sse::Event;
use crate::types::{Message, Request, Response, ToolCall, Usage};

/// Anthropic requires `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

pub fn body(req: &Request, model: &str, stream: bool) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    for m in &req.messages {
        match m {
            Message::User { content } => messages
                .push(json!({"role": "user", "content": [{"type": "text", "text": content}]})),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let mut parts = Vec::new();
                if !content.is_empty() {
                    parts.push(json!({"type": "text", "text": content}));
                }
                for c in tool_calls {
                    let input: Value =
                        serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                    parts.push(
                        json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}),
                    );
                }
                // Anthropic refuses an empty assistant turn.
                if parts.is_empty() {
                    parts.push(json!({"type": "text", "text": "(no answer)"}));
                }
                messages.push(json!({"role": "assistant", "content": parts}));
            }
            Message::Tool {
                call_id, content, ..
            } => {
                let part =
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": content});
                // Consecutive tool results share one user turn.
                match messages.last_mut() {
                    Some(last)
                        if last["role"] == "user"
                            && last["content"]
                                .as_array()
                                .is_some_and(|a| a.iter().all(|p| p["type"] == "tool_result")) =>
                    {
                        if let Some(a) = last["content"].as_array_mut() {
                            a.push(part);
                        }
                    }
                    _ => messages.push(json!({"role": "user", "content": [part]})),
                }
            }
        }
    }
    let mut b = json!({
        "model": model,
        "max_tokens": req.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": messages,
        "stream": stream,
    });
    if let Some(i) = &req.instructions {
        b["system"] = json!(i);
    }
    if !req.tools.is_empty() {
        b["tools"] = Value::Array(
            req.tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect(),
        );
    }
    if let Some(t) = req.temperature {
        b["temperature"] = json!(t);
    }
    b
}

fn usage(v: &Value) -> Usage {
    Usage {
        input_tokens: u64_at(v, &["input_tokens"])
            + u64_at(v, &["cache_read_input_tokens"])
            + u64_at(v, &["cache_creation_input_tokens"]),
        cached_tokens: u64_at(v, &["cache_read_input_tokens"]),
        output_tokens: u64_at(v, &["output_tokens"]),
        reasoning_tokens: 0,
    }
}

pub fn parse(v: &Value) -> Result<Response, DecodeError> {
    let content = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or("an Anthropic reply without `content`")?;
    let mut r = Response {
        id: str_of(v, "id"),
        model: str_of(v, "model"),
        finish_reason: str_of(v, "stop_reason"),
        ..Default::default()
    };
    for part in content {
        match part.get("type").and_then(Value::as_str) {
            Some("text") => r
                .text
                .push_str(part.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => r.tool_calls.push(ToolCall {
                id: str_of(part, "id").unwrap_or_default(),
                name: str_of(part, "name").unwrap_or_default(),
                arguments: part
                    .get("input")
                    .map(Value::to_string)
                    .unwrap_or_else(|| "{}".into()),
            }),
            _ => {}
        }
    }
    if let Some(u) = v.get("usage") {
        r.usage = usage(u);
    }
    Ok(r)
}

#[derive(Debug, Default)]
pub struct Stream {
    resp: Response,
    /// Content blocks by index: (kind, id, name, text-or-json).
    blocks: Vec<(String, String, String, String)>,
}

impl Stream {
    pub fn on_event(&mut self, ev: &Event) -> Result<bool, DecodeError> {
        let v: Value = serde_json::from_str(&ev.data)
            .map_err(|e| format!("an Anthropic stream event that is not JSON ({e})"))?;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(ev.event.as_str());
        match kind {
            "message_start" => {
                let m = v.get("message").unwrap_or(&Value::Null);
                self.resp.id = str_of(m, "id");
                self.resp.model = str_of(m, "model");
                if let Some(u) = m.get("usage") {
                    self.resp.usage = usage(u);
                }
            }
            "content_block_start" => {
                let idx = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                if idx > self.blocks.len() + 64 {
                    return Err(format!("a content block index {idx} out of range").into());
                }
                while self.blocks.len() <= idx {
                    self.blocks.push(Default::default());
                }
                let b = v.get("content_block").unwrap_or(&Value::Null);
                self.blocks[idx] = (
                    str_of(b, "type").unwrap_or_default(),
                    str_of(b, "id").unwrap_or_default(),
                    str_of(b, "name").unwrap_or_default(),
                    str_of(b, "text").unwrap_or_default(),
                );
            }
            "content_block_delta" => {
                let idx = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                let d = v.get("delta").unwrap_or(&Value::Null);
                if let Some(b) = self.blocks.get_mut(idx) {
                    if let Some(t) = d
                        .get("text")
                        .or_else(|| d.get("partial_json"))
                        .and_then(Value::as_str)
                    {
                        b.3.push_str(t);
                    }
                }
            }
            "message_delta" => {
                if let Some(s) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.resp.finish_reason = Some(s.to_string());
                }
                let out = u64_at(&v, &["usage", "output_tokens"]);
                if out > 0 {
                    self.resp.usage.output_tokens = out;
                }
            }
            "message_stop" => return Ok(true),
            "error" => {
                return Err(v
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("the model reported an error")
                    .into())
            }
            _ => {}
        }
        Ok(false)
    }

    pub fn into_response(mut self) -> Response {
        for (kind, id, name, body) in self.blocks {
            match kind.as_str() {
                "text" => self.resp.text.push_str(&body),
                "tool_use" => self.resp.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: if body.is_empty() { "{}".into() } else { body },
                }),
                _ => {}
            }
        }
        self.resp
    }
}

fn content(r: &Response) -> Vec<Value> {
    let mut parts = Vec::new();
    if !r.text.is_empty() || r.tool_calls.is_empty() {
        parts.push(json!({"type": "text", "text": r.text}));
    }
    for c in &r.tool_calls {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
        parts.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
    }
    parts
}

fn stop(r: &Response) -> &'static str {
    if r.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

/// Server side: a whole reply.
pub fn reply(r: &Response, id: &str, model: &str) -> Value {
    json!({"id": id, "type": "message", "role": "assistant", "model": model,
           "content": content(r), "stop_reason": stop(r), "stop_sequence": null,
           "usage": {"input_tokens": r.usage.input_tokens.saturating_sub(r.usage.cached_tokens),
                     "cache_read_input_tokens": r.usage.cached_tokens,
                     "cache_creation_input_tokens": 0,
                     "output_tokens": r.usage.output_tokens}})
}

/// Server side: the SSE events of a streamed reply.
pub fn reply_events(r: &Response, id: &str, model: &str) -> Vec<(String, String)> {
    let mut ev = Vec::new();
    let mut push = |kind: &str, mut v: Value| {
        v["type"] = json!(kind);
        ev.push((kind.to_string(), v.to_string()));
    };
    let mut start = reply(r, id, model);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    push("message_start", json!({ "message": start }));
    for (i, part) in content(r).into_iter().enumerate() {
        if part["type"] == "text" {
            push(
                "content_block_start",
                json!({"index": i, "content_block": {"type": "text", "text": ""}}),
            );
            for d in chunks(&r.text, 24) {
                push(
                    "content_block_delta",
                    json!({"index": i, "delta": {"type": "text_delta", "text": d}}),
                );
            }
        } else {
            push(
                "content_block_start",
                json!({"index": i, "content_block": {"type": "tool_use", "id": part["id"],
                       "name": part["name"], "input": {}}}),
            );
            push(
                "content_block_delta",
                json!({"index": i, "delta": {"type": "input_json_delta",
                       "partial_json": part["input"].to_string()}}),
            );
        }
        push("content_block_stop", json!({ "index": i }));
    }
    push(
        "message_delta",
        json!({"delta": {"stop_reason": stop(r), "stop_sequence": null},
               "usage": {"output_tokens": r.usage.output_tokens}}),
    );
    push("message_stop", json!({}));
    ev
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tool_results_share_a_user_turn() {
        let req = Request {
            messages: vec![
                Message::user("go"),
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![
                        ToolCall {
                            id: "a".into(),
                            name: "x".into(),
                            arguments: "{}".into(),
                        },
                        ToolCall {
                            id: "b".into(),
                            name: "x".into(),
                            arguments: "{}".into(),
                        },
                    ],
                },
                Message::Tool {
                    call_id: "a".into(),
                    name: "x".into(),
                    content: "1".into(),
                },
                Message::Tool {
                    call_id: "b".into(),
                    name: "x".into(),
                    content: "2".into(),
                },
            ],
            ..Default::default()
        };
        let b = body(&req, "m", false);
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[2]["content"].as_array().unwrap().len(), 2);
    }
}
