//! What several commands share: the engine connection and the redactor of
//! the host's own secrets. A leaf: it imports no command.

use belay_sandbox::DockerRuntime;

use crate::exit::Failure;

/// The one redaction policy's host part (`belay_sandbox::trust::host_redactor`).
pub fn build_redactor() -> belay_record::Redactor {
    belay_sandbox::trust::host_redactor()
}

pub async fn connect() -> Result<DockerRuntime, Failure> {
    DockerRuntime::connect()
        .await
        .map_err(|e| Failure::with_code(belay_record::ExitClass::Infra.code(), e))
}

/// The one cancellation token, tripped by SIGINT and SIGTERM
/// (`belay_record::Stop::on_signals`).
pub fn stop_on_signals() -> Result<belay_record::Stop, Failure> {
    Ok(belay_record::Stop::on_signals(|m| {
        eprintln!("[belay] {m}")
    })?)
}
