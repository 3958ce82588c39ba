//! The pipeline loop (the agentic-dev-loop seed): a `pipeline.yaml` of agent,
//! command and action steps; verdicts route the run; every step runs in a
//! sandbox with its own policy; state is checkpointed after every transition;
//! one gated commit ends the run.

pub mod compat;
pub mod dryrun;
pub mod engine;
pub mod events;
pub mod schema;
pub mod state;
pub mod verdict;

pub use engine::{Engine, Outcome, PipelineError, RunOptions};
pub use schema::{load, parse, LoadError, Pipeline, Route, Step, StepKind};

#[cfg(test)]
mod fake_tests;
