//! Codex, `codex exec --json PROMPT`.

use std::collections::HashSet;

use belay_model::Usage;
use serde::Deserialize;

use super::{bad_line, tail, StreamParser};
use crate::AgentEvent;

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default, borrow)]
    item: Option<Item<'a>>,
    #[serde(default)]
    usage: Option<CUsage>,
    #[serde(default)]
    error: Option<ErrorBody>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    aggregated_output: Option<String>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default)]
    changes: Option<Vec<Change>>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    query: Option<String>,
}

#[derive(Deserialize)]
struct Change {
    path: String,
    #[serde(default)]
    kind: Option<String>,
}

#[derive(Deserialize, Default)]
struct CUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    cached_input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    reasoning_output_tokens: u64,
}

#[derive(Debug, Default)]
pub struct CodexParser {
    /// Items whose start was counted as an action.
    started: HashSet<String>,
    last_message: String,
}

impl CodexParser {
    fn action(&mut self, item: &Item, out: &mut Vec<AgentEvent>) {
        let id = item.id.clone().unwrap_or_default();
        if !id.is_empty() && !self.started.insert(id.clone()) {
            return;
        }
        let (name, input) = match item.kind {
            "command_execution" => ("command", item.command.clone().unwrap_or_default()),
            "file_change" => (
                "file_change",
                item.changes
                    .as_ref()
                    .map(|c| {
                        c.iter()
                            .map(|c| c.path.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default(),
            ),
            "mcp_tool_call" => ("mcp_tool_call", item.tool.clone().unwrap_or_default()),
            "web_search" => ("web_search", item.query.clone().unwrap_or_default()),
            _ => return,
        };
        out.push(AgentEvent::ToolCall {
            id,
            name: name.into(),
            input,
        });
    }
}

impl StreamParser for CodexParser {
    fn line(&mut self, line: &[u8], out: &mut Vec<AgentEvent>) {
        let l: Line = match serde_json::from_slice(line) {
            Ok(l) => l,
            Err(e) => return out.push(bad_line(line, &e.to_string())),
        };
        match l.kind {
            "thread.started" => out.push(AgentEvent::Session {
                id: l.thread_id.unwrap_or_default(),
                model: None,
            }),
            "item.started" | "item.updated" => {
                if let Some(item) = &l.item {
                    self.action(item, out);
                }
            }
            "item.completed" => {
                let Some(item) = l.item else { return };
                self.action(&item, out);
                match item.kind {
                    "agent_message" => {
                        let text = item.text.unwrap_or_default();
                        self.last_message.clone_from(&text);
                        out.push(AgentEvent::Message { text });
                    }
                    "command_execution" => out.push(AgentEvent::Command {
                        command: item.command.unwrap_or_default(),
                        exit_code: item.exit_code,
                        output: tail(item.aggregated_output.unwrap_or_default()),
                    }),
                    "file_change" => {
                        for c in item.changes.unwrap_or_default() {
                            out.push(AgentEvent::FileChange {
                                path: c.path,
                                change: c.kind.unwrap_or_else(|| "update".into()),
                            });
                        }
                    }
                    "error" => out.push(AgentEvent::Error {
                        message: item.message.unwrap_or_default(),
                        fatal: false,
                    }),
                    _ => {}
                }
            }
            "turn.completed" => {
                let u = l.usage.unwrap_or_default();
                out.push(AgentEvent::Usage {
                    usage: Usage {
                        input_tokens: u.input_tokens,
                        cached_tokens: u.cached_input_tokens,
                        output_tokens: u.output_tokens,
                        reasoning_tokens: u.reasoning_output_tokens,
                    },
                    cost_usd: None,
                    cumulative: false,
                });
                out.push(AgentEvent::Final {
                    text: self.last_message.clone(),
                    is_error: false,
                    subtype: None,
                    num_turns: None,
                    cost_usd: None,
                });
            }
            "turn.failed" => {
                let message = l
                    .error
                    .and_then(|e| e.message)
                    .unwrap_or_else(|| "the turn failed".into());
                out.push(AgentEvent::Error {
                    message: message.clone(),
                    fatal: true,
                });
                out.push(AgentEvent::Final {
                    text: message,
                    is_error: true,
                    subtype: Some("turn.failed".into()),
                    num_turns: None,
                    cost_usd: None,
                });
            }
            "error" => out.push(AgentEvent::Error {
                message: l
                    .message
                    .or_else(|| l.error.and_then(|e| e.message))
                    .unwrap_or_default(),
                fatal: false,
            }),
            _ => {}
        }
    }
}
