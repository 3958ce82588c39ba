//! `belay plan`: the checkpoint plan loop.
//!
//! A plan file (`plan_checkpoints.json`, FORMATS.md §5) lists checkpoints.
//! A developer agent builds each one, belay runs the project's own build,
//! test and lint commands on it in a sandbox, and a reviewer agent approves it
//! or sends it back with notes. Every step is a commit on a feature branch.
//!
//! Unlike the peer tool, the authoritative state (statuses, attempts, who
//! decided) is belay's run state, never the file the agents edit: agents only
//! *propose* changes through the plan file, and [`gate::judge`] applies the
//! legal ones (the developer may mark its checkpoint built) and reverts
//! everything else. The reviewer's verdict is never read from a file: the
//! code it reviews may run with its rights, so the verdict is the last line of
//! its own answer ([`verdict`]), and the plan file is read-only for it.
//!
//! * [`schema`]: parse and validate a plan file, errors at `file:line:col`;
//! * [`init`]: turn an agent's answer into a plan file (`belay plan init`);
//! * [`gate`]: what an agent changed in the plan file, and what of it stands;
//! * [`verdict`]: the reviewer's verdict and notes, from its final message;
//! * [`state`]: the run state, saved atomically after every transition;
//! * [`prompts`]: the developer, reviewer and revision prompts;
//! * agent runs go through [`belay_agent::runner`] (a container of their own, or the host);
//! * [`audit`]: the audit levels (`off`, `redacted`, `full`);
//! * [`engine`]: the loop.

pub mod audit;
pub mod engine;
mod error;
pub mod events;
pub mod gate;
pub mod generate;
pub mod init;
mod locate;
pub mod prompts;
pub mod schema;
pub mod state;
pub mod verdict;

pub use error::PlanError;

/// `s` cut to at most `max` bytes, at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}
