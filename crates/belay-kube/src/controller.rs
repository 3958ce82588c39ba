//! Submitting, watching and cancelling the batch's Indexed Job through the
//! API server (kube-rs).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams, PropagationPolicy, WatchParams};
use kube::core::WatchEvent;

use crate::job::INDEX_ANNOTATION;
use crate::{IndexListError, KubeError};

fn kube_err(op: &'static str, e: kube::Error) -> KubeError {
    let message = match &e {
        kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
        other => other.to_string(),
    };
    KubeError { op, message }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// A refusal a retry will not change (403, 404, 422 …).
fn is_client_error(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429)
}

/// Watch errors in a row before the watch gives up.
const WATCH_RETRIES: u32 = 10;

fn backoff(n: u32) -> Duration {
    Duration::from_millis(200u64 << n.min(6))
}

/// Parse the Job status's index lists: `"1,3-5,7"`.
pub fn parse_indexes(text: &str) -> Result<BTreeSet<u32>, IndexListError> {
    let mut out = BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || IndexListError {
            text: text.to_string(),
            part: part.to_string(),
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let a: u32 = a.trim().parse().map_err(|_| bad())?;
                let b: u32 = b.trim().parse().map_err(|_| bad())?;
                if b < a || b - a > 1_000_000 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().map_err(|_| bad())?);
            }
        }
    }
    Ok(out)
}

/// How the Job ended, when it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    Complete,
    Failed { reason: String, message: String },
}

/// A Job's progress, from its status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobProgress {
    pub succeeded: BTreeSet<u32>,
    pub failed: BTreeSet<u32>,
    pub active: u32,
    pub end: Option<JobEnd>,
}

impl JobProgress {
    pub fn of(job: &Job) -> Result<Self, KubeError> {
        let bad = |e: IndexListError| KubeError {
            op: "read the Job status of",
            message: e.to_string(),
        };
        let Some(st) = &job.status else {
            return Ok(Self::default());
        };
        let succeeded =
            parse_indexes(st.completed_indexes.as_deref().unwrap_or("")).map_err(bad)?;
        let failed = parse_indexes(st.failed_indexes.as_deref().unwrap_or("")).map_err(bad)?;
        let mut end = None;
        for c in st.conditions.iter().flatten() {
            if c.status != "True" {
                continue;
            }
            match c.type_.as_str() {
                "Complete" => end = Some(JobEnd::Complete),
                "Failed" => {
                    end = Some(JobEnd::Failed {
                        reason: c.reason.clone().unwrap_or_default(),
                        message: c.message.clone().unwrap_or_default(),
                    })
                }
                _ => {}
            }
        }
        Ok(Self {
            succeeded,
            failed,
            active: st.active.unwrap_or(0).max(0) as u32,
            end,
        })
    }
}

/// Why an index's last pod ended, from the pods' statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexFailure {
    pub pod: String,
    pub exit_code: Option<i32>,
    pub reason: String,
    pub message: String,
}

/// The batch's Job in one namespace.
#[derive(Clone)]
pub struct KubeJobs {
    jobs: Api<Job>,
    pods: Api<Pod>,
    namespace: String,
}

impl KubeJobs {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            jobs: Api::namespaced(client.clone(), namespace),
            pods: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// From the kubeconfig (`KUBECONFIG`, `~/.kube/config`) or the pod's
    /// service account; the namespace is the context's unless given.
    pub async fn infer(namespace: Option<&str>) -> Result<Self, KubeError> {
        // The process's TLS provider (ring), as belay's other clients use.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = kube::Config::infer()
            .await
            .map_err(|e| KubeError {
                op: "find a cluster for",
                message: format!("{e}. Set KUBECONFIG or write ~/.kube/config (`kubectl config view` shows what belay would use)"),
            })?;
        let ns = namespace
            .map(str::to_string)
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).map_err(|e| kube_err("connect to", e))?;
        Ok(Self::new(client, &ns))
    }

    /// Create the Job. A Job of the same name that carries the same batch
    /// label is adopted (a resubmission after the submitter died); another
    /// is refused.
    pub async fn submit(&self, job: &Job, batch_label: (&str, &str)) -> Result<(), KubeError> {
        let name = job.metadata.name.clone().unwrap_or_default();
        match self.jobs.create(&PostParams::default(), job).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 409) => {
                let have = self
                    .jobs
                    .get(&name)
                    .await
                    .map_err(|e| kube_err("read", e))?;
                let ours = have
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(batch_label.0))
                    .is_some_and(|v| v == batch_label.1);
                if ours {
                    Ok(())
                } else {
                    Err(KubeError {
                        op: "create",
                        message: format!("a Job named {name} exists and is not this batch's; delete it (`kubectl delete job {name}`) or use another --run-id-prefix"),
                    })
                }
            }
            Err(e) => Err(kube_err("create", e)),
        }
    }

    pub async fn progress(&self, name: &str) -> Result<(JobProgress, String), KubeError> {
        let job = self.jobs.get(name).await.map_err(|e| kube_err("read", e))?;
        let rv = job.metadata.resource_version.clone().unwrap_or_default();
        Ok((JobProgress::of(&job)?, rv))
    }

    /// Follow the Job until it ends, calling `seen` with each new progress.
    /// The watch is resumed from the last resource version when the server
    /// closes it, and started over from a fresh read when that version has
    /// expired (410 Gone).
    pub async fn watch<F>(&self, name: &str, mut seen: F) -> Result<JobProgress, KubeError>
    where
        F: FnMut(&JobProgress),
    {
        let (mut last, mut rv) = self.progress(name).await?;
        seen(&last);
        // A transport error (a reset connection, an API server restart) is
        // retried with backoff from the last version; a run of them ends
        // the watch.
        let mut errors = 0u32;
        loop {
            if last.end.is_some() {
                return Ok(last);
            }
            let wp = WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(290);
            let mut stream = match self.jobs.watch(&wp, &rv).await {
                Ok(s) => s.boxed(),
                Err(e) if is_status(&e, 410) => {
                    let (now, fresh) = self.progress(name).await?;
                    rv = fresh;
                    if now != last {
                        seen(&now);
                        last = now;
                    }
                    continue;
                }
                Err(e) if errors < WATCH_RETRIES && !is_client_error(&e) => {
                    errors += 1;
                    tracing::warn!("watching Job {name} ({errors}/{WATCH_RETRIES}): {e}");
                    tokio::time::sleep(backoff(errors)).await;
                    continue;
                }
                Err(e) => return Err(kube_err("watch", e)),
            };
            let mut expired = false;
            loop {
                let ev = match stream.try_next().await {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(e) if errors < WATCH_RETRIES => {
                        errors += 1;
                        tracing::warn!("watching Job {name} ({errors}/{WATCH_RETRIES}): {e}");
                        tokio::time::sleep(backoff(errors)).await;
                        break;
                    }
                    Err(e) => return Err(kube_err("watch", e)),
                };
                errors = 0;
                match ev {
                    WatchEvent::Added(job) | WatchEvent::Modified(job) => {
                        rv = job.metadata.resource_version.clone().unwrap_or(rv);
                        let now = JobProgress::of(&job)?;
                        if now != last {
                            seen(&now);
                            last = now;
                        }
                        if last.end.is_some() {
                            return Ok(last);
                        }
                    }
                    WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                    WatchEvent::Deleted(_) => {
                        return Err(KubeError {
                            op: "watch",
                            message: format!(
                                "the Job {name} was deleted from outside belay before it ended"
                            ),
                        })
                    }
                    WatchEvent::Error(e) if e.code == 410 => {
                        expired = true;
                        break;
                    }
                    WatchEvent::Error(e) => {
                        return Err(KubeError {
                            op: "watch",
                            message: format!("{} ({}): {}", e.reason, e.code, e.message),
                        })
                    }
                }
            }
            if expired {
                let (now, fresh) = self.progress(name).await?;
                rv = fresh;
                if now != last {
                    seen(&now);
                    last = now;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// The last failure of each index that has one, from the Job's pods.
    pub async fn index_failures(
        &self,
        name: &str,
    ) -> Result<BTreeMap<u32, IndexFailure>, KubeError> {
        let pods = self
            .pods
            .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")))
            .await
            .map_err(|e| kube_err("list the pods of", e))?;
        let mut out: BTreeMap<u32, (String, IndexFailure)> = BTreeMap::new();
        for pod in pods.items {
            let Some(index) = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(INDEX_ANNOTATION))
                .and_then(|i| i.parse::<u32>().ok())
            else {
                continue;
            };
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            let Some(status) = &pod.status else { continue };
            let worker = status
                .container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == "worker");
            let terminated = worker
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.terminated.as_ref());
            let failure = match terminated {
                Some(t) if t.exit_code != 0 => IndexFailure {
                    pod: pod_name,
                    exit_code: Some(t.exit_code),
                    reason: t.reason.clone().unwrap_or_default(),
                    message: t.message.clone().unwrap_or_default(),
                },
                Some(_) => continue,
                None if status.phase.as_deref() == Some("Failed") => IndexFailure {
                    pod: pod_name,
                    exit_code: None,
                    reason: status.reason.clone().unwrap_or_default(),
                    message: status.message.clone().unwrap_or_default(),
                },
                None => continue,
            };
            // The newest pod of the index tells its last failure.
            let created = pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            match out.get(&index) {
                Some((seen, _)) if *seen >= created => {}
                _ => {
                    out.insert(index, (created, failure));
                }
            }
        }
        Ok(out.into_iter().map(|(i, (_, f))| (i, f)).collect())
    }

    /// Delete the Job and, in the background, its pods. A Job already gone
    /// is not an error.
    pub async fn cancel(&self, name: &str) -> Result<(), KubeError> {
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        match self.jobs.delete(name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(kube_err("delete", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn index_lists_parse_ranges_and_refuse_junk() {
        let got = parse_indexes("0,2-4, 7").unwrap();
        assert_eq!(got.into_iter().collect::<Vec<_>>(), vec![0, 2, 3, 4, 7]);
        assert!(parse_indexes("").unwrap().is_empty());
        assert!(parse_indexes("3-1").is_err());
        assert!(parse_indexes("a").is_err());
        assert!(parse_indexes("1-").is_err());
    }

    proptest! {
        #[test]
        fn index_lists_round_trip(set in proptest::collection::btree_set(0u32..200, 0..40)) {
            // Write the set the way the API server does: ranges of runs.
            let v: Vec<u32> = set.iter().copied().collect();
            let mut parts = Vec::new();
            let mut i = 0;
            while i < v.len() {
                let mut j = i;
                while j + 1 < v.len() && v[j + 1] == v[j] + 1 { j += 1; }
                parts.push(if i == j { v[i].to_string() } else { format!("{}-{}", v[i], v[j]) });
                i = j + 1;
            }
            prop_assert_eq!(parse_indexes(&parts.join(",")).unwrap(), set);
        }

        #[test]
        fn index_lists_never_panic(s in "[0-9,\\- a]{0,30}") {
            let _ = parse_indexes(&s);
        }
    }
}
