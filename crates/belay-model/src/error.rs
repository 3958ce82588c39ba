use std::time::Duration;

/// A failed model call. [`ModelError::retryable`] decides whether the client
/// tries again.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model endpoint {url} answered HTTP {status}: {body}")]
    Http {
        url: String,
        status: u16,
        body: String,
        retry_after: Option<Duration>,
    },
    #[error("cannot reach the model endpoint {url}: {message}")]
    Connect { url: String, message: String },
    #[error("the model stream from {url} ended early: {message}")]
    Stream { url: String, message: String },
    #[error("the model stream from {url} was idle for {}s (--llm-idle-timeout)", .idle.as_secs())]
    Idle { url: String, idle: Duration },
    #[error("the model call did not finish within {}s (--llm-timeout)", .0.as_secs())]
    Timeout(Duration),
    #[error("cannot read the model's reply from {url}: {message}")]
    Decode { url: String, message: String },
    #[error("no API key: set {var} in the environment or in ./.env (or point --openai-base-url at a server that needs none)")]
    NoKey { var: String },
    #[error("model configuration: {0}")]
    Config(String),
    /// A model API name that belay does not speak.
    #[error("unknown model API `{value}`: use responses, chat-completions, anthropic or gemini")]
    UnknownApi { value: String },
}

impl belay_record::Classify for ModelError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            // A refused key or a wrong model name is the user's to fix.
            ModelError::Http {
                status: 400 | 401 | 403 | 404,
                ..
            } => ExitClass::Usage,
            ModelError::NoKey { .. } | ModelError::Config(_) | ModelError::UnknownApi { .. } => {
                ExitClass::Usage
            }
            ModelError::Connect { .. } => ExitClass::Infra,
            ModelError::Http { .. }
            | ModelError::Stream { .. }
            | ModelError::Idle { .. }
            | ModelError::Timeout(_)
            | ModelError::Decode { .. } => ExitClass::Failed,
        }
    }
}

impl ModelError {
    /// 429, 5xx, connection errors and dropped or stalled streams are worth another try.
    pub fn retryable(&self) -> bool {
        match self {
            ModelError::Http { status, .. } => *status == 429 || *status >= 500,
            ModelError::Connect { .. } | ModelError::Stream { .. } | ModelError::Idle { .. } => {
                true
            }
            _ => false,
        }
    }

    /// The server's `Retry-After`, when it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelError::Http { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}
