//! Agents: what proposes work.
//!
//! * [`cli`]: adapters for agent CLIs (claude stream-json, codex `exec --json`,
//!   gemini stream-json, and plain prompt-argument commands). Each builds the
//!   argv, runs the child with an explicit env in its own process group, parses
//!   its event stream incrementally into [`AgentEvent`]s, and enforces belay's
//!   own limits (turns, cost, wall time, idle time after the final result).
//! * [`builtin`]: a tool-calling loop over the model clients, whose tools run in
//!   a sandbox ([`workspace::Workspace`]).

pub mod builtin;
pub mod checks;
pub mod cli;
mod event;
pub mod lifeline;
pub mod orphans;
pub mod parse;
pub mod runner;
pub mod sandbox;
pub mod session;
pub mod spec;
pub mod workspace;

pub use event::{AgentEvent, AgentReport, Limits, StopReason};
pub use sandbox::{AgentBox, BoxSpec};
pub use session::{AgentSession, Placement};
pub use spec::{AgentKind, AgentSpec, DialectError, SpecError};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot start the agent `{program}`: {source} (is it installed and on PATH?)")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("agent I/O: {0}")]
    Io(String),
    #[error(transparent)]
    Model(#[from] belay_model::ModelError),
    #[error(transparent)]
    Record(#[from] belay_record::RecordError),
    #[error("agent configuration: {0}")]
    Config(String),
    /// Boxed: it carries the role, the agent, the address and the fix.
    #[error(transparent)]
    Dialect(Box<spec::DialectError>),
    #[error(transparent)]
    Sandbox(#[from] belay_sandbox::SandboxError),
    #[error(transparent)]
    Vcs(#[from] belay_vcs::VcsError),
}

impl From<spec::DialectError> for AgentError {
    fn from(e: spec::DialectError) -> Self {
        AgentError::Dialect(Box::new(e))
    }
}

impl belay_record::Classify for AgentError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            AgentError::Spawn { .. } | AgentError::Config(_) => ExitClass::Usage,
            AgentError::Dialect(e) => e.exit_class(),
            AgentError::Io(_) => ExitClass::Failed,
            AgentError::Model(e) => e.exit_class(),
            AgentError::Record(e) => e.exit_class(),
            AgentError::Sandbox(e) => e.exit_class(),
            AgentError::Vcs(e) => e.exit_class(),
        }
    }
}

/// The one resolved endpoint (`belay_model::resolve::agent_endpoint`) as the
/// agent runner takes it.
impl From<belay_model::resolve::AgentEndpoint> for cli::Endpoint {
    fn from(e: belay_model::resolve::AgentEndpoint) -> Self {
        cli::Endpoint {
            base_url: e.base_url,
            api: e.api,
            key: e.key.map(|(_, k)| k),
        }
    }
}
