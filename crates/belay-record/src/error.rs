use std::path::PathBuf;

/// Errors from the record layer. Every IO error names the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode {path} as JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path} is locked by another belay process; wait for it to finish, or stop it \
         (a stale lock from a killed process is released automatically)"
    )]
    Locked { path: PathBuf },
    #[error("{}:{line}: not a valid run state: {message}. Restore the file, or start a new run", path.display())]
    BadState {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("invalid run id {id:?}: {reason}")]
    InvalidRunId { id: String, reason: &'static str },
    /// A run status (`--status`, the dashboard's filter) that is none.
    #[error("unknown status `{value}`: running, ok, failed or interrupted")]
    UnknownStatus { value: String },
    /// A mode (`--mode`, the dashboard's filter) that is none.
    #[error("unknown mode `{value}`: env, pipeline, agent, plan, rounds or jobs")]
    UnknownMode { value: String },
}

impl RecordError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        RecordError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
