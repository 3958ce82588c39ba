use std::path::PathBuf;

use crate::InfraFailure;

/// Errors from the sandbox service.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The engine itself is broken. Sticky: once raised, every later call on the
    /// same runtime returns it again, and the run stops without retries.
    #[error(transparent)]
    Infra(#[from] InfraFailure),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("image {image} is not present on the Docker engine. {hint}")]
    ImageMissing { image: String, hint: String },
    #[error("docker build of {dockerfile} failed: {message} (full log: {log})")]
    BuildFailed {
        dockerfile: PathBuf,
        message: String,
        log: PathBuf,
    },
    #[error("docker build of {dockerfile} did not finish within {secs} s; raise --docker-build-timeout (full log: {log})")]
    BuildTimeout {
        dockerfile: PathBuf,
        secs: u64,
        log: PathBuf,
    },
    #[error("{0}")]
    Bootstrap(String),
    #[error("docker {op} failed: {message}")]
    Docker { op: &'static str, message: String },
    /// A route out of the sandbox (the model route, the egress proxy, a
    /// network's fence) cannot be made.
    #[error("{0}")]
    Route(String),
    #[error("{0}")]
    BadUrl(String),
    /// A `seccomp_profile: bundled:NAME` that belay does not ship.
    #[error(
        "unknown bundled seccomp profile `{name}`: belay ships {}",
        crate::seccomp::bundled_names()
    )]
    UnknownSeccompProfile { name: String },
    /// The image registry failed a push, pull or lookup (the engine is fine).
    #[error("registry {op} of {image} failed: {message}. Check that the registry answers (`curl http://<host:port>/v2/`) and that the engine may use it: plain HTTP is allowed to loopback addresses and to the daemon's insecure-registries, and `docker login` credentials must be in ~/.docker/config.json's auths. Then rerun the same command: the build resumes")]
    Registry {
        op: &'static str,
        image: String,
        message: String,
    },
}

impl SandboxError {
    /// A write of belay's own record (`belay_record::atomic_write`) that
    /// failed while doing `op`: a full disk or a read-only state says so,
    /// with the path, as an IO error, not as the engine's.
    pub(crate) fn from_record(op: &'static str, e: belay_record::RecordError) -> Self {
        match e {
            belay_record::RecordError::Io {
                action,
                path,
                source,
            } => SandboxError::Io {
                action,
                path,
                source,
            },
            other => SandboxError::Docker {
                op,
                message: other.to_string(),
            },
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        SandboxError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub fn is_infra(&self) -> bool {
        matches!(self, SandboxError::Infra(_))
    }
}

impl belay_record::Classify for SandboxError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            SandboxError::Infra(_)
            | SandboxError::Docker { .. }
            | SandboxError::Route(_)
            | SandboxError::Registry { .. } => ExitClass::Infra,
            SandboxError::BadUrl(_) | SandboxError::UnknownSeccompProfile { .. } => {
                ExitClass::Usage
            }
            SandboxError::Io { source, .. } => belay_record::io_class(source),
            SandboxError::ImageMissing { .. } => ExitClass::Usage,
            SandboxError::BuildFailed { .. }
            | SandboxError::BuildTimeout { .. }
            | SandboxError::Bootstrap(_) => ExitClass::Failed,
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            SandboxError::Infra(_) | SandboxError::Docker { .. } => "BELAY-E301",
            SandboxError::Route(_) => "BELAY-E303",
            SandboxError::Registry { .. } => "BELAY-E305",
            SandboxError::Io { source, .. } => belay_record::io_code(source),
            SandboxError::ImageMissing { .. } => "BELAY-E106",
            e => e.exit_class().error_code(),
        }
    }
}
