//! What can go wrong, by class: the class gives the exit code (the peer's
//! 0, 1, 75, 76, 78 and 130).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RoundsError {
    /// The config is broken: fix the file (exit 78; systemd does not restart).
    #[error("{0}")]
    Config(String),
    /// The environment is not ready (a lock held elsewhere, a missing daemon,
    /// an unwritable directory): retry later (exit 76).
    #[error("{0}")]
    Environment(String),
    /// A breaker tripped (crash loop, no progress): exit 75, no restart.
    #[error("{0}")]
    Breaker(String),
    #[error("{action} {}: {source}", path.display())]
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

impl RoundsError {
    pub fn io(action: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        RoundsError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The peer's exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            RoundsError::Config(_) => crate::exit::CONFIG,
            RoundsError::Environment(_) | RoundsError::Io { .. } => crate::exit::ENVIRONMENT,
            RoundsError::Breaker(_) => crate::exit::BREAKER,
            RoundsError::Sandbox(_) => crate::exit::ENVIRONMENT,
            RoundsError::Agent(e) => match belay_record::Classify::exit_class(e) {
                belay_record::ExitClass::Usage => crate::exit::CONFIG,
                _ => crate::exit::ENVIRONMENT,
            },
            RoundsError::Record(belay_record::RecordError::Locked { .. }) => {
                crate::exit::ENVIRONMENT
            }
            RoundsError::Record(_) | RoundsError::Vcs(_) => crate::exit::ENVIRONMENT,
        }
    }
}
