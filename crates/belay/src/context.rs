//! What several commands share: the engine connection and the redactor of
//! the host's own secrets. A leaf: it imports no command.

use belay_sandbox::DockerRuntime;

use crate::exit::{Failure, EXIT_INFRA};

/// The one redaction policy's host part (`belay_sandbox::trust::host_redactor`).
pub fn build_redactor() -> belay_record::Redactor {
    belay_sandbox::trust::host_redactor()
}

pub async fn connect() -> Result<DockerRuntime, Failure> {
    DockerRuntime::connect().await.map_err(|e| Failure {
        code: EXIT_INFRA,
        error: e.into(),
    })
}

/// SIGINT and SIGTERM: the first asks the run to stop cleanly (the receiver
/// gets the reason); a second one exits at once with 130 (the next start's
/// reaper removes what is left).
pub fn stop_on_signals() -> Result<tokio::sync::watch::Receiver<Option<String>>, Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let watch = |k: SignalKind, name: &str| {
        signal(k).map_err(|e| Failure {
            code: EXIT_INFRA,
            error: anyhow::anyhow!("cannot watch {name}: {e}"),
        })
    };
    let mut int = watch(SignalKind::interrupt(), "SIGINT")?;
    let mut term = watch(SignalKind::terminate(), "SIGTERM")?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
            if tx.borrow().is_some() {
                eprintln!("[belay] {name} again: exiting now");
                std::process::exit(130);
            }
            eprintln!("[belay] {name}: stopping the run cleanly (again to exit at once)");
            tx.send_replace(Some(format!("{name} received")));
        }
    });
    Ok(rx)
}
