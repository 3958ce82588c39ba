//! The dashboard's shared state: what every handler reads. A leaf: it
//! imports no handler and no server code, so that the handlers and the
//! server depend on it and not on each other.

use std::path::PathBuf;

use belay_record::{Redactor, Registry};

/// What the server was started with, shared by every handler.
pub(crate) struct App {
    pub registry: Registry,
    pub queues: Vec<PathBuf>,
    pub jobs_configs: Vec<PathBuf>,
    pub token: String,
    pub redactor: Redactor,
    /// A loopback server answers only `Host`s naming it on this port
    /// ([`belay_record::is_loopback_host`]); `None`: any.
    pub loopback_port: Option<u16>,
}
