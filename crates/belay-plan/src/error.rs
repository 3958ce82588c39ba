use std::path::PathBuf;

use belay_record::{Classify, ExitClass};

/// Why a plan command could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A plan file that does not parse or break a rule: `file:line:col: why`.
    #[error("{path}:{line}:{col}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        col: usize,
        message: String,
    },
    /// Bad input that is not in a file (a flag, the agent's plan answer).
    #[error("{0}")]
    Usage(String),
    /// An audit level (`--audit-level`) that is none.
    #[error("audit level `{value}`: use off, redacted or full")]
    UnknownAuditLevel { value: String },
    /// The run cannot start or go on (a dirty tree, another run holds the lock).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Agent(#[from] belay_agent::AgentError),
    #[error(transparent)]
    Vcs(#[from] belay_vcs::VcsError),
    #[error(transparent)]
    Sandbox(#[from] belay_sandbox::SandboxError),
    #[error(transparent)]
    Record(#[from] belay_record::RecordError),
    #[error(transparent)]
    HostFs(#[from] belay_sandbox::hostfs::HostFsError),
    /// The plan file changed since belay last trusted it, while an agent
    /// could write it: refused until the user accepts it.
    #[error(transparent)]
    ControlChanged(#[from] belay_record::ControlChanged),
    /// Stopped by SIGINT or SIGTERM (the text says how to resume).
    #[error("interrupted: {0}")]
    Interrupted(String),
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl PlanError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PlanError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

impl Classify for PlanError {
    fn exit_class(&self) -> ExitClass {
        match self {
            PlanError::Invalid { .. }
            | PlanError::Usage(_)
            | PlanError::UnknownAuditLevel { .. }
            | PlanError::Refused(_) => ExitClass::Usage,
            PlanError::Agent(e) => e.exit_class(),
            PlanError::Vcs(e) => e.exit_class(),
            PlanError::Sandbox(e) => e.exit_class(),
            PlanError::Record(e) => e.exit_class(),
            PlanError::HostFs(e) => e.exit_class(),
            PlanError::ControlChanged(e) => e.exit_class(),
            PlanError::Interrupted(_) => ExitClass::Interrupted,
            PlanError::Io { source, .. } => belay_record::io_class(source),
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            PlanError::ControlChanged(e) => e.error_code(),
            _ => self.exit_class().error_code(),
        }
    }
}
