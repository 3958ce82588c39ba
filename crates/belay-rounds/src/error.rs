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
    /// A control file in the work tree (the config, a prompt file) changed
    /// since belay trusted it, while an agent could write it: refused until
    /// the user accepts it (exit 78). The inner error is the source, so its
    /// code (`BELAY-E107`) is found in the chain.
    #[error("{0}")]
    ControlChanged(#[from] belay_record::ControlChanged),
    /// A control file belay will not read: a link, a FIFO, a device, too
    /// large (exit 78).
    #[error("cannot read {}: {source}", path.display())]
    ControlRead {
        path: PathBuf,
        #[source]
        source: belay_sandbox::hostfs::HostFsError,
    },
    /// A control file could not be put back after a round: the guard stays
    /// in the log dir, so the next start tries again, and refuses the file
    /// if it is still changed (exit 76).
    #[error("cannot put back {}: {source}", path.display())]
    ControlRestore {
        path: PathBuf,
        #[source]
        source: belay_sandbox::hostfs::HostFsError,
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
            RoundsError::Config(_)
            | RoundsError::ControlChanged(_)
            | RoundsError::ControlRead { .. } => crate::exit::CONFIG,
            RoundsError::ControlRestore { .. } => crate::exit::ENVIRONMENT,
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
