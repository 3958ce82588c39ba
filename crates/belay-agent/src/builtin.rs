//! The built-in agent: a tool-calling loop over a model client, whose tools act
//! in a sandbox [`Workspace`].
//!
//! Tools: `terminal`, `read_file`, `write_file`, `list_files`, `edit` (an exact
//! string replace that fails unless the match is unique) and `finish`. The loop
//! stops at `finish`, at a reply without tool calls, at `max_iterations`, or when
//! it is stuck: the same call with the same result repeated, or two calls
//! alternating.

use std::time::{Duration, Instant};

use belay_model::{Message, ModelClient, Prices, Request, ToolCall, ToolSpec};
use serde::Deserialize;
use serde_json::json;

use crate::event::Tally;
use crate::workspace::Workspace;
use crate::{AgentError, AgentEvent, AgentReport, StopReason};

#[derive(Debug, Clone)]
pub struct BuiltinConfig {
    pub max_iterations: u32,
    pub command_timeout: Duration,
    /// Extra instructions appended to the built-in system prompt.
    pub instructions: Option<String>,
    /// How many identical call+result pairs in a row count as stuck.
    pub stuck_repeats: usize,
    pub max_cost_usd: Option<f64>,
    /// The whole run (checked before each model call; each call is bounded by
    /// the client's own timeouts).
    pub wall_time: Option<Duration>,
    /// Secrets scrubbed from every tool result before it reaches the model
    /// or the events (a secret read from the workspace never reaches the
    /// endpoint). Empty: nothing to scrub.
    pub scrub: belay_record::Redactor,
}

impl Default for BuiltinConfig {
    fn default() -> Self {
        BuiltinConfig {
            max_iterations: 30,
            command_timeout: Duration::from_secs(600),
            instructions: None,
            stuck_repeats: 3,
            max_cost_usd: None,
            wall_time: None,
            scrub: belay_record::Redactor::default(),
        }
    }
}

pub const SYSTEM_PROMPT: &str = "You are a careful software engineer working in a sandboxed checkout. \
Use the tools to inspect and change files and to run commands. Make the smallest change that does the task, \
check it by running the relevant command, then call `finish` with a short summary. You cannot use git to \
commit or push: the harness commits for you.";

/// Largest file `read_file` returns and `edit` changes.
pub const MAX_FILE: u64 = 1024 * 1024;
const MAX_LIST: usize = 500;

pub fn tool_specs() -> Vec<ToolSpec> {
    let spec = |name: &str, description: &str, parameters: serde_json::Value| ToolSpec {
        name: name.into(),
        description: description.into(),
        parameters,
    };
    vec![
        spec("terminal", "Run a shell command (bash) in the workspace directory. Returns the exit code and the output's tail.",
            json!({"type": "object", "properties": {"command": {"type": "string"}, "timeout_s": {"type": "integer", "minimum": 1}}, "required": ["command"], "additionalProperties": false})),
        spec("read_file", "Read a text file (path relative to the workspace).",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false})),
        spec("write_file", "Create or overwrite a file with the given content.",
            json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false})),
        spec("list_files", "List files under a directory (default: the workspace), two levels deep, .git excluded.",
            json!({"type": "object", "properties": {"path": {"type": "string"}, "depth": {"type": "integer", "minimum": 1, "maximum": 6}}, "additionalProperties": false})),
        spec("edit", "Replace the exact text `old` with `new` in a file. Fails unless `old` occurs exactly once.",
            json!({"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}, "required": ["path", "old", "new"], "additionalProperties": false})),
        spec("finish", "End the task with a summary of what was done.",
            json!({"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"], "additionalProperties": false})),
    ]
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TerminalArgs {
    command: String,
    #[serde(default)]
    timeout_s: Option<u64>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathArgs {
    path: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    depth: Option<u32>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old: String,
    new: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FinishArgs {
    #[serde(default)]
    summary: String,
}

fn parse<'a, T: Deserialize<'a>>(call: &'a ToolCall) -> Result<T, String> {
    let args = if call.arguments.trim().is_empty() {
        "{}"
    } else {
        call.arguments.as_str()
    };
    serde_json::from_str(args).map_err(|e| {
        format!("error: invalid arguments for `{}`: {e}. Call it again with a JSON object that matches its schema.", call.name)
    })
}

/// How often `needle` occurs in `hay`, overlapping occurrences included
/// (`aa` occurs twice in `aaa`: replacing "the" one would be a guess).
fn occurrences(hay: &str, needle: &str) -> usize {
    let mut n = 0;
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        n += 1;
        let start = from + i;
        // Continue one character after this match's start.
        from = start + hay[start..].chars().next().map(char::len_utf8).unwrap_or(1);
        if from >= hay.len() {
            break;
        }
    }
    n
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Detects a loop: the same call with the same result `repeats` times in a
/// row, or two calls alternating (ABABAB).
#[derive(Debug, Default)]
pub struct StuckDetector {
    history: Vec<(String, u64)>,
}

impl StuckDetector {
    pub fn push(&mut self, call: &ToolCall, result: &str, repeats: usize) -> Option<String> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        result.hash(&mut h);
        let args: serde_json::Value =
            serde_json::from_str(&call.arguments).unwrap_or(json!(call.arguments));
        let sig = format!("{} {}", call.name, args);
        self.history.push((sig.clone(), h.finish()));
        if self.history.len() > 16 {
            self.history.remove(0);
        }
        let n = self.history.len();
        if repeats >= 2
            && n >= repeats
            && self.history[n - repeats..]
                .iter()
                .all(|e| *e == self.history[n - 1])
        {
            let shown: String = sig.chars().take(200).collect();
            return Some(format!(
                "the same call `{shown}` returned the same result {repeats} times in a row"
            ));
        }
        let span = 6;
        if n >= span {
            let w = &self.history[n - span..];
            if w[0] != w[1] && (0..span).all(|i| w[i] == w[i % 2]) {
                let a: String = w[0].0.chars().take(100).collect();
                let b: String = w[1].0.chars().take(100).collect();
                return Some(format!(
                    "alternating between `{a}` and `{b}` with the same results"
                ));
            }
        }
        None
    }
}

pub struct BuiltinAgent<'a> {
    pub client: &'a ModelClient,
    pub workspace: &'a dyn Workspace,
    pub config: BuiltinConfig,
    /// When the wall time runs out (set by `run`; commands get no longer).
    pub deadline: Option<Instant>,
}

enum Outcome {
    Result(String),
    Finish(String),
}

impl<'a> BuiltinAgent<'a> {
    async fn tool(&self, call: &ToolCall, emit: &mut (dyn FnMut(AgentEvent) + Send)) -> Outcome {
        let ws = self.workspace;
        let r = match call.name.as_str() {
            "terminal" => match parse::<TerminalArgs>(call) {
                Err(e) => e,
                Ok(a) => {
                    let mut t = a.timeout_s.map(Duration::from_secs).unwrap_or(self.config.command_timeout).min(self.config.command_timeout);
                    if let Some(left) = self.deadline.and_then(|d| d.checked_duration_since(Instant::now())) {
                        t = t.min(left.max(Duration::from_secs(1)));
                    }
                    match ws.run(&a.command, t).await {
                        Err(e) => format!("error: the command could not run: {e}"),
                        Ok(o) => {
                            emit(AgentEvent::Command { command: a.command.clone(), exit_code: Some(o.exit_code), output: o.output.clone() });
                            let mut s = if o.timed_out {
                                format!("timed out after {}s (killed)\n", t.as_secs())
                            } else {
                                format!("exit code: {}\n", o.exit_code)
                            };
                            s.push_str(&o.output);
                            s
                        }
                    }
                }
            },
            "read_file" => match parse::<PathArgs>(call) {
                Err(e) => e,
                Ok(a) => match ws.read_file(&a.path, MAX_FILE).await {
                    Ok(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
                    Ok(None) => format!("error: no such file: {}", a.path),
                    Err(e) => format!("error: {e}"),
                },
            },
            "write_file" => match parse::<WriteArgs>(call) {
                Err(e) => e,
                Ok(a) => match ws.write_file(&a.path, a.content.as_bytes()).await {
                    Ok(()) => {
                        emit(AgentEvent::FileChange { path: a.path.clone(), change: "write".into() });
                        format!("wrote {} bytes to {}", a.content.len(), a.path)
                    }
                    Err(e) => format!("error: {e}"),
                },
            },
            "list_files" => match parse::<ListArgs>(call) {
                Err(e) => e,
                Ok(a) => {
                    let path = a.path.unwrap_or_else(|| ".".into());
                    let depth = a.depth.unwrap_or(2).clamp(1, 6);
                    let cmd = format!(
                        "find {} -maxdepth {depth} -not -path '*/.git/*' -not -name .git | sort | head -n {}",
                        quote(&path),
                        MAX_LIST + 1
                    );
                    match ws.run(&cmd, Duration::from_secs(60)).await {
                        Ok(o) if o.exit_code == 0 => {
                            let mut s = o.output;
                            if s.lines().count() > MAX_LIST {
                                s.push_str(&format!("[listing cut at {MAX_LIST} entries]\n"));
                            }
                            s
                        }
                        Ok(o) => format!("error: {}", o.output.trim()),
                        Err(e) => format!("error: {e}"),
                    }
                }
            },
            "edit" => match parse::<EditArgs>(call) {
                Err(e) => e,
                Ok(a) => self.edit(&a, emit).await,
            },
            "finish" => match parse::<FinishArgs>(call) {
                Err(e) => e,
                Ok(a) => return Outcome::Finish(a.summary),
            },
            other => format!(
                "error: there is no tool `{other}`. The tools are terminal, read_file, write_file, list_files, edit and finish."
            ),
        };
        Outcome::Result(r)
    }

    async fn edit(&self, a: &EditArgs, emit: &mut (dyn FnMut(AgentEvent) + Send)) -> String {
        if a.old.is_empty() {
            return "error: `old` is empty; give the exact text to replace".into();
        }
        let bytes = match self.workspace.read_file(&a.path, MAX_FILE).await {
            Ok(Some(b)) => b,
            Ok(None) => return format!("error: no such file: {}", a.path),
            Err(e) => return format!("error: {e}"),
        };
        let Ok(text) = String::from_utf8(bytes) else {
            return format!("error: {} is not UTF-8 text", a.path);
        };
        match occurrences(&text, &a.old) {
            0 => format!("error: `old` does not occur in {}; read the file and copy the text exactly", a.path),
            1 => {
                let new = text.replacen(a.old.as_str(), &a.new, 1);
                match self.workspace.write_file(&a.path, new.as_bytes()).await {
                    Ok(()) => {
                        emit(AgentEvent::FileChange { path: a.path.clone(), change: "edit".into() });
                        format!("edited {}", a.path)
                    }
                    Err(e) => format!("error: {e}"),
                }
            }
            n => format!("error: `old` occurs {n} times in {}; include more surrounding text so that it occurs once", a.path),
        }
    }

    /// Run a task. Every event goes to `on_event` as it happens (the trajectory).
    pub fn new(
        client: &'a ModelClient,
        workspace: &'a dyn Workspace,
        config: BuiltinConfig,
    ) -> Self {
        BuiltinAgent {
            client,
            workspace,
            config,
            deadline: None,
        }
    }

    pub async fn run(
        &mut self,
        task: &str,
        on_event: &mut (dyn FnMut(&AgentEvent) + Send),
    ) -> Result<AgentReport, AgentError> {
        let t0 = Instant::now();
        self.deadline = self.config.wall_time.map(|w| t0 + w);
        let mut rec = Recorder {
            tally: Tally::default(),
            on_event,
        };
        let mut instructions = SYSTEM_PROMPT.to_string();
        if let Some(extra) = &self.config.instructions {
            instructions.push_str("\n\n");
            instructions.push_str(extra);
        }
        instructions.push_str(&format!(
            "\n\nThe workspace directory is {}.",
            self.workspace.root()
        ));
        let task = self.config.scrub.redact(task).into_owned();
        let mut conv = Conversation {
            instructions,
            messages: vec![Message::user(&task)],
            tools: tool_specs(),
            stuck: StuckDetector::default(),
        };
        let prices = self.client.ledger().report().prices;
        rec.record(AgentEvent::Session {
            id: format!("builtin-{}", std::process::id()),
            model: Some(self.client.config().model.clone()),
        });
        let mut stop: Option<StopReason> = None;
        let mut final_text = String::new();
        for _ in 0..self.config.max_iterations {
            stop = self
                .iteration(t0, &mut conv, prices, &mut rec, &mut final_text)
                .await;
            if stop.is_some() {
                break;
            }
        }
        let stop = stop.unwrap_or(StopReason::IterationLimit {
            limit: self.config.max_iterations,
        });
        let interim = stop != StopReason::Completed;
        if interim {
            final_text = rec.tally.interim_report(&stop.describe());
        }
        let turns = rec.tally.turns;
        rec.record(AgentEvent::Final {
            text: final_text.clone(),
            is_error: interim,
            subtype: Some(match &stop {
                StopReason::Completed => "completed".into(),
                s => s.describe(),
            }),
            num_turns: Some(turns),
            cost_usd: None,
        });
        let cost = prices
            .map(|p| p.cost(&rec.tally.total_usage()))
            .unwrap_or(0.0);
        Ok(rec
            .tally
            .report(final_text, stop, interim, cost, t0.elapsed().as_secs_f64()))
    }

    /// One model call and the tool calls it asks for: why the run stops, if it does.
    async fn iteration(
        &self,
        t0: Instant,
        conv: &mut Conversation,
        prices: Option<Prices>,
        rec: &mut Recorder<'_>,
        final_text: &mut String,
    ) -> Option<StopReason> {
        if let Some(w) = self.config.wall_time {
            if t0.elapsed() >= w {
                return Some(StopReason::WallTime {
                    limit_s: w.as_secs_f64(),
                });
            }
        }
        let req = Request {
            instructions: Some(conv.instructions.clone()),
            messages: conv.messages.clone(),
            tools: conv.tools.clone(),
            ..Default::default()
        };
        // The wall-time budget bounds the model call too.
        let call = self.client.complete(&req, "agent");
        let answer = match self.config.wall_time {
            Some(w) => match tokio::time::timeout(w.saturating_sub(t0.elapsed()), call).await {
                Ok(r) => r,
                Err(_) => {
                    return Some(StopReason::WallTime {
                        limit_s: w.as_secs_f64(),
                    });
                }
            },
            None => call.await,
        };
        let resp = match answer {
            Ok(r) => r,
            Err(e) => {
                let msg = e.to_string();
                rec.record(AgentEvent::Error {
                    message: msg.clone(),
                    fatal: true,
                });
                return Some(StopReason::Failed { message: msg });
            }
        };
        rec.record(AgentEvent::Usage {
            usage: resp.usage,
            cost_usd: None,
            cumulative: false,
        });
        if !resp.text.trim().is_empty() {
            rec.record(AgentEvent::Message {
                text: resp.text.clone(),
            });
        }
        if let (Some(max), Some(p)) = (self.config.max_cost_usd, prices) {
            if p.cost(&rec.tally.total_usage()) > max {
                return Some(StopReason::CostLimit { limit_usd: max });
            }
        }
        if resp.tool_calls.is_empty() {
            *final_text = resp.text.clone();
            return Some(StopReason::Completed);
        }
        conv.messages.push(Message::Assistant {
            content: resp.text.clone(),
            tool_calls: resp.tool_calls.clone(),
        });
        for call in &resp.tool_calls {
            let stop = self.tool_turn(call, conv, rec, final_text).await;
            if stop.is_some() {
                return stop;
            }
        }
        None
    }

    /// Run one tool call and record it: why the run stops, if it does.
    async fn tool_turn(
        &self,
        call: &ToolCall,
        conv: &mut Conversation,
        rec: &mut Recorder<'_>,
        final_text: &mut String,
    ) -> Option<StopReason> {
        rec.record(AgentEvent::ToolCall {
            id: call.id.clone(),
            name: call.name.clone(),
            input: call.arguments.clone(),
        });
        let mut pending = Vec::new();
        let outcome = self.tool(call, &mut |ev| pending.push(ev)).await;
        for ev in pending {
            rec.record(ev);
        }
        match outcome {
            Outcome::Finish(summary) => {
                *final_text = summary;
                Some(StopReason::Completed)
            }
            Outcome::Result(out) => {
                let out = self.config.scrub.redact(&out).into_owned();
                let is_error = out.starts_with("error:");
                rec.record(AgentEvent::ToolResult {
                    id: call.id.clone(),
                    output: crate::parse::tail(out.clone()),
                    is_error,
                });
                // The engine failed under the agent: nothing more
                // can run, so stop now (no further model calls).
                if let Some(message) = self.workspace.infra_error() {
                    return Some(StopReason::Infra { message });
                }
                if let Some(pattern) = conv.stuck.push(call, &out, self.config.stuck_repeats) {
                    return Some(StopReason::Stuck { pattern });
                }
                conv.messages.push(Message::Tool {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: out,
                });
                None
            }
        }
    }
}

/// The conversation the built-in agent's loop carries from one model call to the next.
struct Conversation {
    instructions: String,
    messages: Vec<Message>,
    tools: Vec<ToolSpec>,
    stuck: StuckDetector,
}

/// A run's tally and where its events go: each is counted, then passed on.
struct Recorder<'r> {
    tally: Tally,
    on_event: &'r mut (dyn FnMut(&AgentEvent) + Send),
}

impl Recorder<'_> {
    /// Count `ev`, then pass it on.
    fn record(&mut self, ev: AgentEvent) {
        self.tally.take(&ev);
        (self.on_event)(&ev);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: "x".into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn overlapping_matches_are_not_unique() {
        assert_eq!(occurrences("aaa", "aa"), 2);
        assert_eq!(occurrences("x = 1\ny = 1", "= 1"), 2);
        assert_eq!(occurrences("héllo wörld", "wörld"), 1);
        assert_eq!(occurrences("abc", "d"), 0);
    }

    #[test]
    fn repeated_call_with_same_result_is_stuck() {
        let mut d = StuckDetector::default();
        assert!(d
            .push(&call("terminal", r#"{"command":"ls"}"#), "a", 3)
            .is_none());
        assert!(d
            .push(&call("terminal", r#"{ "command": "ls" }"#), "a", 3)
            .is_none());
        let why = d
            .push(&call("terminal", r#"{"command":"ls"}"#), "a", 3)
            .unwrap();
        assert!(why.contains("3 times"), "{why}");
    }

    #[test]
    fn same_call_with_new_results_is_progress() {
        let mut d = StuckDetector::default();
        for i in 0..10 {
            assert!(d
                .push(
                    &call("terminal", r#"{"command":"make"}"#),
                    &i.to_string(),
                    3
                )
                .is_none());
        }
    }

    #[test]
    fn alternating_calls_are_stuck() {
        let mut d = StuckDetector::default();
        let mut hit = None;
        for i in 0..6 {
            let c = if i % 2 == 0 {
                call("read_file", r#"{"path":"a"}"#)
            } else {
                call("read_file", r#"{"path":"b"}"#)
            };
            hit = d.push(&c, if i % 2 == 0 { "A" } else { "B" }, 3);
        }
        assert!(hit.unwrap().contains("alternating"));
    }
}
