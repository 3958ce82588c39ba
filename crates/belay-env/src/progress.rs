//! What the builder reports while it works. The binary renders it (live lines
//! on a terminal, plain log lines otherwise); the engine never prints.

use std::time::Duration;

use belay_sandbox::{ExecObserver, StreamKind};

#[derive(Debug, Clone)]
pub enum BuildEvent {
    RunStarted {
        run_id: String,
        run_dir: String,
        resumed_from: Option<String>,
    },
    Phase {
        name: String,
        detail: String,
    },
    Plan {
        blocks: Vec<(String, String)>,
    },
    BlockStarted {
        id: String,
        title: String,
        index: usize,
        total: usize,
    },
    BlockFinished {
        id: String,
        ok: bool,
        /// The block did not run: its checkpoint came from the cache.
        cached: bool,
        duration: Duration,
        detail: String,
    },
    Finished {
        ok: bool,
        final_image: Option<String>,
        error: Option<String>,
        duration: Duration,
    },
}

pub trait BuildObserver: Send + Sync {
    fn event(&self, event: &BuildEvent);
    /// Redacted output of the command currently running for `block`.
    fn output(&self, block: &str, stream: StreamKind, bytes: &[u8]);
}

pub struct NoopBuildObserver;

impl BuildObserver for NoopBuildObserver {
    fn event(&self, _event: &BuildEvent) {}
    fn output(&self, _block: &str, _stream: StreamKind, _bytes: &[u8]) {}
}

/// Forwards one exec's output to the build observer under a block id.
pub(crate) struct BlockOutput<'a> {
    pub block: &'a str,
    pub observer: &'a dyn BuildObserver,
}

impl ExecObserver for BlockOutput<'_> {
    fn output(&self, stream: StreamKind, bytes: &[u8]) {
        self.observer.output(self.block, stream, bytes);
    }
}
