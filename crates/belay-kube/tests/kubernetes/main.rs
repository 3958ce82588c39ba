//! The Kubernetes backend without a cluster: the Job manifests against the
//! `k8s-openapi` schema (and snapshots), and the controller against API
//! server exchanges replayed by a tower service. Nothing here has run on a
//! real cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod replay;
mod schema;

use std::collections::BTreeMap;

use belay_kube::{job_manifest, IndexedJob, JobEnd, KubeJobs, PodEngine};
use belay_record::Classify;
use replay::Replay;
use serde_json::Value;

fn spec(engine: PodEngine) -> IndexedJob {
    IndexedJob {
        name: "belay-b1".into(),
        namespace: "builds".into(),
        image: format!(
            "127.0.0.1:5000/belay-worker:0.1.0-abcd@sha256:{}",
            "ab".repeat(32)
        ),
        args: vec![
            "env".into(),
            "worker".into(),
            "--spec".into(),
            "/belay/work/spec.json".into(),
            "--index".into(),
            "$(BELAY_WORK_INDEX)".into(),
        ],
        env: vec![("BELAY_CACHE_DIR".into(), "/belay/work/cache".into())],
        labels: BTreeMap::from([
            ("belay".into(), "true".into()),
            ("belay.batch".into(), "b1".into()),
        ]),
        completions: 4,
        parallelism: 2,
        backoff_limit_per_index: 2,
        engine,
        work_claim: "belay-work".into(),
        work_mount: "/belay/work".into(),
        pull_secret: Some("registry-login".into()),
        service_account: None,
        ttl_after_finished_secs: 86400,
    }
}

fn dind() -> PodEngine {
    PodEngine::Dind {
        image: "docker:27-dind".into(),
    }
}

fn manifest(engine: PodEngine) -> Value {
    serde_json::to_value(job_manifest(&spec(engine))).unwrap()
}

#[test]
fn the_job_manifests_match_their_snapshots() {
    insta::assert_json_snapshot!("job-dind", manifest(dind()));
    insta::assert_json_snapshot!(
        "job-node-socket",
        manifest(PodEngine::NodeSocket {
            path: "/var/run/docker.sock".into()
        })
    );
}

#[test]
fn the_job_manifests_validate_against_the_k8s_openapi_schema() {
    let schema = schema::job_schema();
    for engine in [
        dind(),
        PodEngine::NodeSocket {
            path: "/var/run/docker.sock".into(),
        },
    ] {
        let m = manifest(engine);
        let errors = schema::validate(&schema, &m);
        assert!(errors.is_empty(), "{errors:#?}");
    }
    // The validator is not blind: a misspelt field, a wrong type and a
    // missing required field are each found.
    let mut m = manifest(dind());
    m["spec"]["backofLimitPerIndex"] = 2.into();
    m["spec"]["completions"] = "four".into();
    m["spec"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("name");
    let errors = schema::validate(&schema, &m);
    let text = errors.join("\n");
    assert!(text.contains("/spec/backofLimitPerIndex"), "{text}");
    assert!(text.contains("/spec/completions"), "{text}");
    assert!(
        text.contains("/spec/template/spec/containers/0: missing name"),
        "{text}"
    );
}

/// What the API server checks beyond the schema (the Job and Pod validation
/// rules of Kubernetes 1.33), for both engines.
#[test]
fn the_job_manifests_pass_the_api_servers_job_rules() {
    for engine in [
        dind(),
        PodEngine::NodeSocket {
            path: "/var/run/docker.sock".into(),
        },
    ] {
        let m = manifest(engine.clone());
        let s = &m["spec"];
        assert_eq!(s["completionMode"], "Indexed");
        // backoffLimitPerIndex and a FailIndex rule need Indexed; a pod
        // failure policy needs restartPolicy Never.
        assert_eq!(s["template"]["spec"]["restartPolicy"], "Never");
        assert!(s["backoffLimitPerIndex"].as_i64().unwrap() >= 0);
        // Every index may fail without stopping the others.
        assert_eq!(s["maxFailedIndexes"], s["completions"]);
        let rules = s["podFailurePolicy"]["rules"].as_array().unwrap();
        let actions: Vec<&str> = rules
            .iter()
            .map(|r| r["action"].as_str().unwrap())
            .collect();
        assert_eq!(actions, ["FailJob", "FailIndex", "Count", "Ignore"]);
        for r in rules {
            // Exactly one of onExitCodes and onPodConditions; exit codes name
            // a container of the pod, and 0 is never among them.
            assert!(r.get("onExitCodes").is_some() != r.get("onPodConditions").is_some());
            if let Some(e) = r.get("onExitCodes") {
                assert_eq!(e["containerName"], "worker");
                assert!(!e["values"].as_array().unwrap().contains(&0.into()));
            }
        }
        // The worker reads its index from the annotation the Job controller sets.
        let worker = &s["template"]["spec"]["containers"][0];
        let envs = worker["env"].as_array().unwrap();
        assert_eq!(
            envs[0]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
        assert!(worker["args"]
            .as_array()
            .unwrap()
            .contains(&"$(BELAY_WORK_INDEX)".into()));
        // Every mount names a volume of the pod.
        let volumes: Vec<&str> = s["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        let containers = s["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .chain(
                s["template"]["spec"]["initContainers"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            );
        for c in containers {
            for vm in c["volumeMounts"].as_array().unwrap() {
                assert!(volumes.contains(&vm["name"].as_str().unwrap()), "{vm}");
            }
        }
        match engine {
            PodEngine::Dind { .. } => {
                // A native sidecar, privileged, which the worker reaches by
                // a socket on a shared emptyDir.
                let side = &s["template"]["spec"]["initContainers"][0];
                assert_eq!(side["restartPolicy"], "Always");
                assert_eq!(side["securityContext"]["privileged"], true);
                assert!(envs.iter().any(|e| e["name"] == "DOCKER_HOST"
                    && e["value"] == "unix:///run/belay-engine/docker.sock"));
            }
            PodEngine::NodeSocket { .. } => {
                // No sidecar, and nothing in the pod privileged.
                assert_eq!(s["template"]["spec"]["initContainers"], Value::Null);
                assert_eq!(worker["securityContext"], Value::Null);
                assert!(s["template"]["spec"]["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["hostPath"]["type"] == "Socket"));
            }
        }
        assert_eq!(s["template"]["spec"]["automountServiceAccountToken"], false);
    }
}

#[tokio::test]
async fn a_batch_with_a_failed_index_is_watched_to_its_end_and_cancelled() {
    let replay = Replay::from_file("tests/kubernetes/exchanges/batch-with-a-failed-index.json");
    let jobs = KubeJobs::new(replay.client("builds"), "builds");
    let job = job_manifest(&spec(dind()));
    jobs.submit(&job, ("belay.batch", "b1")).await.unwrap();
    let mut seen = Vec::new();
    let end = jobs
        .watch("belay-b1", |p| {
            seen.push((
                p.succeeded.iter().copied().collect::<Vec<_>>(),
                p.failed.iter().copied().collect::<Vec<_>>(),
                p.active,
            ))
        })
        .await
        .unwrap();
    // Each change once, across a closed watch, a bookmark and an expired
    // resource version (410), which is read afresh.
    assert_eq!(
        seen,
        vec![
            (vec![], vec![], 2),
            (vec![0], vec![], 2),
            (vec![0, 2], vec![1], 1),
            (vec![0, 2, 3], vec![1], 0),
        ]
    );
    assert_eq!(
        end.end,
        Some(JobEnd::Failed {
            reason: "FailedIndexes".into(),
            message: "Job has failed indexes".into()
        })
    );
    // The index's newest pod tells why it failed: the build (exit 1), not
    // the engine failure (exit 3) its first pod was retried for.
    let failures = jobs.index_failures("belay-b1").await.unwrap();
    assert_eq!(failures.keys().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(failures[&1].exit_code, Some(1));
    assert_eq!(failures[&1].pod, "belay-b1-1-m3n8v");
    assert!(failures[&1].message.contains("block 002-deps failed"));
    jobs.cancel("belay-b1").await.unwrap();
    assert_eq!(*replay.mismatches.lock().unwrap(), Vec::<String>::new());
    assert_eq!(replay.left(), 0);
    // What was submitted is the manifest, unchanged.
    let seen = replay.seen.lock().unwrap();
    assert_eq!(seen[0].2, serde_json::to_value(&job).unwrap());
}

#[tokio::test]
async fn a_submit_adopts_its_own_job_and_refuses_anothers() {
    let replay = Replay::from_file("tests/kubernetes/exchanges/submit-adopts-its-own-job.json");
    let jobs = KubeJobs::new(replay.client("builds"), "builds");
    let job = job_manifest(&spec(dind()));
    jobs.submit(&job, ("belay.batch", "b1")).await.unwrap();
    let foreign = jobs.submit(&job, ("belay.batch", "b1")).await.unwrap_err();
    let text = foreign.to_string();
    assert!(text.contains("not this batch's"), "{text}");
    assert!(text.contains("kubectl delete job belay-b1"), "{text}");
    let denied = jobs.submit(&job, ("belay.batch", "b1")).await.unwrap_err();
    assert_eq!(denied.error_code(), "BELAY-E306");
    let text = denied.to_string();
    assert!(text.contains("Forbidden (403)"), "{text}");
    assert!(text.contains("cannot create resource"), "{text}");
    assert_eq!(*replay.mismatches.lock().unwrap(), Vec::<String>::new());
    assert_eq!(replay.left(), 0);
}

#[tokio::test]
async fn a_watch_retries_a_server_error_rereads_on_410_and_ends_when_the_job_is_deleted_from_outside(
) {
    let replay =
        Replay::from_file("tests/kubernetes/exchanges/cancel-and-deleted-from-outside.json");
    let jobs = KubeJobs::new(replay.client("builds"), "builds");
    let err = jobs.watch("belay-b1", |_| {}).await.unwrap_err();
    assert!(
        err.to_string().contains("deleted from outside belay"),
        "{err}"
    );
    // Already gone: not an error; then a real delete.
    jobs.cancel("belay-b1").await.unwrap();
    jobs.cancel("belay-b1").await.unwrap();
    assert_eq!(*replay.mismatches.lock().unwrap(), Vec::<String>::new());
    assert_eq!(replay.left(), 0);
}
