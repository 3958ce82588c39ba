//! `belay env build-projects --executor kubernetes`: batches on Kubernetes.
//! An Indexed Job per batch ([`job`]), the client side that submits,
//! watches and cancels it ([`controller`]), and the batch glue that makes
//! the Job from the swarm submitter's batch and follows it ([`batch`]),
//! behind belay-env's [`belay_env::swarm::IndexedJobExecutor`].
//!
//! Its own crate, which only the binary links, so that nothing else waits
//! for kube-rs and `k8s-openapi` to compile.
//!
//! This backend has not run on a real cluster: it is tested against the
//! `k8s-openapi` schema and against API server exchanges written from the
//! API's documented responses (not recorded from a live server) only.

pub mod batch;
pub mod controller;
mod error;
pub mod job;

pub use batch::{KubeOptions, Submitted, MAX_COMPLETIONS};
pub use controller::{parse_indexes, IndexFailure, JobEnd, JobProgress, KubeJobs};
pub use error::{IndexListError, KubeError};
pub use job::{job_manifest, object_name, IndexedJob, PodEngine};
