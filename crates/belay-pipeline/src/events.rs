//! The pipeline's event kinds. Every event goes to the run's `events.jsonl`
//! in the envelope of `belay_record::events` (`{v, seq, at, run_id, mode,
//! source, kind, step?, data}`); the kinds are this closed enum.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

use crate::schema::{Access, OpenNet, StepKind};
use crate::state::Status;
use crate::verdict::Verdict;

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

fn is_false(b: &bool) -> bool {
    !*b
}

/// One node of the step graph in `run_started` (for a reader that draws it).
#[derive(Debug, Clone, Serialize)]
pub struct StepNode {
    pub name: String,
    pub kind: &'static str,
    pub on_pass: String,
    pub on_fail: String,
    pub on_unverifiable: String,
}

/// A resume that changed the attempt budget (`--max-attempts`).
#[derive(Debug, Clone, Serialize)]
pub struct Budget {
    pub max_attempts_before: u32,
    pub max_attempts: u32,
}

/// `run_started` and `run_resumed`.
#[derive(Debug, Clone, Serialize)]
pub struct RunStart {
    pub pipeline: PathBuf,
    pub attempt: u32,
    pub max_attempts: u32,
    pub current: Option<String>,
    pub clean_at_start: bool,
    pub steps: Vec<StepNode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// The pipeline's events, each with its data: serialised as `{"kind": …,
/// "data": …}` into the envelope, and told to the run's observer as they
/// are recorded. [`Kind`] names them; `agent`, the agents' own streamed
/// events, are written by the agent session and have no variant here.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum PipelineEvent {
    RunStarted(RunStart),
    RunResumed(RunStart),
    RunInterrupted {
        error: String,
    },
    RunEnd {
        status: Status,
        failure: Option<String>,
        commit: Option<String>,
        attempts: u32,
        step_runs: u64,
    },
    StepStart {
        n: u64,
        attempt: u32,
        step_kind: StepKind,
    },
    StepEnd {
        n: u64,
        verdict: Verdict,
        exit_code: Option<i64>,
        duration_s: f64,
    },
    Route {
        verdict: Verdict,
        to: String,
        /// What the next attempt is told (a failing gate's output).
        feedback: Option<String>,
    },
    Attempt {
        attempt: u32,
        max_attempts: u32,
    },
    Command {
        what: String,
        command: String,
        exit_code: i64,
        timed_out: bool,
        duration_s: f64,
        log: PathBuf,
    },
    SetupCached {
        stamp: PathBuf,
    },
    Sandbox {
        container: String,
        network: &'static str,
        workspace: Access,
        image: String,
        read_only_rootfs: bool,
        cap_drop: &'static str,
        git_mutations: bool,
        memory_bytes: i64,
        pids_limit: i64,
        secrets: String,
        seccomp: Option<String>,
    },
    EnvVolumes {
        dirs: Vec<String>,
        image: String,
    },
    OpenNetwork {
        network: String,
        firewall: String,
    },
    EgressProxy {
        network: String,
        proxy: String,
        class: OpenNet,
        presets: Vec<String>,
        allowed_hosts: BTreeSet<String>,
        allowed_ports: BTreeSet<u16>,
        any_public_host: bool,
        firewall: String,
    },
    /// One decision of an egress proxy.
    Egress(belay_sandbox::egress::Decision),
    ModelRoute {
        network: String,
        base_url_in_container: String,
        endpoint_host: Option<String>,
    },
    AgentReport {
        runner: String,
        stop: belay_agent::StopReason,
        turns: u32,
        usage: belay_model::Usage,
        cost_usd: f64,
        files_changed: Vec<String>,
        exit_code: Option<i32>,
        final_text: String,
        stderr_tail: String,
    },
    ArtifactDeleted {
        path: String,
    },
    /// A secret scrubbed from an artifact (`undeclared`: one the step did not
    /// declare; `renamed`: its name held it; `link`: a link's target), or,
    /// with `more`, how many such changes were not recorded one by one.
    ArtifactScrubbed {
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        #[serde(skip_serializing_if = "is_false")]
        undeclared: bool,
        #[serde(skip_serializing_if = "is_false")]
        renamed: bool,
        #[serde(skip_serializing_if = "is_false")]
        link: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        more: Option<usize>,
    },
    ArtifactUnreachable {
        path: String,
        why: String,
    },
    ArtifactCollected {
        path: String,
        bytes: usize,
    },
    SummaryCaptured {
        path: String,
        bytes: usize,
    },
    UntrackedAtStart {
        files: Vec<String>,
        files_total: usize,
        hint: &'static str,
    },
    StepInterrupted {
        n: u64,
        reason: String,
        after_s: f64,
    },
    ProcessesEnded {
        killed: usize,
    },
    SetidCleared {
        paths: Vec<String>,
    },
    /// What a step did to the git dir: repositories at committed submodule
    /// paths moved aside (`quarantined`, `not_moved`), planted files put
    /// back (`repaired` …), or control files that redirect git (`files`).
    GitTampered {
        #[serde(skip_serializing_if = "Option::is_none")]
        quarantined: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        not_moved: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        repaired: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        links_removed: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        modes_cleared: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        specials_removed: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        files: Option<Vec<String>>,
    },
    /// The commit point: a commit (`sha`, `message`, `files`), one
    /// recognised after a crash (`recovered`), or none (`skipped`).
    Commit {
        #[serde(skip_serializing_if = "Option::is_none")]
        sha: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        files: Option<Vec<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        files_total: Option<usize>,
        #[serde(skip_serializing_if = "is_false")]
        recovered: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<&'static str>,
    },
    CommitRefused {
        reason: String,
    },
}

impl PipelineEvent {
    /// The event's kind.
    pub fn kind(&self) -> Kind {
        match self {
            PipelineEvent::RunStarted(_) => Kind::RunStarted,
            PipelineEvent::RunResumed(_) => Kind::RunResumed,
            PipelineEvent::RunInterrupted { .. } => Kind::RunInterrupted,
            PipelineEvent::RunEnd { .. } => Kind::RunEnd,
            PipelineEvent::StepStart { .. } => Kind::StepStart,
            PipelineEvent::StepEnd { .. } => Kind::StepEnd,
            PipelineEvent::Route { .. } => Kind::Route,
            PipelineEvent::Attempt { .. } => Kind::Attempt,
            PipelineEvent::Command { .. } => Kind::Command,
            PipelineEvent::SetupCached { .. } => Kind::SetupCached,
            PipelineEvent::Sandbox { .. } => Kind::Sandbox,
            PipelineEvent::EnvVolumes { .. } => Kind::EnvVolumes,
            PipelineEvent::OpenNetwork { .. } => Kind::OpenNetwork,
            PipelineEvent::EgressProxy { .. } => Kind::EgressProxy,
            PipelineEvent::Egress(_) => Kind::Egress,
            PipelineEvent::ModelRoute { .. } => Kind::ModelRoute,
            PipelineEvent::AgentReport { .. } => Kind::AgentReport,
            PipelineEvent::ArtifactDeleted { .. } => Kind::ArtifactDeleted,
            PipelineEvent::ArtifactScrubbed { .. } => Kind::ArtifactScrubbed,
            PipelineEvent::ArtifactUnreachable { .. } => Kind::ArtifactUnreachable,
            PipelineEvent::ArtifactCollected { .. } => Kind::ArtifactCollected,
            PipelineEvent::SummaryCaptured { .. } => Kind::SummaryCaptured,
            PipelineEvent::UntrackedAtStart { .. } => Kind::UntrackedAtStart,
            PipelineEvent::StepInterrupted { .. } => Kind::StepInterrupted,
            PipelineEvent::ProcessesEnded { .. } => Kind::ProcessesEnded,
            PipelineEvent::SetidCleared { .. } => Kind::SetidCleared,
            PipelineEvent::GitTampered { .. } => Kind::GitTampered,
            PipelineEvent::Commit { .. } => Kind::Commit,
            PipelineEvent::CommitRefused { .. } => Kind::CommitRefused,
        }
    }

    /// An artifact scrubbed in place (`path`).
    pub fn scrubbed(path: &str) -> PipelineEvent {
        PipelineEvent::ArtifactScrubbed {
            path: Some(path.to_string()),
            undeclared: false,
            renamed: false,
            link: false,
            more: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_kind_is_the_serialised_kind() {
        let ev = [
            PipelineEvent::Attempt {
                attempt: 2,
                max_attempts: 3,
            },
            PipelineEvent::scrubbed("a.txt"),
            PipelineEvent::Commit {
                sha: None,
                message: None,
                files: None,
                files_total: None,
                recovered: false,
                skipped: Some("nothing to commit"),
            },
        ];
        for e in ev {
            let v = serde_json::to_value(&e).unwrap();
            assert_eq!(v["kind"], serde_json::to_value(e.kind()).unwrap());
        }
        let v = serde_json::to_value(PipelineEvent::scrubbed("a.txt")).unwrap();
        assert_eq!(v["data"], serde_json::json!({"path": "a.txt"}));
    }
}
