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

/// Records a build's events in its run directory (`events.jsonl`, the
/// envelope of `belay_record::events`) and the run in the user's registry,
/// and passes every event on to `inner` (the terminal display).
pub struct Recorder<'a> {
    inner: &'a dyn BuildObserver,
    redactor: belay_record::Redactor,
    registry: belay_record::Registry,
    sink: std::sync::Mutex<Option<belay_record::EventSink>>,
}

impl<'a> Recorder<'a> {
    pub fn new(inner: &'a dyn BuildObserver, redactor: belay_record::Redactor) -> Self {
        Recorder {
            inner,
            redactor,
            registry: belay_record::Registry::default_location(),
            sink: std::sync::Mutex::new(None),
        }
    }

    /// The event's kind and data, for the envelope.
    fn typed(event: &BuildEvent) -> (&'static str, Option<String>, serde_json::Value) {
        use serde_json::json;
        match event {
            BuildEvent::RunStarted {
                run_id,
                run_dir,
                resumed_from,
            } => (
                if resumed_from.is_some() {
                    "run_resumed"
                } else {
                    "run_started"
                },
                None,
                json!({"run_id": run_id, "run_dir": run_dir, "resumed_from": resumed_from}),
            ),
            BuildEvent::Phase { name, detail } => {
                ("phase", None, json!({"phase": name, "detail": detail}))
            }
            BuildEvent::Plan { blocks } => (
                "plan",
                None,
                json!({"blocks": blocks.iter().map(|(id, t)| json!({"id": id, "title": t})).collect::<Vec<_>>()}),
            ),
            BuildEvent::BlockStarted {
                id,
                title,
                index,
                total,
            } => (
                "block_started",
                Some(id.clone()),
                json!({"title": title, "index": index, "total": total}),
            ),
            BuildEvent::BlockFinished {
                id,
                ok,
                cached,
                duration,
                detail,
            } => (
                if *cached {
                    "cache_hit"
                } else {
                    "block_finished"
                },
                Some(id.clone()),
                json!({"ok": ok, "cached": cached, "duration_s": duration.as_secs_f64(), "detail": detail}),
            ),
            BuildEvent::Finished {
                ok,
                final_image,
                error,
                duration,
            } => (
                "run_end",
                None,
                json!({"ok": ok, "final_image": final_image, "error": error, "duration_s": duration.as_secs_f64()}),
            ),
        }
    }
}

#[derive(serde::Serialize)]
struct Typed<'a> {
    kind: &'a str,
    data: &'a serde_json::Value,
}

impl BuildObserver for Recorder<'_> {
    fn event(&self, event: &BuildEvent) {
        if let BuildEvent::RunStarted {
            run_id, run_dir, ..
        } = event
        {
            let dir = std::path::Path::new(run_dir);
            match belay_record::EventSink::open(
                &dir.join("events.jsonl"),
                run_id,
                belay_record::Mode::Env,
                self.redactor.clone(),
            ) {
                Ok(s) => {
                    if let Ok(mut g) = self.sink.lock() {
                        *g = Some(s);
                    }
                }
                Err(e) => tracing::warn!("no events.jsonl for this build: {e}"),
            }
            if let Err(e) = self
                .registry
                .started(run_id, belay_record::Mode::Env, dir, None)
            {
                tracing::warn!("the build is not in the registry: {e}");
            }
        }
        let (kind, step, data) = Self::typed(event);
        let sink = self.sink.lock().ok().and_then(|g| g.clone());
        if let Some(sink) = &sink {
            if let Err(e) = sink.emit("engine", step.as_deref(), &Typed { kind, data: &data }) {
                tracing::warn!("cannot record a build event: {e}");
            }
            if let BuildEvent::Finished {
                ok,
                error,
                duration,
                ..
            } = event
            {
                let end = belay_record::RunEnd {
                    ok: *ok,
                    duration_s: duration.as_secs_f64(),
                    tokens: 0,
                    cost_usd: 0.0,
                    summary: error.clone(),
                };
                if let Err(e) = self.registry.ended(sink.run_id(), end) {
                    tracing::warn!("the build's end is not in the registry: {e}");
                }
            }
        }
        self.inner.event(event);
    }

    fn output(&self, block: &str, stream: StreamKind, bytes: &[u8]) {
        self.inner.output(block, stream, bytes);
    }
}
