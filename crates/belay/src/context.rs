//! What several commands share: the engine connection and the redactor of
//! the host's own secrets. A leaf: it imports no command.

use belay_sandbox::DockerRuntime;

use crate::exit::{Failure, EXIT_INFRA};

/// The secrets an env build's records must not hold: proxy credentials and
/// the model keys of the environment.
pub fn build_redactor() -> belay_record::Redactor {
    let mut r = belay_record::Redactor::default();
    belay_sandbox::trust::HostTrust::detect().register_secrets(&mut r);
    for k in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "BELAY_LLM_API_KEY"] {
        if let Ok(v) = std::env::var(k) {
            r.add(k, v);
        }
    }
    r
}

pub async fn connect() -> Result<DockerRuntime, Failure> {
    DockerRuntime::connect().await.map_err(|e| Failure {
        code: EXIT_INFRA,
        error: e.into(),
    })
}
