//! The job queue builder (`belay jobs`): the builder seed done in belay,
//! for any set of repositories.
//!
//! Requests come by chat (XMPP), a drop directory, HTTP or the command
//! line; each becomes a job file in the queue ([`queue`]). A worker claims
//! it and runs it ([`exec`]): a fresh agent session in its own worktree per
//! repository, under an iteration limit, in a container with only the
//! worktrees writable. The agent cannot commit: its answer's commit block
//! ([`answer`]) is the only way to a commit, which belay makes on the host
//! with hooks off and pushes. A third party's request waits for the owner's
//! start approval, and a repository can ask for commit approval ([`gates`]).
//! The completion record and the on-commit hook ([`record`]) end a job.
//!
//! Built on the run layer: every job is a `RunHandle` (`belay runs` lists
//! it), agents run through `belay_agent::runner`, git through `belay_vcs`
//! (worktrees, stashes by SHA, the commit point, the per-repository lock).

pub mod answer;
pub mod chat;
pub mod config;
pub mod context;
mod error;
pub mod events;
pub mod exec;
pub mod front;
pub mod gates;
pub mod job;
pub mod notify;
pub mod prompt;
pub mod public;
pub mod queue;
pub mod record;
pub mod services;
pub mod worker;

pub use config::Config;
pub use error::JobsError;
pub use job::Job;
pub use queue::Queue;
pub use services::Services;
