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
    /// A directory belay would write in lies inside the repository and a
    /// part of it there is a link (or not a directory): an untrusted
    /// repository's `.belay -> /elsewhere` would send belay's files anywhere.
    #[error("{} is inside the repository {} and {} is {reason}; belay does not write through it (a repository's link could send its files anywhere on this machine). Remove it, or pass {flag} with a directory outside the repository", path.display(), repo.display(), part.display())]
    LinkInRepo {
        path: PathBuf,
        repo: PathBuf,
        part: PathBuf,
        reason: String,
        flag: &'static str,
    },
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
    /// Stopped by Ctrl-C or SIGTERM (the text says which, and how to resume).
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// The engine stopped answering under a batch and did not come back in
    /// time (the text says which projects are held and how to resume).
    #[error("the container engine was lost: {0}")]
    EngineLost(String),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The cluster of an indexed-job executor failed (`--executor
    /// kubernetes`: E306), classified by the executor's own crate.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// An error of a cluster executor outside this crate
/// ([`crate::swarm::IndexedJobExecutor`]), carried with the class and code
/// its own [`belay_record::Classify`] gave it. Its message and source are the
/// error's own.
#[derive(Debug)]
pub struct ClusterError {
    error: Box<dyn std::error::Error + Send + Sync>,
    class: belay_record::ExitClass,
    code: &'static str,
}

impl ClusterError {
    pub fn new<E>(error: E) -> Self
    where
        E: std::error::Error + belay_record::Classify + Send + Sync + 'static,
    {
        ClusterError {
            class: error.exit_class(),
            code: error.error_code(),
            error: Box::new(error),
        }
    }

    /// The executor's error, to downcast.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for ClusterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl belay_record::Classify for ClusterError {
    fn exit_class(&self) -> belay_record::ExitClass {
        self.class
    }

    fn error_code(&self) -> &'static str {
        self.code
    }
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
            | EnvError::LinkInRepo { .. }
            | EnvError::BadState { .. }
            | EnvError::Usage(_) => ExitClass::Usage,
            EnvError::Plan(_) => ExitClass::Failed,
            EnvError::Interrupted(_) => ExitClass::Interrupted,
            EnvError::EngineLost(_) => ExitClass::Infra,
            EnvError::Io { source, .. } => belay_record::io_class(source),
            EnvError::Record(e) => e.exit_class(),
            EnvError::Sandbox(e) => e.exit_class(),
            EnvError::Cluster(e) => e.exit_class(),
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            EnvError::Record(e) => e.error_code(),
            EnvError::Sandbox(e) => e.error_code(),
            EnvError::Cluster(e) => e.error_code(),
            EnvError::Io { source, .. } => belay_record::io_code(source),
            e => e.exit_class().error_code(),
        }
    }
}
