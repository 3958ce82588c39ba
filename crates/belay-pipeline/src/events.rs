//! The pipeline's event kinds. Every event goes to the run's `events.jsonl`
//! in the envelope of `belay_record::events` (`{v, seq, at, run_id, mode,
//! source, kind, step?, data}`); the kinds are this closed enum.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    RunStarted,
    RunResumed,
    RunInterrupted,
    RunEnd,
    StepStart,
    StepEnd,
    Route,
    Attempt,
    Command,
    SetupCached,
    Sandbox,
    EnvVolumes,
    OpenNetwork,
    EgressProxy,
    Egress,
    ModelRoute,
    Agent,
    AgentReport,
    ArtifactDeleted,
    ArtifactScrubbed,
    ArtifactUnreachable,
    ArtifactCollected,
    SummaryCaptured,
    UntrackedAtStart,
    StepInterrupted,
    ProcessesEnded,
    SetidCleared,
    GitTampered,
    Commit,
    CommitRefused,
}

impl Kind {
    /// Every kind, for the documented list and its snapshot.
    pub const ALL: &'static [Kind] = &[
        Kind::RunStarted,
        Kind::RunResumed,
        Kind::RunInterrupted,
        Kind::RunEnd,
        Kind::StepStart,
        Kind::StepEnd,
        Kind::Route,
        Kind::Attempt,
        Kind::Command,
        Kind::SetupCached,
        Kind::Sandbox,
        Kind::EnvVolumes,
        Kind::OpenNetwork,
        Kind::EgressProxy,
        Kind::Egress,
        Kind::ModelRoute,
        Kind::Agent,
        Kind::AgentReport,
        Kind::ArtifactDeleted,
        Kind::ArtifactScrubbed,
        Kind::ArtifactUnreachable,
        Kind::ArtifactCollected,
        Kind::SummaryCaptured,
        Kind::UntrackedAtStart,
        Kind::StepInterrupted,
        Kind::ProcessesEnded,
        Kind::SetidCleared,
        Kind::GitTampered,
        Kind::Commit,
        Kind::CommitRefused,
    ];

    /// Who produces events of this kind (the envelope's `source`).
    pub fn source(&self) -> &'static str {
        match self {
            Kind::Agent | Kind::AgentReport => "agent",
            Kind::Egress | Kind::EgressProxy | Kind::ModelRoute | Kind::OpenNetwork => "egress",
            Kind::Sandbox | Kind::EnvVolumes | Kind::ProcessesEnded | Kind::SetidCleared => {
                "sandbox"
            }
            Kind::Commit | Kind::CommitRefused | Kind::GitTampered => "vcs",
            _ => "engine",
        }
    }
}

/// `{"kind": …, "data": …}`, for the envelope.
#[derive(Serialize)]
pub struct Event<'a> {
    pub kind: Kind,
    pub data: &'a serde_json::Value,
}
