//! Batches on Kubernetes: an Indexed Job per batch ([`job`]) and the client
//! side that submits, watches and cancels it ([`controller`]).
//!
//! This backend has not run on a real cluster: it is tested against the
//! `k8s-openapi` schema and against API server exchanges written from the
//! API's documented responses (not recorded from a live server) only.

pub mod controller;
pub mod job;

pub use controller::{parse_indexes, IndexFailure, JobEnd, JobProgress, KubeJobs};
pub use job::{job_manifest, object_name, IndexedJob, PodEngine};
