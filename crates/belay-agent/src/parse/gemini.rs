//! Gemini CLI, `gemini -p PROMPT --output-format stream-json`.

use belay_model::Usage;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{bad_line, raw_text, tail, StreamParser};
use crate::AgentEvent;

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    role: Option<&'a str>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    delta: Option<bool>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_id: Option<String>,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default, borrow)]
    output: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    severity: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    stats: Option<Stats>,
}

#[derive(Deserialize, Default)]
struct Stats {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cached: u64,
}

#[derive(Debug, Default)]
pub struct GeminiParser {
    /// The assistant message being streamed in deltas.
    pending: String,
    last_message: String,
}

impl GeminiParser {
    fn flush(&mut self, out: &mut Vec<AgentEvent>) {
        if !self.pending.is_empty() {
            let text = std::mem::take(&mut self.pending);
            self.last_message.clone_from(&text);
            out.push(AgentEvent::Message { text });
        }
    }
}

impl StreamParser for GeminiParser {
    fn line(&mut self, line: &[u8], out: &mut Vec<AgentEvent>) {
        let l: Line = match serde_json::from_slice(line) {
            Ok(l) => l,
            Err(e) => return out.push(bad_line(line, &e.to_string())),
        };
        if l.kind != "message" {
            self.flush(out);
        }
        match l.kind {
            "init" => out.push(AgentEvent::Session {
                id: l.session_id.unwrap_or_default(),
                model: l.model,
            }),
            "message" if l.role == Some("assistant") => {
                let c = l.content.unwrap_or_default();
                if l.delta.unwrap_or(false) {
                    self.pending.push_str(&c);
                    // A message is kept as its tail: bounded however long it streams.
                    if self.pending.len() > 2 * super::OUTPUT_KEEP * 4 {
                        self.pending = super::tail(std::mem::take(&mut self.pending));
                    }
                } else {
                    self.flush(out);
                    self.pending = c;
                    self.flush(out);
                }
            }
            "tool_use" => out.push(AgentEvent::ToolCall {
                id: l.tool_id.unwrap_or_default(),
                name: l.tool_name.unwrap_or_default(),
                input: l
                    .parameters
                    .map(|p| p.get().to_string())
                    .unwrap_or_default(),
            }),
            "tool_result" => {
                let ok = l.status.as_deref() == Some("success");
                let text = if ok {
                    raw_text(l.output)
                } else {
                    raw_text(l.error.or(l.output))
                };
                out.push(AgentEvent::ToolResult {
                    id: l.tool_id.unwrap_or_default(),
                    output: tail(text),
                    is_error: !ok,
                });
            }
            "error" => out.push(AgentEvent::Error {
                message: l.message.unwrap_or_default(),
                fatal: l.severity.as_deref() == Some("error"),
            }),
            "result" => {
                let s = l.stats.unwrap_or_default();
                out.push(AgentEvent::Usage {
                    usage: Usage {
                        input_tokens: s.input_tokens,
                        cached_tokens: s.cached,
                        output_tokens: s.output_tokens,
                        reasoning_tokens: 0,
                    },
                    cost_usd: None,
                    cumulative: true,
                });
                let is_error = l.status.as_deref().is_some_and(|s| s != "success");
                let text = if is_error {
                    raw_text(l.error).trim_matches('"').to_string()
                } else {
                    self.last_message.clone()
                };
                out.push(AgentEvent::Final {
                    text: if text.is_empty() {
                        self.last_message.clone()
                    } else {
                        text
                    },
                    is_error,
                    subtype: l.status,
                    num_turns: None,
                    cost_usd: None,
                });
            }
            _ => {}
        }
    }

    fn finish(&mut self, out: &mut Vec<AgentEvent>, _exit_code: Option<i32>) {
        self.flush(out);
    }
}
