use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("cannot listen on {addr}: {source}. Pick another with --port, or free it")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("--bind {0} is not a loopback address: the dashboard shows every run's logs and can approve jobs; pass --allow-remote to expose it (anyone who has the URL with its token can act)")]
    Remote(String),
    #[error("BELAY_UI_TOKEN must be 8 or more letters, digits, `-`, `_` or `.`")]
    Token,
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Record(#[from] belay_record::RecordError),
}

impl belay_record::Classify for UiError {
    fn exit_class(&self) -> belay_record::ExitClass {
        match self {
            UiError::Bind { .. } | UiError::Remote(_) | UiError::Token => {
                belay_record::ExitClass::Usage
            }
            UiError::Io { source, .. } => belay_record::io_class(source),
            UiError::Record(e) => e.exit_class(),
        }
    }
}
