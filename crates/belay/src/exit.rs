//! Exit codes. Every library error says its class ([`belay_record::Classify`]);
//! this module only finds the error in the chain and maps the class.

use belay_record::{Classify, ExitClass};

/// Exit codes (documented in `belay --help`).
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_INFRA: u8 = 3;

/// An error with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        let error = e.into();
        let code = class_of(&error).0.code();
        Failure { code, error }
    }
}

impl Failure {
    /// The stable code (`BELAY-E…`, `docs/troubleshooting.md`).
    pub fn error_code(&self) -> &'static str {
        match class_of(&self.error) {
            (_, Some(c)) => c,
            (class, None) => match self.code {
                EXIT_USAGE => ExitClass::Usage.error_code(),
                EXIT_INFRA => ExitClass::Infra.error_code(),
                _ => class.error_code(),
            },
        }
    }
}

/// A failure of what the user gave belay (exit 2), with the message that says
/// how to fix it.
pub fn usage(msg: impl Into<String>) -> Failure {
    Failure {
        code: EXIT_USAGE,
        error: anyhow::anyhow!(msg.into()),
    }
}

/// The class of the first library error in the chain (the outermost one
/// decides: a pipeline error that wraps an engine failure says so itself).
fn class_of(e: &anyhow::Error) -> (ExitClass, Option<&'static str>) {
    for cause in e.chain() {
        if let Some((c, code)) = classify(cause) {
            return (c, Some(code));
        }
    }
    (ExitClass::Failed, None)
}

/// Each library's error types, once; their own `exit_class` and `error_code` decide.
fn classify(e: &(dyn std::error::Error + 'static)) -> Option<(ExitClass, &'static str)> {
    fn class<T: Classify + std::error::Error + 'static>(
        e: &(dyn std::error::Error + 'static),
    ) -> Option<(ExitClass, &'static str)> {
        e.downcast_ref::<T>()
            .map(|x| (x.exit_class(), x.error_code()))
    }
    class::<belay_env::EnvError>(e)
        .or_else(|| class::<belay_kube::KubeError>(e))
        .or_else(|| class::<belay_pipeline::PipelineError>(e))
        .or_else(|| class::<belay_pipeline::LoadError>(e))
        .or_else(|| class::<belay_plan::PlanError>(e))
        .or_else(|| class::<belay_plan::generate::GenerateError>(e))
        .or_else(|| class::<belay_jobs::JobsError>(e))
        .or_else(|| class::<belay_agent::AgentError>(e))
        .or_else(|| class::<belay_model::ModelError>(e))
        .or_else(|| class::<belay_model::replay::ReplayError>(e))
        .or_else(|| class::<belay_sandbox::SandboxError>(e))
        .or_else(|| class::<belay_sandbox::hostfs::HostFsError>(e))
        .or_else(|| class::<belay_vcs::VcsError>(e))
        .or_else(|| class::<belay_record::RecordError>(e))
        .or_else(|| class::<belay_record::ControlChanged>(e))
        .or_else(|| class::<belay_record::IdError>(e))
        .or_else(|| class::<belay_env::ClusterError>(e))
        .or_else(|| class::<belay_agent::SpecError>(e))
        .or_else(|| class::<belay_ui::UiError>(e))
        .or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .map(|x| (belay_record::io_class(x), belay_record::io_code(x)))
        })
}
