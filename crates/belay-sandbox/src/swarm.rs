//! Jobs on a Docker Swarm: a `replicated-job` service whose tasks each run one
//! command to completion, up to a number of completions, a few at a time.
//!
//! This is the engine's scheduler, not belay's: belay describes the job
//! ([`JobSpec`]), creates it, watches its tasks and removes it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use bollard::models::{
    Mount, MountType, ServiceSpec, ServiceSpecMode, ServiceSpecModeReplicatedJob, TaskSpec,
    TaskSpecContainerSpec, TaskSpecRestartPolicy, TaskSpecRestartPolicyConditionEnum,
};

use crate::SandboxError;

/// A job: `completions` tasks of `image` running `args`, `max_concurrent` at
/// a time; a task that fails is replaced up to `max_attempts` times.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobSpec {
    pub name: String,
    pub image: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Host path, path in the task's container, read-only.
    pub binds: Vec<(PathBuf, String, bool)>,
    pub labels: BTreeMap<String, String>,
    pub completions: u64,
    pub max_concurrent: u64,
    pub max_attempts: u64,
}

/// One task of a job, as the engine reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskView {
    pub id: String,
    /// `new`, `pending`, `running`, `complete`, `failed`, `shutdown`, …
    pub state: String,
    pub desired: String,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub container: Option<String>,
}

impl TaskView {
    pub fn is_done(&self) -> bool {
        matches!(
            self.state.as_str(),
            "complete" | "failed" | "shutdown" | "rejected" | "orphaned" | "remove"
        )
    }
}

/// Swarm jobs through the engine.
#[async_trait]
pub trait SwarmJobs: Send + Sync {
    /// Whether this engine is an active swarm manager.
    async fn swarm_active(&self) -> Result<bool, SandboxError>;
    /// Create the job; its service id.
    async fn create_job(&self, spec: &JobSpec) -> Result<String, SandboxError>;
    async fn job_tasks(&self, service: &str) -> Result<Vec<TaskView>, SandboxError>;
    /// Remove the job's service; its running tasks are stopped.
    async fn remove_job(&self, service: &str) -> Result<(), SandboxError>;
}

/// The Engine API's service for a job.
pub fn service_spec(spec: &JobSpec) -> ServiceSpec {
    let mounts = spec
        .binds
        .iter()
        .map(|(src, dst, ro)| Mount {
            source: Some(src.display().to_string()),
            target: Some(dst.clone()),
            typ: Some(MountType::BIND),
            read_only: Some(*ro),
            ..Default::default()
        })
        .collect();
    let labels: std::collections::HashMap<String, String> =
        spec.labels.clone().into_iter().collect();
    ServiceSpec {
        name: Some(spec.name.clone()),
        labels: Some(labels.clone()),
        task_template: Some(TaskSpec {
            container_spec: Some(TaskSpecContainerSpec {
                image: Some(spec.image.clone()),
                labels: Some(labels),
                args: Some(spec.args.clone()),
                env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
                mounts: Some(mounts),
                // The task is the leader of its work: belay inside handles its
                // own children; an init reaps what it does not.
                init: Some(true),
                ..Default::default()
            }),
            restart_policy: Some(TaskSpecRestartPolicy {
                condition: Some(TaskSpecRestartPolicyConditionEnum::ON_FAILURE),
                delay: Some(1_000_000_000),
                max_attempts: Some(spec.max_attempts as i64),
                window: None,
            }),
            ..Default::default()
        }),
        mode: Some(ServiceSpecMode {
            replicated_job: Some(ServiceSpecModeReplicatedJob {
                max_concurrent: Some(spec.max_concurrent as i64),
                total_completions: Some(spec.completions as i64),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_a_replicated_job_service_of_bind_mounts() {
        let spec = JobSpec {
            name: "belay-batch-x".into(),
            image: "127.0.0.1:5000/belay-worker:0.1.0-abcd".into(),
            args: vec![
                "env".into(),
                "worker".into(),
                "--spec".into(),
                "/p/spec.json".into(),
            ],
            env: vec![("BELAY_CACHE_DIR".into(), "/c".into())],
            binds: vec![
                (
                    "/var/run/docker.sock".into(),
                    "/var/run/docker.sock".into(),
                    false,
                ),
                (
                    "/etc/ssl/certs/ca-certificates.crt".into(),
                    "/etc/ssl/certs/ca-certificates.crt".into(),
                    true,
                ),
            ],
            labels: BTreeMap::from([("belay".into(), "true".into())]),
            completions: 4,
            max_concurrent: 2,
            max_attempts: 3,
        };
        let v = serde_json::to_value(service_spec(&spec)).unwrap();
        assert_eq!(v["Mode"]["ReplicatedJob"]["TotalCompletions"], 4);
        assert_eq!(v["Mode"]["ReplicatedJob"]["MaxConcurrent"], 2);
        let c = &v["TaskTemplate"]["ContainerSpec"];
        assert_eq!(c["Image"], "127.0.0.1:5000/belay-worker:0.1.0-abcd");
        assert_eq!(c["Args"][1], "worker");
        assert_eq!(c["Env"][0], "BELAY_CACHE_DIR=/c");
        assert_eq!(c["Mounts"][0]["Type"], "bind");
        assert_eq!(c["Mounts"][1]["ReadOnly"], true);
        assert_eq!(
            v["TaskTemplate"]["RestartPolicy"]["Condition"],
            "on-failure"
        );
        assert_eq!(v["TaskTemplate"]["RestartPolicy"]["MaxAttempts"], 3);
    }
}
