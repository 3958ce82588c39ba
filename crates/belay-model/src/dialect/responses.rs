//! OpenAI Responses: `POST {base}/responses`.

use serde_json::{json, Value};

use super::DecodeError;
use super::{args_text, chunks, str_of, u64_at};
use crate::sse::Event;
use crate::types::{Message, Request, Response, ToolCall, Usage};

pub fn body(req: &Request, model: &str, stream: bool) -> Value {
    let mut input = Vec::new();
    for m in &req.messages {
        match m {
            Message::User { content } => input.push(json!({
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": content}]
            })),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                if !content.is_empty() {
                    input.push(json!({
                        "type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": content}]
                    }));
                }
                for c in tool_calls {
                    input.push(json!({
                        "type": "function_call", "call_id": c.id,
                        "name": c.name, "arguments": c.arguments
                    }));
                }
            }
            Message::Tool {
                call_id, content, ..
            } => input.push(json!({
                "type": "function_call_output", "call_id": call_id, "output": content
            })),
        }
    }
    let mut b = json!({"model": model, "input": input, "stream": stream, "store": false});
    if let Some(i) = &req.instructions {
        b["instructions"] = json!(i);
    }
    if !req.tools.is_empty() {
        b["tools"] = Value::Array(
            req.tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.parameters})
                })
                .collect(),
        );
    }
    if req.json_output {
        b["text"] = json!({"format": {"type": "json_object"}});
    }
    if let Some(n) = req.max_output_tokens {
        b["max_output_tokens"] = json!(n);
    }
    if let Some(t) = req.temperature {
        b["temperature"] = json!(t);
    }
    b
}

fn usage(v: &Value) -> Usage {
    Usage {
        input_tokens: u64_at(v, &["input_tokens"]),
        cached_tokens: u64_at(v, &["input_tokens_details", "cached_tokens"]),
        output_tokens: u64_at(v, &["output_tokens"]),
        reasoning_tokens: u64_at(v, &["output_tokens_details", "reasoning_tokens"]),
    }
}

/// Add one output item to a response.
fn take_item(item: &Value, r: &mut Response) {
    match item.get("type").and_then(Value::as_str) {
        Some("message") => {
            if let Some(parts) = item.get("content").and_then(Value::as_array) {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        r.text.push_str(t);
                    }
                }
            }
        }
        Some("function_call") => r.tool_calls.push(ToolCall {
            id: str_of(item, "call_id")
                .or_else(|| str_of(item, "id"))
                .unwrap_or_default(),
            name: str_of(item, "name").unwrap_or_default(),
            arguments: args_text(item.get("arguments")),
        }),
        _ => {}
    }
}

pub fn parse(v: &Value) -> Result<Response, DecodeError> {
    let output = v
        .get("output")
        .and_then(Value::as_array)
        .ok_or("a Responses reply without `output`")?;
    let mut r = Response {
        id: str_of(v, "id"),
        model: str_of(v, "model"),
        finish_reason: str_of(v, "status"),
        ..Default::default()
    };
    for item in output {
        take_item(item, &mut r);
    }
    if let Some(u) = v.get("usage") {
        r.usage = usage(u);
    }
    Ok(r)
}

#[derive(Debug, Default)]
pub struct Stream {
    resp: Response,
    /// Text from deltas, used when no `output_item.done` carried a message.
    delta_text: String,
    items_seen: bool,
}

impl Stream {
    pub fn on_event(&mut self, ev: &Event) -> Result<bool, DecodeError> {
        let v: Value = serde_json::from_str(&ev.data)
            .map_err(|e| format!("a Responses stream event that is not JSON ({e})"))?;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(ev.event.as_str());
        match kind {
            "response.output_text.delta" => {
                if let Some(d) = v.get("delta").and_then(Value::as_str) {
                    self.delta_text.push_str(d);
                }
            }
            "response.output_item.done" => {
                if let Some(item) = v.get("item") {
                    self.items_seen = true;
                    take_item(item, &mut self.resp);
                }
            }
            "response.completed" | "response.incomplete" => {
                let full = v.get("response").cloned().unwrap_or(Value::Null);
                if !self.items_seen {
                    if let Some(items) = full.get("output").and_then(Value::as_array) {
                        for item in items {
                            self.items_seen = true;
                            take_item(item, &mut self.resp);
                        }
                    }
                }
                if let Some(u) = full.get("usage") {
                    self.resp.usage = usage(u);
                }
                self.resp.id = str_of(&full, "id");
                self.resp.model = str_of(&full, "model");
                self.resp.finish_reason = str_of(&full, "status");
                return Ok(true);
            }
            "response.failed" | "error" => {
                let msg = v
                    .pointer("/response/error/message")
                    .or_else(|| v.pointer("/error/message"))
                    .or_else(|| v.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("the model reported a failure");
                return Err(msg.into());
            }
            _ => {}
        }
        Ok(false)
    }

    pub fn into_response(mut self) -> Response {
        if self.resp.text.is_empty() && !self.delta_text.is_empty() {
            self.resp.text = self.delta_text;
        }
        self.resp
    }
}

fn output_items(r: &Response) -> Vec<Value> {
    let mut items = Vec::new();
    if !r.text.is_empty() || r.tool_calls.is_empty() {
        items.push(json!({
            "type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": r.text, "annotations": []}]
        }));
    }
    for (i, c) in r.tool_calls.iter().enumerate() {
        items.push(json!({
            "type": "function_call", "id": format!("fc_{i}"), "status": "completed",
            "call_id": c.id, "name": c.name, "arguments": c.arguments
        }));
    }
    items
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens + u.output_tokens
    })
}

/// Server side: a whole reply.
pub fn reply(r: &Response, id: &str, model: &str) -> Value {
    json!({
        "id": id, "object": "response", "created_at": 0, "status": "completed",
        "model": model, "output": output_items(r), "usage": usage_json(&r.usage)
    })
}

/// Server side: the SSE events of a streamed reply, as `(event, data)`.
pub fn reply_events(r: &Response, id: &str, model: &str) -> Vec<(String, String)> {
    let mut ev = Vec::new();
    let mut seq = 0u64;
    let mut push = |kind: &str, mut v: Value| {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(seq);
        seq += 1;
        ev.push((kind.to_string(), v.to_string()));
    };
    let shell = json!({"id": id, "object": "response", "created_at": 0, "status": "in_progress",
                       "model": model, "output": []});
    push("response.created", json!({ "response": shell }));
    for (idx, item) in output_items(r).into_iter().enumerate() {
        let mut started = item.clone();
        if item["type"] == "message" {
            started["content"] = json!([]);
            push(
                "response.output_item.added",
                json!({"output_index": idx, "item": started}),
            );
            for d in chunks(&r.text, 24) {
                push(
                    "response.output_text.delta",
                    json!({"output_index": idx, "content_index": 0, "item_id": item["id"], "delta": d}),
                );
            }
            push(
                "response.output_text.done",
                json!({"output_index": idx, "content_index": 0, "item_id": item["id"], "text": r.text}),
            );
        } else {
            started["arguments"] = json!("");
            push(
                "response.output_item.added",
                json!({"output_index": idx, "item": started}),
            );
            push(
                "response.function_call_arguments.delta",
                json!({"output_index": idx, "item_id": item["id"], "delta": item["arguments"]}),
            );
        }
        push(
            "response.output_item.done",
            json!({"output_index": idx, "item": item}),
        );
    }
    push(
        "response.completed",
        json!({ "response": reply(r, id, model) }),
    );
    ev
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn unknown_fields_and_items_pass() {
        let v = serde_json::json!({"id":"x","output":[{"type":"reasoning","summary":[]},
            {"type":"message","content":[{"type":"output_text","text":"ok","logprobs":[]}]}],
            "usage":{"input_tokens":3,"output_tokens":1},"extra":{"a":1}});
        assert_eq!(parse(&v).unwrap().text, "ok");
    }
}
