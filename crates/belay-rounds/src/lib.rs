//! The round supervisor (`belay rounds`): cli-agent-runner's loop, on
//! belay's run layer.
//!
//! * [`config`]: `agent-runner.toml` as the peer writes it, checked to the line;
//! * [`battery`]: the startup checks of `doctor` and of every round;
//! * [`supervisor::Supervisor`]: an open project (its run, repository,
//!   engine, endpoint and lifeline);
//! * [`round`]: one round — lock, context, the agent under its budget,
//!   the stash by SHA after any exit, the status;
//! * [`serve`]: the loop with its schedule, pauses, breakers and signals;
//! * [`monitor`]: the 14 detectors, inside serve or on their own;
//! * [`trusted`]: belay's trusted copies of the config and the prompt files
//!   an agent can write, recovery after a killed round, and every read of a
//!   work-tree file through `belay_sandbox::hostfs`;
//! * [`units`]: systemd units; [`init`]: the scaffold; [`report`]: status.

pub mod battery;
pub mod config;
pub mod detect;
mod error;
pub mod events;
pub mod exit;
pub mod init;
pub mod monitor;
pub mod prompt;
pub mod report;
pub mod round;
pub mod schedule;
pub mod serve;
pub mod state;
pub mod supervisor;
pub mod trusted;
pub mod units;

pub use config::Config;
pub use error::RoundsError;
pub use supervisor::Supervisor;
