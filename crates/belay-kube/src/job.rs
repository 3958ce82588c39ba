//! The Indexed Job that runs a batch: one completion index per work item.
//!
//! Each index's pod runs the worker for that index only, so that a project's
//! failure fails its index and nothing else. The exit codes of the worker map
//! onto the pod failure policy:
//!
//! | worker exit | meaning | policy |
//! |---|---|---|
//! | 0 | the item built (or had its result already) | success |
//! | 1 | the item's build failed for a reason a retry will not change | `FailIndex` |
//! | 2 | usage: the spec or the options are wrong | `FailJob` |
//! | 3 | infrastructure: the engine, the registry, a full disk | `Count` (retried up to `backoffLimitPerIndex`) |
//! | a disruption (node drain, preemption) | | `Ignore` (retried, not counted) |

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, HostPathVolumeSource,
    LocalObjectReference, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, Probe, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The worker's exit codes (belay's exit classes).
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_INFRA: i32 = 3;

/// The annotation the Job controller puts the completion index in.
pub const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
/// The env var the worker reads its index from (set from the annotation).
pub const INDEX_ENV: &str = "BELAY_WORK_INDEX";
/// Where the pod's engine socket is, in the Docker-in-Docker case.
pub const DIND_SOCKET_DIR: &str = "/run/belay-engine";

/// Where a pod's container engine comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum PodEngine {
    /// A privileged Docker-in-Docker sidecar (a native sidecar: an init
    /// container with `restartPolicy: Always`), with its own image store on
    /// an `emptyDir`. Isolated from the node; its cache is the registry.
    Dind { image: String },
    /// The node's engine socket, by `hostPath`. Unprivileged pods, the node's
    /// image store shared, and every pod root on the node through the socket.
    NodeSocket { path: String },
}

/// What the batch's Job is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexedJob {
    pub name: String,
    pub namespace: String,
    /// The worker image, pinned by digest.
    pub image: String,
    /// The worker's arguments; `$(BELAY_WORK_INDEX)` is expanded by the kubelet.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub labels: BTreeMap<String, String>,
    pub completions: u32,
    pub parallelism: u32,
    /// Retries of one index for infrastructure failures.
    pub backoff_limit_per_index: u32,
    pub engine: PodEngine,
    /// The ReadWriteMany claim that holds the work dir (spec, claims,
    /// results, state), and where it is mounted, in the worker and in the
    /// engine (build containers bind-mount paths under it).
    pub work_claim: String,
    pub work_mount: String,
    /// A `kubernetes.io/dockerconfigjson` secret for pulling the worker image.
    pub pull_secret: Option<String>,
    pub service_account: Option<String>,
    /// Finished Jobs are deleted by the cluster after this long.
    pub ttl_after_finished_secs: u32,
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn exit_rule(action: &str, values: Vec<i32>) -> PodFailurePolicyRule {
    PodFailurePolicyRule {
        action: action.into(),
        on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
            container_name: Some("worker".into()),
            operator: "In".into(),
            values,
        }),
        on_pod_conditions: None,
    }
}

/// The worker's index, from the completion index annotation.
fn index_env() -> EnvVar {
    EnvVar {
        name: INDEX_ENV.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: format!("metadata.annotations['{INDEX_ANNOTATION}']"),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Docker-in-Docker engine: a native sidecar on `socket`, its store on
/// an `emptyDir`, the work dir mounted where the worker has it.
fn dind_sidecar(
    image: &str,
    socket: &str,
    socket_mount: VolumeMount,
    work_volume: VolumeMount,
) -> Container {
    Container {
        name: "engine".into(),
        image: Some(image.to_string()),
        args: Some(vec![
            "dockerd".into(),
            format!("--host={socket}"),
            "--tls=false".into(),
        ]),
        // A native sidecar: it runs beside the worker and is stopped
        // when the worker ends, so the pod completes.
        restart_policy: Some("Always".into()),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }),
        // The worker starts once the engine answers.
        startup_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![
                    "docker".into(),
                    format!("--host={socket}"),
                    "info".into(),
                ]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(120),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            socket_mount,
            VolumeMount {
                name: "engine-store".into(),
                mount_path: "/var/lib/docker".into(),
                ..Default::default()
            },
            // Build containers bind-mount paths of the work dir, which
            // the engine resolves in its own file system.
            work_volume,
        ]),
        ..Default::default()
    }
}

/// The exit codes and disruptions onto the pod failure policy (module docs).
fn failure_policy() -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            exit_rule("FailJob", vec![EXIT_USAGE]),
            exit_rule("FailIndex", vec![EXIT_FAILED]),
            exit_rule("Count", vec![EXIT_INFRA]),
            PodFailurePolicyRule {
                action: "Ignore".into(),
                on_exit_codes: None,
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                }]),
            },
        ],
    }
}

/// The Job's manifest.
pub fn job_manifest(spec: &IndexedJob) -> Job {
    let work_volume = VolumeMount {
        name: "work".into(),
        mount_path: spec.work_mount.clone(),
        ..Default::default()
    };
    let mut volumes = vec![Volume {
        name: "work".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: spec.work_claim.clone(),
            read_only: Some(false),
        }),
        ..Default::default()
    }];
    let mut worker_env = vec![index_env()];
    worker_env.extend(spec.env.iter().map(|(k, v)| env(k, v)));
    let mut worker_mounts = vec![work_volume.clone()];
    let mut init_containers = None;
    match &spec.engine {
        PodEngine::Dind { image } => {
            let socket = format!("unix://{DIND_SOCKET_DIR}/docker.sock");
            volumes.push(Volume {
                name: "engine-socket".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            });
            volumes.push(Volume {
                name: "engine-store".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            });
            let socket_mount = VolumeMount {
                name: "engine-socket".into(),
                mount_path: DIND_SOCKET_DIR.into(),
                ..Default::default()
            };
            worker_mounts.push(socket_mount.clone());
            worker_env.push(env("DOCKER_HOST", &socket));
            init_containers = Some(vec![dind_sidecar(
                image,
                &socket,
                socket_mount,
                work_volume,
            )]);
        }
        PodEngine::NodeSocket { path } => {
            volumes.push(Volume {
                name: "engine-socket".into(),
                host_path: Some(HostPathVolumeSource {
                    path: path.clone(),
                    type_: Some("Socket".into()),
                }),
                ..Default::default()
            });
            worker_mounts.push(VolumeMount {
                name: "engine-socket".into(),
                mount_path: "/var/run/docker.sock".into(),
                ..Default::default()
            });
            worker_env.push(env("DOCKER_HOST", "unix:///var/run/docker.sock"));
        }
    }
    let worker = Container {
        name: "worker".into(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(spec.args.clone()),
        env: Some(worker_env),
        volume_mounts: Some(worker_mounts),
        // The worker's last words (its result line) come back in the pod's
        // status, where the controller reads why an index failed.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let metadata = ObjectMeta {
        name: Some(spec.name.clone()),
        namespace: Some(spec.namespace.clone()),
        labels: Some(spec.labels.clone()),
        ..Default::default()
    };
    Job {
        metadata,
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(spec.completions as i32),
            parallelism: Some(spec.parallelism.max(1) as i32),
            backoff_limit_per_index: Some(spec.backoff_limit_per_index as i32),
            // Every index may fail on its own: the batch reports them; the
            // Job never stops the others because some failed.
            max_failed_indexes: Some(spec.completions as i32),
            pod_failure_policy: Some(failure_policy()),
            ttl_seconds_after_finished: Some(spec.ttl_after_finished_secs as i32),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(spec.labels.clone()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    // A pod failure policy needs pods that are never restarted
                    // in place: a retry is a new pod.
                    restart_policy: Some("Never".into()),
                    init_containers,
                    containers: vec![worker],
                    volumes: Some(volumes),
                    image_pull_secrets: spec
                        .pull_secret
                        .as_ref()
                        .map(|s| vec![LocalObjectReference { name: s.clone() }]),
                    service_account_name: spec.service_account.clone(),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// A Kubernetes object name from any text: lowercase alphanumerics and `-`,
/// at most 63 characters, starting and ending alphanumeric.
pub fn object_name(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    out.truncate(63);
    let trimmed = out.trim_matches('-');
    if trimmed.is_empty() {
        "belay".into()
    } else {
        trimmed.to_string()
    }
}
