//! The environment builder: analyse a repository, plan setup blocks, run them in
//! a container with a checkpoint image after each, and write scripts, a
//! manifest and a Dockerfile that rebuilds the result.

pub mod ablation;
pub mod analyze;
pub mod as_of;
pub mod base_suite;
pub mod batch;
pub mod block_exec;
pub mod build;
pub mod cache;
pub mod checkpoint_names;
pub mod debian_contents;
pub mod dockerfile;
mod error;
pub mod gc;
pub mod llm;
pub mod manifest;
pub mod module_dists;
pub mod oracle;
pub mod package_cache;
pub mod plan;
pub mod preflight;
pub mod progress;
pub mod registry_store;
pub mod repair;
pub mod rundir;
pub mod safety;
pub mod sandbox_image;
pub mod script;
mod shell;
pub mod swarm;

pub use error::{ClusterError, EnvError};

/// Where the repository lives inside build containers (a leaf of the crate:
/// the analysis and the plan both name it, and neither imports the other
/// for it).
pub const REPO_DIR: &str = belay_sandbox::layout::REPO;
/// Where block scripts are put inside build containers.
pub const SCRIPTS_DIR: &str = "/belay/scripts";
