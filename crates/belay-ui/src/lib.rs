//! `belay ui`: a live web dashboard for every run of every mode.
//!
//! The page is never a second source of truth: it reads the registry
//! (`runs.jsonl`) and each run's own records (`events.jsonl`, `state.json`,
//! `logs/`, `commits/`) that `belay runs` reads, and tails those files, so a
//! run written by another process shows up live. Actions (approvals) call the
//! same functions as the command line.
//!
//! Security: the server binds loopback by default, every request needs the
//! random access token (a bearer header, or the cookie the tokened URL sets),
//! a POST from a foreign `Origin` is refused, and on loopback a foreign `Host`
//! is refused too (DNS rebinding). Every text it serves passes the redactor.

mod api;
mod approvals;
mod assets;
mod auth;
mod error;
mod files;
mod server;
mod state;
mod stream;

pub use assets::embedded_size;
pub use error::UiError;
pub use server::{serve, Server, UiOptions, DEFAULT_VIZ_PORT};
