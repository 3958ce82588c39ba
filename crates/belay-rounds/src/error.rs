//! What can go wrong, by class: the class gives the exit code (the peer's
//! 0, 1, 75, 76, 78 and 130).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RoundsError {
    /// The config is broken: fix the file (exit 78; systemd does not restart).
    #[error("{0}")]
    Config(String),
    /// A prompt file that cannot be used (exit 78, as a broken config).
    #[error(transparent)]
    Prompt(#[from] crate::prompt::PromptError),
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
    /// A state file of the log dir that cannot be read (exit 78 when torn:
    /// the file and line say which).
    #[error(transparent)]
    State(#[from] crate::state::StateFileError),
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

    /// The peer's exit code for this error: its class, in the peer's
    /// numbers (a classification, not a second scheme).
    pub fn exit_code(&self) -> u8 {
        crate::exit::peer_code(belay_record::Classify::exit_class(self))
    }
}

/// The round supervisor's classes: a broken config or control file is the
/// user's (78, systemd does not restart); a breaker is the work's (75); all
/// else is an environment that is not ready yet (76, retried later), a lock
/// held by another serve included.
impl belay_record::Classify for RoundsError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass as C;
        match self {
            RoundsError::Config(_)
            | RoundsError::Prompt(_)
            | RoundsError::ControlChanged(_)
            | RoundsError::ControlRead { .. } => C::Usage,
            RoundsError::Breaker(_) => C::Failed,
            RoundsError::State(e) => match belay_record::Classify::exit_class(e) {
                C::Usage => C::Usage,
                C::Failed | C::Infra | C::Interrupted => C::Infra,
            },
            RoundsError::Agent(e) => match belay_record::Classify::exit_class(e) {
                C::Usage => C::Usage,
                C::Failed | C::Infra | C::Interrupted => C::Infra,
            },
            RoundsError::ControlRestore { .. }
            | RoundsError::Environment(_)
            | RoundsError::Io { .. }
            | RoundsError::Sandbox(_)
            | RoundsError::Record(_)
            | RoundsError::Vcs(_) => C::Infra,
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            RoundsError::ControlChanged(e) => e.error_code(),
            RoundsError::ControlRead { .. } => "BELAY-E107",
            RoundsError::Breaker(_) => "BELAY-E202",
            RoundsError::Agent(e) => e.error_code(),
            RoundsError::Record(e) => e.error_code(),
            RoundsError::Vcs(e) => e.error_code(),
            RoundsError::Sandbox(e) => e.error_code(),
            RoundsError::Io { source, .. } => belay_record::io_code(source),
            other => belay_record::Classify::exit_class(other).error_code(),
        }
    }
}
