//! OpenAI Chat Completions: `POST {base}/chat/completions`. Also what local
//! servers (llama.cpp, Ollama, vLLM) speak.

use serde_json::{json, Value};

use super::DecodeError;
use super::{args_text, chunks, str_of, u64_at};
use crate::sse::Event;
use crate::types::{Message, Request, Response, ToolCall, Usage};

pub fn body(req: &Request, model: &str, stream: bool) -> Value {
    let mut messages = Vec::new();
    if let Some(i) = &req.instructions {
        messages.push(json!({"role": "system", "content": i}));
    }
    for m in &req.messages {
        match m {
            Message::User { content } => messages.push(json!({"role": "user", "content": content})),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let mut v = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    v["tool_calls"] = Value::Array(
                        tool_calls
                            .iter()
                            .map(|c| {
                                json!({"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments}})
                            })
                            .collect(),
                    );
                }
                messages.push(v);
            }
            Message::Tool {
                call_id, content, ..
            } => {
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}))
            }
        }
    }
    let mut b = json!({"model": model, "messages": messages, "stream": stream});
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    if !req.tools.is_empty() {
        b["tools"] = Value::Array(
            req.tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {"name": t.name,
                       "description": t.description, "parameters": t.parameters}})
                })
                .collect(),
        );
    }
    if req.json_output {
        b["response_format"] = json!({"type": "json_object"});
    }
    if let Some(n) = req.max_output_tokens {
        b["max_tokens"] = json!(n);
    }
    if let Some(t) = req.temperature {
        b["temperature"] = json!(t);
    }
    b
}

fn usage(v: &Value) -> Usage {
    Usage {
        input_tokens: u64_at(v, &["prompt_tokens"]),
        cached_tokens: u64_at(v, &["prompt_tokens_details", "cached_tokens"]),
        output_tokens: u64_at(v, &["completion_tokens"]),
        reasoning_tokens: u64_at(v, &["completion_tokens_details", "reasoning_tokens"]),
    }
}

pub fn parse(v: &Value) -> Result<Response, DecodeError> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or("a Chat Completions reply without `choices`")?;
    let msg = choice.get("message").unwrap_or(&Value::Null);
    let mut r = Response {
        text: str_of(msg, "content").unwrap_or_default(),
        finish_reason: str_of(choice, "finish_reason"),
        id: str_of(v, "id"),
        model: str_of(v, "model"),
        ..Default::default()
    };
    if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            r.tool_calls.push(ToolCall {
                id: str_of(c, "id").unwrap_or_default(),
                name: c
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                arguments: args_text(c.pointer("/function/arguments")),
            });
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
    /// Tool calls by stream index: (id, name, arguments).
    calls: Vec<(String, String, String)>,
}

impl Stream {
    pub fn finished(&self) -> bool {
        self.resp.finish_reason.is_some()
    }

    pub fn on_event(&mut self, ev: &Event) -> Result<bool, DecodeError> {
        let data = ev.data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| format!("a Chat Completions stream chunk that is not JSON ({e})"))?;
        if let Some(msg) = super::error_message(&v) {
            return Err(msg.into());
        }
        if self.resp.id.is_none() {
            self.resp.id = str_of(&v, "id");
            self.resp.model = str_of(&v, "model");
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.resp.usage = usage(u);
        }
        let Some(choice) = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(false);
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(t) = delta.get("content").and_then(Value::as_str) {
                self.resp.text.push_str(t);
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for c in calls {
                    let idx = c
                        .get("index")
                        .and_then(Value::as_u64)
                        .map(|i| i as usize)
                        .unwrap_or(self.calls.len().saturating_sub(1));
                    // Bounded: an index far past the calls seen is malformed.
                    if idx > self.calls.len() + 64 {
                        return Err(format!("a tool call index {idx} out of range").into());
                    }
                    while self.calls.len() <= idx {
                        self.calls.push(Default::default());
                    }
                    let slot = &mut self.calls[idx];
                    if let Some(id) = c.get("id").and_then(Value::as_str) {
                        slot.0 = id.to_string();
                    }
                    if let Some(n) = c.pointer("/function/name").and_then(Value::as_str) {
                        slot.1.push_str(n);
                    }
                    if let Some(a) = c.pointer("/function/arguments").and_then(Value::as_str) {
                        slot.2.push_str(a);
                    }
                }
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.resp.finish_reason = Some(f.to_string());
        }
        Ok(false)
    }

    pub fn into_response(mut self) -> Response {
        for (id, name, args) in self.calls {
            if !name.is_empty() {
                self.resp.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: if args.is_empty() { "{}".into() } else { args },
                });
            }
        }
        self.resp
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
           "total_tokens": u.input_tokens + u.output_tokens,
           "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
           "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}})
}

fn finish(r: &Response) -> &'static str {
    if r.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

/// Server side: a whole reply.
pub fn reply(r: &Response, id: &str, model: &str) -> Value {
    let mut msg = json!({"role": "assistant", "content": r.text});
    if !r.tool_calls.is_empty() {
        msg["tool_calls"] = Value::Array(
            r.tool_calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect(),
        );
    }
    json!({"id": id, "object": "chat.completion", "created": 0, "model": model,
           "choices": [{"index": 0, "message": msg, "finish_reason": finish(r)}],
           "usage": usage_json(&r.usage)})
}

/// Server side: the SSE chunks of a streamed reply (`include_usage` decides
/// whether the final usage chunk is sent, as OpenAI does).
pub fn reply_events(
    r: &Response,
    id: &str,
    model: &str,
    include_usage: bool,
) -> Vec<(String, String)> {
    let mut ev = Vec::new();
    let chunk = |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    ev.push((
        String::new(),
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
    ));
    for d in chunks(&r.text, 24) {
        ev.push((String::new(), chunk(json!({"content": d}), Value::Null)));
    }
    for (i, c) in r.tool_calls.iter().enumerate() {
        ev.push((
            String::new(),
            chunk(
                json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": ""}}]}),
                Value::Null,
            ),
        ));
        for a in chunks(&c.arguments, 32) {
            ev.push((
                String::new(),
                chunk(
                    json!({"tool_calls": [{"index": i, "function": {"arguments": a}}]}),
                    Value::Null,
                ),
            ));
        }
    }
    ev.push((String::new(), chunk(json!({}), json!(finish(r)))));
    if include_usage {
        ev.push((
            String::new(),
            json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
                   "choices": [], "usage": usage_json(&r.usage)})
            .to_string(),
        ));
    }
    ev.push((String::new(), "[DONE]".into()));
    ev
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn null_content_and_missing_usage() {
        let v = serde_json::json!({"choices":[{"message":{"role":"assistant","content":null},"finish_reason":"stop"}]});
        let r = parse(&v).unwrap();
        assert_eq!(r.text, "");
        assert_eq!(r.usage, Usage::default());
        assert!(parse(&serde_json::json!({"object":"x"})).is_err());
    }
}
