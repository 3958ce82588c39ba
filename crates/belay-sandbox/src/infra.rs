//! Infra-failure classification.
//!
//! A command that fails is the project's problem and may be repaired; an engine
//! that fails is not, and retrying or "repairing" against it wastes the run and
//! corrupts its record. These failures stop the run at once.

use std::sync::Mutex;

/// A failure of the container engine rather than of the command it ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InfraFailure {
    #[error(
        "the Docker daemon is not reachable ({detail}). Start it (`dockerd &` or \
         `systemctl start docker`), check DOCKER_HOST, then rerun the same command \
         to resume"
    )]
    DaemonGone { detail: String },
    #[error(
        "the Docker daemon did not answer `{op}` within {secs} s (it is stalled or \
         overloaded, or not there). Check `docker info` and the daemon log; the \
         same command resumes (BELAY_ENGINE_TIMEOUT_S sets the limit)"
    )]
    EngineTimeout { op: String, secs: u64 },
    #[error(
        "the Docker engine could not run the command (exit 125: {detail}). Check \
         `docker info` and the daemon log, then rerun the same command to resume"
    )]
    EngineExit125 { detail: String },
    #[error(
        "the container could not execute the command because of an I/O error \
         (exit 126: {detail}). The disk may be full or the storage driver broken: \
         check `df -h` and `docker system df`, then rerun the same command to resume"
    )]
    ExecIoError { detail: String },
    #[error(
        "the Docker daemon returned an error ({status}: {detail}). Check the daemon \
         log and free disk (`docker system df`), then rerun the same command to resume"
    )]
    DaemonError { status: u16, detail: String },
    #[error(
        "container {container} stopped or vanished while a command ran in it (it was \
         killed or removed from outside belay, or the engine lost it). Check `docker \
         events` and the daemon log, then rerun the same command to resume"
    )]
    ContainerGone { container: String },
}

/// Classify a finished exec: 125 is the engine's own failure code, and 126 with
/// an I/O error in the output means the runtime could not even start it.
pub fn classify_exit(exit_code: i64, output_tail: &str) -> Option<InfraFailure> {
    let first_line = |s: &str| {
        s.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .chars()
            .take(300)
            .collect::<String>()
    };
    match exit_code {
        // Through the Engine API, 125 is the engine's own code only when the
        // engine says so; a command may exit 125 itself (xargs, env, nohup).
        125 if is_engine_error_text(output_tail) => Some(InfraFailure::EngineExit125 {
            detail: first_line(output_tail),
        }),
        126 if is_io_error_text(output_tail) => Some(InfraFailure::ExecIoError {
            detail: first_line(output_tail),
        }),
        _ => None,
    }
}

fn is_engine_error_text(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    [
        "error response from daemon",
        "oci runtime",
        "failed to create shim",
        "runc create failed",
        "cannot exec in a stopped state",
        "container is not running",
    ]
    .iter()
    .any(|p| t.contains(p))
}

fn is_io_error_text(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    [
        "input/output error",
        "i/o error",
        "no space left on device",
        "read-only file system",
        "structure needs cleaning",
        "stale file handle",
        "oci runtime exec failed",
    ]
    .iter()
    .any(|p| t.contains(p))
}

/// Classify an error from the Engine API client. Returns `None` for errors that
/// are about the request (a missing image, a conflict) rather than the engine.
pub fn classify_api_error(err: &bollard::errors::Error) -> Option<InfraFailure> {
    use bollard::errors::Error as E;
    match err {
        E::DockerResponseServerError {
            status_code,
            message,
        } if *status_code >= 500 => Some(InfraFailure::DaemonError {
            status: *status_code,
            detail: message.clone(),
        }),
        E::DockerResponseServerError { .. } => None,
        E::IOError { .. }
        | E::HyperResponseError { .. }
        | E::HttpClientError { .. }
        | E::SocketNotFoundError(_)
        | E::RequestTimeoutError => Some(InfraFailure::DaemonGone {
            detail: err.to_string(),
        }),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// The sticky infra error of one runtime: the first failure is kept and returned
/// by every later call.
#[derive(Debug, Default)]
pub struct Sticky {
    failure: Mutex<Option<InfraFailure>>,
}

impl Sticky {
    /// Forget the failure: the engine answers again (a batch that waited
    /// for it goes on).
    pub fn clear(&self) {
        if let Ok(mut g) = self.failure.lock() {
            *g = None;
        }
    }

    pub fn check(&self) -> Result<(), InfraFailure> {
        match self.failure.lock() {
            Ok(g) => match &*g {
                Some(f) => Err(f.clone()),
                None => Ok(()),
            },
            Err(_) => Ok(()),
        }
    }

    /// Record `failure` (the first one wins) and return the sticky one.
    pub fn raise(&self, failure: InfraFailure) -> InfraFailure {
        match self.failure.lock() {
            Ok(mut g) => g.get_or_insert(failure).clone(),
            Err(_) => failure,
        }
    }
}

/// Always the machine's (exit 3): the engine, not the command, failed.
impl belay_record::Classify for InfraFailure {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Infra
    }

    fn error_code(&self) -> &'static str {
        "BELAY-E301"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert!(matches!(
            classify_exit(
                125,
                "docker: Error response from daemon: OCI runtime create failed"
            ),
            Some(InfraFailure::EngineExit125 { .. })
        ));
        assert!(matches!(
            classify_exit(126, "bash: /workspace/x.sh: Input/output error\n"),
            Some(InfraFailure::ExecIoError { .. })
        ));
        // A plain "permission denied" 126 is the project's problem.
        assert_eq!(
            classify_exit(126, "bash: ./gradlew: Permission denied"),
            None
        );
        assert_eq!(classify_exit(1, "No space left on device"), None);
        assert_eq!(classify_exit(0, ""), None);
    }

    #[test]
    fn api_errors() {
        let e = bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: "devmapper: no space".into(),
        };
        assert!(matches!(
            classify_api_error(&e),
            Some(InfraFailure::DaemonError { status: 500, .. })
        ));
        let e = bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            message: "No such image".into(),
        };
        assert_eq!(classify_api_error(&e), None);
        let e = bollard::errors::Error::SocketNotFoundError("/var/run/docker.sock".into());
        let f = classify_api_error(&e).unwrap();
        assert!(f.to_string().contains("dockerd"), "{f}");
    }

    #[test]
    fn sticky_keeps_the_first() {
        let s = Sticky::default();
        assert!(s.check().is_ok());
        s.raise(InfraFailure::DaemonGone { detail: "a".into() });
        s.raise(InfraFailure::DaemonGone { detail: "b".into() });
        assert_eq!(
            s.check(),
            Err(InfraFailure::DaemonGone { detail: "a".into() })
        );
    }
}
