use std::path::PathBuf;

use belay_record::RecordError;
use belay_sandbox::SandboxError;

/// Errors of the environment builder. Each says what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("repository {path} cannot be used: {reason}. Pass --repo with the path of a project directory")]
    RepoMissing { path: PathBuf, reason: String },
    #[error("{}:{line}:{column}: {message}. Fix the file and rerun", path.display())]
    BadManifest {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("cannot plan: {0}")]
    Plan(String),
    #[error("state directory {path} is not usable: {reason}. Pass --state-dir with a writable directory")]
    StateDir { path: PathBuf, reason: String },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    BadState { path: PathBuf, message: String },
    #[error("{0}")]
    Usage(String),
    /// Stopped by Ctrl-C or SIGTERM.
    #[error("interrupted by {0}")]
    Interrupted(String),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

impl EnvError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        EnvError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

impl belay_record::Classify for EnvError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            EnvError::RepoMissing { .. }
            | EnvError::BadManifest { .. }
            | EnvError::StateDir { .. }
            | EnvError::BadState { .. }
            | EnvError::Usage(_) => ExitClass::Usage,
            EnvError::Plan(_) => ExitClass::Failed,
            EnvError::Interrupted(_) => ExitClass::Interrupted,
            EnvError::Io { source, .. } => belay_record::io_class(source),
            EnvError::Record(e) => e.exit_class(),
            EnvError::Sandbox(e) => e.exit_class(),
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            EnvError::Record(e) => e.error_code(),
            EnvError::Sandbox(e) => e.error_code(),
            EnvError::Io { source, .. } => belay_record::io_code(source),
            e => e.exit_class().error_code(),
        }
    }
}
