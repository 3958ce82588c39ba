use std::time::Duration;

use belay_model::Usage;
use serde::{Deserialize, Serialize};

/// One thing an agent did, in a form common to every CLI and the built-in agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AgentEvent {
    /// The session started.
    Session {
        id: String,
        model: Option<String>,
    },
    /// Assistant text.
    Message {
        text: String,
    },
    /// The model asked for a tool (or started a command or an edit).
    ToolCall {
        id: String,
        name: String,
        input: String,
    },
    ToolResult {
        id: String,
        output: String,
        is_error: bool,
    },
    /// A shell command ran.
    Command {
        command: String,
        exit_code: Option<i64>,
        output: String,
    },
    FileChange {
        path: String,
        change: String,
    },
    /// Tokens of one model turn (or a total, when the CLI only reports one).
    Usage {
        #[serde(flatten)]
        usage: Usage,
        /// Cost the CLI itself reported, if any.
        cost_usd: Option<f64>,
        /// Whether `usage` is a running total rather than one turn's.
        cumulative: bool,
    },
    /// The final result.
    Final {
        text: String,
        is_error: bool,
        subtype: Option<String>,
        num_turns: Option<u32>,
        cost_usd: Option<f64>,
    },
    /// An error. Not every error ends the run (codex reports reconnects this way).
    Error {
        message: String,
        fatal: bool,
    },
}

impl AgentEvent {
    /// Whether this event is one agent action, counted against `max_turns`.
    pub fn is_action(&self) -> bool {
        matches!(self, AgentEvent::ToolCall { .. })
    }
}

/// belay's own limits, enforced from the event stream whatever the CLI claims.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Agent actions (tool calls, commands, edits).
    pub max_turns: Option<u32>,
    pub max_cost_usd: Option<f64>,
    /// The whole run.
    pub wall_time: Option<Duration>,
    /// No output at all for this long.
    pub idle: Option<Duration>,
    /// After the final result, how long the process may take to exit before
    /// its process group is killed (the hang-after-result fault).
    pub final_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_turns: None,
            max_cost_usd: None,
            wall_time: None,
            idle: Some(Duration::from_secs(600)),
            final_grace: Duration::from_secs(5),
        }
    }
}

/// Why the run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum StopReason {
    /// The agent gave its final result.
    Completed,
    /// The agent reported failure, or exited without a result.
    Failed {
        message: String,
    },
    TurnLimit {
        limit: u32,
    },
    CostLimit {
        limit_usd: f64,
    },
    WallTime {
        limit_s: f64,
    },
    Idle {
        limit_s: f64,
    },
    /// The built-in agent repeated itself.
    Stuck {
        pattern: String,
    },
    /// The built-in agent used its iterations without finishing.
    IterationLimit {
        limit: u32,
    },
    /// The sandbox itself failed (the container engine refused an exec, the
    /// container is gone): no command can run, so the agent is stopped at
    /// once rather than left to iterate on error strings.
    Infra {
        message: String,
    },
}

impl StopReason {
    pub fn is_limit(&self) -> bool {
        !matches!(
            self,
            StopReason::Completed | StopReason::Failed { .. } | StopReason::Infra { .. }
        )
    }

    pub fn describe(&self) -> String {
        match self {
            StopReason::Completed => "completed".into(),
            StopReason::Failed { message } => format!("failed: {message}"),
            StopReason::TurnLimit { limit } => format!("turn limit reached ({limit} turns)"),
            StopReason::CostLimit { limit_usd } => format!("cost limit reached (${limit_usd})"),
            StopReason::WallTime { limit_s } => format!("wall time limit reached ({limit_s}s)"),
            StopReason::Idle { limit_s } => format!("no output for {limit_s}s"),
            StopReason::Stuck { pattern } => format!("stuck: {pattern}"),
            StopReason::IterationLimit { limit } => {
                format!("iteration limit reached ({limit} iterations)")
            }
            StopReason::Infra { message } => format!("the sandbox failed: {message}"),
        }
    }
}

/// What an agent run returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    /// The final answer; on a limit, an interim report built from the partial output.
    pub final_text: String,
    pub stop: StopReason,
    /// Whether `final_text` is an interim report rather than the agent's answer.
    pub interim: bool,
    pub session_id: Option<String>,
    pub turns: u32,
    pub usage: Usage,
    pub cost_usd: f64,
    pub exit_code: Option<i32>,
    /// The process was killed after its final result because it did not exit.
    pub killed_after_result: bool,
    pub events: u64,
    pub commands: Vec<String>,
    pub files_changed: Vec<String>,
    pub stderr_tail: String,
    pub duration_s: f64,
}

impl AgentReport {
    pub fn ok(&self) -> bool {
        self.stop == StopReason::Completed
    }
}

/// Folds events into a report as they arrive; bounded whatever the run length.
#[derive(Debug, Default)]
pub struct Tally {
    pub session_id: Option<String>,
    pub turns: u32,
    pub usage: Usage,
    /// Usage seen so far when the CLI reports running totals.
    cumulative: Option<Usage>,
    pub reported_cost: Option<f64>,
    pub last_message: Option<String>,
    pub final_event: Option<(String, bool, Option<String>)>,
    pub commands: Vec<String>,
    pub files: Vec<String>,
    pub events: u64,
    pub fatal_error: Option<String>,
}

const KEEP: usize = 200;

fn push_bounded(v: &mut Vec<String>, mut s: String) {
    if s.len() > 2048 {
        let mut cut = 2048;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    if v.len() == KEEP {
        v.remove(0);
    }
    if !v.contains(&s) {
        v.push(s);
    }
}

impl Tally {
    pub fn take(&mut self, ev: &AgentEvent) {
        self.events += 1;
        match ev {
            AgentEvent::Session { id, .. } => self.session_id = Some(id.clone()),
            AgentEvent::Message { text } if !text.trim().is_empty() => {
                // The last message, bounded (its tail).
                self.last_message = Some(crate::parse::tail(text.clone()))
            }
            AgentEvent::ToolCall { .. } => self.turns += 1,
            AgentEvent::Command { command, .. } => {
                push_bounded(&mut self.commands, command.clone())
            }
            AgentEvent::FileChange { path, .. } => push_bounded(&mut self.files, path.clone()),
            AgentEvent::Usage {
                usage,
                cost_usd,
                cumulative,
            } => {
                if *cumulative {
                    self.cumulative = Some(*usage);
                } else {
                    self.usage.add(usage);
                }
                if let Some(c) = cost_usd {
                    self.reported_cost = Some(self.reported_cost.unwrap_or(0.0).max(*c));
                }
            }
            AgentEvent::Final {
                text,
                is_error,
                subtype,
                cost_usd,
                ..
            } => {
                // An agent CLI ends its run with one result. A second one was
                // written by something else holding the stream (code the agent
                // ran, writing to the CLI's stdout): no answer is taken.
                if self.final_event.is_some() {
                    self.fatal_error = Some(
                        "the output held a second final result: something other than the agent \
                         wrote to its stream, so no answer is taken from it"
                            .into(),
                    );
                }
                self.final_event = Some((text.clone(), *is_error, subtype.clone()));
                if let Some(c) = cost_usd {
                    self.reported_cost = Some(self.reported_cost.unwrap_or(0.0).max(*c));
                }
            }
            AgentEvent::Error {
                message,
                fatal: true,
            } => self.fatal_error = Some(message.clone()),
            _ => {}
        }
    }

    /// Tokens: per-turn sums, or the CLI's running total if that is larger.
    pub fn total_usage(&self) -> Usage {
        match self.cumulative {
            Some(c)
                if c.input_tokens + c.output_tokens
                    >= self.usage.input_tokens + self.usage.output_tokens =>
            {
                c
            }
            _ => self.usage,
        }
    }

    /// A report from what was seen; callers set what only they know
    /// (`exit_code`, `killed_after_result`, `stderr_tail`).
    pub fn report(
        &self,
        final_text: String,
        stop: StopReason,
        interim: bool,
        cost_usd: f64,
        duration_s: f64,
    ) -> AgentReport {
        AgentReport {
            final_text,
            stop,
            interim,
            session_id: self.session_id.clone(),
            turns: self.turns,
            usage: self.total_usage(),
            cost_usd,
            exit_code: None,
            killed_after_result: false,
            events: self.events,
            commands: self.commands.clone(),
            files_changed: self.files.clone(),
            stderr_tail: String::new(),
            duration_s,
        }
    }

    /// An interim report from the partial output, for a run belay stopped.
    pub fn interim_report(&self, why: &str) -> String {
        let mut s = format!("belay stopped the agent: {why}. This is an interim report built from its partial output.\n");
        if let Some(m) = &self.last_message {
            let m: String = m.chars().take(2000).collect();
            s.push_str(&format!("\nLast message from the agent:\n{m}\n"));
        }
        if !self.commands.is_empty() {
            s.push_str(&format!("\nCommands run ({}):\n", self.commands.len()));
            for c in self.commands.iter().rev().take(10).rev() {
                s.push_str(&format!("- {c}\n"));
            }
        }
        if !self.files.is_empty() {
            s.push_str(&format!("\nFiles changed ({}):\n", self.files.len()));
            for f in &self.files {
                s.push_str(&format!("- {f}\n"));
            }
        }
        s
    }
}
