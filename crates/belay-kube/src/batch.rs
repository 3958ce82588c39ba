//! `belay env build-projects --executor kubernetes`: the batch as an Indexed
//! Job, index `i` building work item `i` with `belay env worker --index i`.
//!
//! The submitter, the work spec, the claims and the results are the swarm
//! executor's ([`belay_env::swarm`]); this module makes the Job and follows
//! it, as belay-env's [`IndexedJobExecutor`].
//!
//! The work dir (the projects dir: spec, claims, results, state, caches) is
//! a ReadWriteMany claim mounted in every pod at the projects dir's own path,
//! and the submitting machine must see the same storage there (NFS).
//!
//! Not run on a real cluster: the manifest and the controller are tested
//! against the `k8s-openapi` schema and replayed API exchanges only.

use std::collections::BTreeMap;
use std::path::Path;

use belay_env::swarm::{IndexedBatch, IndexedJobExecutor, IndexedJobRun};
use belay_env::EnvError;

use crate::{
    job_manifest, object_name, IndexedJob, JobEnd, JobProgress, KubeError, KubeJobs, PodEngine,
};

/// The most completions an Indexed Job with `backoffLimitPerIndex` may have.
pub const MAX_COMPLETIONS: u32 = 100_000;

/// What `--executor kubernetes` is given.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// The namespace (default: the kubeconfig context's).
    pub namespace: Option<String>,
    pub engine: PodEngine,
    /// The ReadWriteMany PersistentVolumeClaim that holds the projects dir.
    pub work_claim: String,
    /// A `kubernetes.io/dockerconfigjson` secret to pull the worker image.
    pub pull_secret: Option<String>,
    pub service_account: Option<String>,
    /// Retries of one project's pod for infrastructure failures.
    pub retries: u32,
}

/// The Job, and its progress as a background watch sees it.
pub struct Submitted {
    jobs: KubeJobs,
    name: String,
    progress: tokio::sync::watch::Receiver<Option<JobProgress>>,
    completions: usize,
    watcher: tokio::task::JoinHandle<Result<JobProgress, KubeError>>,
}

fn under(p: &Path, root: &Path, what: &str) -> Result<(), EnvError> {
    if p.starts_with(root) {
        Ok(())
    } else {
        Err(EnvError::Usage(format!(
            "--executor kubernetes: {what} {} must be under the projects dir {}, which is the Job's volume (--k8s-work-claim); pass --state-dir under it, or leave it out",
            p.display(),
            root.display()
        )))
    }
}

/// The Job's manifest for a batch.
pub fn manifest(
    k: &KubeOptions,
    b: &IndexedBatch<'_>,
    namespace: &str,
) -> Result<k8s_openapi::api::batch::v1::Job, EnvError> {
    under(b.state_dir, b.projects_dir, "the state dir")?;
    under(b.spec_path, b.projects_dir, "the work spec")?;
    let root = b.projects_dir.display().to_string();
    // The API server refuses more completions with backoffLimitPerIndex.
    let completions = u32::try_from(b.completions)
        .ok()
        .filter(|c| *c <= MAX_COMPLETIONS)
        .ok_or_else(|| {
            EnvError::Usage(format!(
                "--executor kubernetes: {} projects are more than one Job may have ({MAX_COMPLETIONS}); split the projects file (--start, --limit)",
                b.completions
            ))
        })?;
    Ok(job_manifest(&IndexedJob {
        name: object_name(b.name),
        namespace: namespace.to_string(),
        image: b.image.to_string(),
        args: vec![
            "env".into(),
            "worker".into(),
            "--spec".into(),
            b.spec_path.display().to_string(),
            "--index".into(),
            format!("$({})", crate::job::INDEX_ENV),
        ],
        env: vec![
            ("BELAY_CACHE_DIR".into(), format!("{root}/.belay-cache")),
            ("BELAY_STATE_HOME".into(), format!("{root}/.belay-home")),
        ],
        labels: b.labels.clone(),
        completions,
        parallelism: b.parallelism.min(completions as usize).max(1) as u32,
        backoff_limit_per_index: k.retries,
        engine: k.engine.clone(),
        work_claim: k.work_claim.clone(),
        work_mount: root,
        pull_secret: k.pull_secret.clone(),
        service_account: k.service_account.clone(),
        ttl_after_finished_secs: 7 * 86400,
    }))
}

/// Create the batch's Job and start following it.
pub async fn submit(k: &KubeOptions, b: IndexedBatch<'_>) -> Result<Submitted, EnvError> {
    let jobs = KubeJobs::infer(k.namespace.as_deref()).await?;
    let job = manifest(k, &b, jobs.namespace())?;
    let name = job.metadata.name.clone().unwrap_or_default();
    jobs.submit(&job, (belay_env::swarm::BATCH_LABEL, b.batch))
        .await?;
    Ok(follow(jobs, name, b.completions))
}

/// Follow a submitted Job in the background.
pub fn follow(jobs: KubeJobs, name: String, completions: usize) -> Submitted {
    let (tx, progress) = tokio::sync::watch::channel(None);
    let watcher = {
        let jobs = jobs.clone();
        let name = name.clone();
        tokio::spawn(async move {
            jobs.watch(&name, |p| {
                let _ = tx.send(Some(p.clone()));
            })
            .await
        })
    };
    Submitted {
        jobs,
        name,
        progress,
        completions,
        watcher,
    }
}

#[async_trait::async_trait]
impl IndexedJobExecutor for KubeOptions {
    fn flag(&self) -> &'static str {
        "--executor kubernetes"
    }

    async fn submit(&self, batch: IndexedBatch<'_>) -> Result<Box<dyn IndexedJobRun>, EnvError> {
        Ok(Box::new(submit(self, batch).await?))
    }
}

#[async_trait::async_trait]
impl IndexedJobRun for Submitted {
    /// `None` while the Job runs; once it has ended, why each failed index
    /// failed. A watch that failed is the batch's error.
    async fn ended(&mut self) -> Result<Option<BTreeMap<usize, String>>, EnvError> {
        let done = self
            .progress
            .borrow()
            .as_ref()
            .is_some_and(|p| p.end.is_some());
        if !done {
            if !self.watcher.is_finished() {
                return Ok(None);
            }
            // The watch ends only with the Job, or with an error.
            let out = (&mut self.watcher).await.map_err(|e| KubeError {
                op: "watch",
                message: format!("the watch stopped: {e}"),
            })?;
            out?;
        }
        let end = self.progress.borrow().as_ref().and_then(|p| p.end.clone());
        let default = match end {
            Some(JobEnd::Failed { reason, message }) => {
                format!("the Job failed ({reason}: {message})")
            }
            _ => "the Job ended".to_string(),
        };
        let mut why: BTreeMap<usize, String> = (0..self.completions)
            .map(|i| (i, default.clone()))
            .collect();
        for (i, f) in self.jobs.index_failures(&self.name).await? {
            let code = f
                .exit_code
                .map(|c| format!("exited {c}"))
                .unwrap_or_else(|| "failed".into());
            let detail = [f.reason, f.message]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(": ");
            why.insert(i as usize, format!("pod {} {code} ({detail})", f.pod));
        }
        Ok(Some(why))
    }

    async fn cancel(&self) -> Result<(), EnvError> {
        self.watcher.abort();
        Ok(self.jobs.cancel(&self.name).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> KubeOptions {
        KubeOptions {
            namespace: None,
            engine: PodEngine::NodeSocket {
                path: "/var/run/docker.sock".into(),
            },
            work_claim: "belay-work".into(),
            pull_secret: None,
            service_account: None,
            retries: 2,
        }
    }

    fn batch<'a>(spec: &'a Path, state: &'a Path) -> IndexedBatch<'a> {
        IndexedBatch {
            name: "belay-Batch_1764700000000",
            image: "127.0.0.1:5000/belay-worker:0.1.0-abc@sha256:00",
            spec_path: spec,
            projects_dir: Path::new("/srv/projects"),
            state_dir: state,
            labels: BTreeMap::new(),
            batch: "batch-1764700000000",
            completions: 3,
            parallelism: 8,
        }
    }

    #[test]
    fn the_job_builds_each_index_from_the_shared_projects_dir() {
        let spec = Path::new("/srv/projects/.belay-swarm/b/spec.json");
        let state = Path::new("/srv/projects/.belay-state");
        let job = manifest(&opts(), &batch(spec, state), "builds").unwrap();
        let v = serde_json::to_value(&job).unwrap();
        // A valid object name, parallelism no more than the projects.
        assert_eq!(v["metadata"]["name"], "belay-batch-1764700000000");
        assert_eq!(v["spec"]["parallelism"], 3);
        assert_eq!(v["spec"]["completions"], 3);
        let w = &v["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<&str> = w["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "env",
                "worker",
                "--spec",
                "/srv/projects/.belay-swarm/b/spec.json",
                "--index",
                "$(BELAY_WORK_INDEX)"
            ]
        );
        assert_eq!(w["volumeMounts"][0]["mountPath"], "/srv/projects");
        assert!(w["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "BELAY_CACHE_DIR" && e["value"] == "/srv/projects/.belay-cache"));
    }

    #[test]
    fn more_projects_than_a_job_may_have_are_refused() {
        let spec = Path::new("/srv/projects/.belay-swarm/b/spec.json");
        let state = Path::new("/srv/projects/.belay-state");
        let mut b = batch(spec, state);
        b.completions = 100_001;
        let err = manifest(&opts(), &b, "builds").unwrap_err().to_string();
        assert!(err.contains("100000"), "{err}");
    }

    #[test]
    fn a_state_dir_off_the_jobs_volume_is_refused() {
        let spec = Path::new("/srv/projects/.belay-swarm/b/spec.json");
        let err = manifest(&opts(), &batch(spec, Path::new("/var/tmp/state")), "builds")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/var/tmp/state"), "{err}");
        assert!(err.contains("--k8s-work-claim"), "{err}");
    }
}
