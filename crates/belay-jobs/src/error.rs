//! What can go wrong, by class: the class gives the exit code.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    /// The config or a flag is wrong: fix it (exit 2).
    #[error("{0}")]
    Config(String),
    /// A job, a gate or a command names something that is not there, or
    /// asks for what its state does not allow (exit 2).
    #[error("{0}")]
    Refused(String),
    /// The machine is not ready: the engine, the disk, the chat server
    /// (exit 3).
    #[error("{0}")]
    Environment(String),
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Record(#[from] belay_record::RecordError),
    #[error(transparent)]
    Agent(#[from] belay_agent::AgentError),
    #[error(transparent)]
    Vcs(#[from] belay_vcs::VcsError),
    #[error(transparent)]
    Sandbox(#[from] belay_sandbox::SandboxError),
}

impl JobsError {
    pub fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        JobsError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

impl belay_record::Classify for JobsError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            JobsError::Config(_) | JobsError::Refused(_) => ExitClass::Usage,
            JobsError::Environment(_) => ExitClass::Infra,
            JobsError::Io { source, .. } => belay_record::io_class(source),
            JobsError::Record(e) => e.exit_class(),
            JobsError::Agent(e) => e.exit_class(),
            JobsError::Vcs(e) => e.exit_class(),
            JobsError::Sandbox(e) => e.exit_class(),
        }
    }
}
