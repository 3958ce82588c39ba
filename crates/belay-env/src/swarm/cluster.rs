//! The seam for a cluster outside this crate that runs a batch as an indexed
//! job, index `i` building work item `i` with `belay env worker --index i`
//! (`--executor kubernetes`, in the belay-kube crate, which only the binary
//! links). The submitter, the work spec, the claims and the results stay
//! here ([`super::build_projects`]); the executor makes the job and follows it.

use std::collections::BTreeMap;
use std::path::Path;

use crate::EnvError;

/// The batch the submitter made, for the executor's job.
pub struct IndexedBatch<'a> {
    /// The job's name (`belay-<batch>`, at most 63 characters).
    pub name: &'a str,
    /// The worker image, pinned by digest.
    pub image: &'a str,
    pub spec_path: &'a Path,
    pub projects_dir: &'a Path,
    pub state_dir: &'a Path,
    pub labels: BTreeMap<String, String>,
    /// The batch id, the value of [`super::BATCH_LABEL`].
    pub batch: &'a str,
    pub completions: usize,
    pub parallelism: usize,
}

/// A cluster that runs a batch as an indexed job.
#[async_trait::async_trait]
pub trait IndexedJobExecutor: Send + Sync {
    /// The flag that chose it, for messages: `--executor kubernetes`.
    fn flag(&self) -> &'static str;

    /// Create the batch's job and start following it.
    async fn submit(&self, batch: IndexedBatch<'_>) -> Result<Box<dyn IndexedJobRun>, EnvError>;
}

/// A submitted indexed job, as the submitter's watch loop sees it.
#[async_trait::async_trait]
pub trait IndexedJobRun: Send + Sync {
    /// `None` while the job runs; once it has ended, a reason for each index
    /// (its own failure where it had one), for the items that have no result.
    /// A watch that failed is the batch's error.
    async fn ended(&mut self) -> Result<Option<BTreeMap<usize, String>>, EnvError>;

    /// Delete the job and its pods (Ctrl-C, or a watch that failed).
    async fn cancel(&self) -> Result<(), EnvError>;
}
