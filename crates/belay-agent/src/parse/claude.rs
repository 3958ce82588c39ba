//! Claude Code, `claude -p PROMPT --output-format stream-json --verbose`.

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
    subtype: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default, borrow)]
    message: Option<Msg<'a>>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(default)]
    num_turns: Option<u32>,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    total_cost_usd: Option<f64>,
    #[serde(default)]
    usage: Option<CUsage>,
}

#[derive(Deserialize)]
struct Msg<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<CUsage>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    is_error: Option<bool>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct CUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
}

impl CUsage {
    fn usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens
                + self.cache_read_input_tokens
                + self.cache_creation_input_tokens,
            cached_tokens: self.cache_read_input_tokens,
            output_tokens: self.output_tokens,
            reasoning_tokens: 0,
        }
    }
}

#[derive(Debug, Default)]
pub struct ClaudeParser {
    /// Claude Code repeats a message's usage on each of its content-block lines.
    last_message_id: Option<String>,
}

impl StreamParser for ClaudeParser {
    fn line(&mut self, line: &[u8], out: &mut Vec<AgentEvent>) {
        let l: Line = match serde_json::from_slice(line) {
            Ok(l) => l,
            Err(e) => return out.push(bad_line(line, &e.to_string())),
        };
        match l.kind {
            "system" if l.subtype.as_deref() == Some("init") => {
                out.push(AgentEvent::Session {
                    id: l.session_id.unwrap_or_default(),
                    model: l.model,
                });
            }
            "assistant" => {
                let Some(m) = l.message else { return };
                let parts: Vec<Part> = m
                    .content
                    .and_then(|c| serde_json::from_str(c.get()).ok())
                    .unwrap_or_default();
                for p in parts {
                    match p.kind {
                        "text" => out.push(AgentEvent::Message {
                            text: p.text.unwrap_or_default(),
                        }),
                        "tool_use" => out.push(AgentEvent::ToolCall {
                            id: p.id.unwrap_or_default(),
                            name: p.name.unwrap_or_default(),
                            input: p.input.map(|r| r.get().to_string()).unwrap_or_default(),
                        }),
                        _ => {}
                    }
                }
                if let Some(u) = m.usage {
                    if m.id.is_none() || m.id != self.last_message_id {
                        out.push(AgentEvent::Usage {
                            usage: u.usage(),
                            cost_usd: None,
                            cumulative: false,
                        });
                    }
                }
                self.last_message_id = m.id;
            }
            "user" => {
                let Some(m) = l.message else { return };
                let parts: Vec<Part> = m
                    .content
                    .and_then(|c| serde_json::from_str(c.get()).ok())
                    .unwrap_or_default();
                for p in parts.into_iter().filter(|p| p.kind == "tool_result") {
                    let content = match p.content {
                        Some(r) if r.get().starts_with('[') => {
                            let items: Vec<Part> =
                                serde_json::from_str(r.get()).unwrap_or_default();
                            items
                                .into_iter()
                                .filter_map(|i| i.text)
                                .collect::<Vec<_>>()
                                .join("\n")
                        }
                        other => raw_text(other),
                    };
                    out.push(AgentEvent::ToolResult {
                        id: p.tool_use_id.unwrap_or_default(),
                        output: tail(content),
                        is_error: p.is_error.unwrap_or(false),
                    });
                }
            }
            "result" => {
                if let Some(u) = l.usage {
                    out.push(AgentEvent::Usage {
                        usage: u.usage(),
                        cost_usd: l.total_cost_usd,
                        cumulative: true,
                    });
                }
                let is_error = l.is_error.unwrap_or(false)
                    || l.subtype.as_deref().is_some_and(|s| s != "success");
                out.push(AgentEvent::Final {
                    text: l.result.unwrap_or_default(),
                    is_error,
                    subtype: l.subtype,
                    num_turns: l.num_turns,
                    cost_usd: l.total_cost_usd,
                });
            }
            _ => {}
        }
    }
}
