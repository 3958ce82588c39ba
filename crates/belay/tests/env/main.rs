//! `belay env` end to end, against a real Docker engine, real git and real
//! package registries. Requires the engine to be running and the default base
//! image (`belay image bootstrap`) to be present: `.ci/run` sets both up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ablation;
mod batch;
mod builds;
mod cache;
mod classes;
mod cli;
mod common;
mod custom;
mod errors;
mod gc;
#[path = "../shared/git.rs"]
mod git_cli;
mod llm;
mod reaper;
mod registry;
mod repair;
#[path = "../shared/replay.rs"]
mod replay;
mod resume;
mod swarm;
