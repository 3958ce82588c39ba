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
    /// A command ran (a block, its validation, a repair or probe, the clean
    /// replay, an oracle command); the record is in `executions.jsonl`.
    Executed {
        block: String,
        phase: String,
        attempt: u32,
        exit_code: Option<i64>,
        timed_out: bool,
        duration: Duration,
    },
    /// A checkpoint image was made (or adopted from the cache).
    Checkpoint {
        block: String,
        image_ref: String,
        kind: String,
        cached: bool,
    },
    /// A repair was chosen for a failing block: the rule (or `llm`) and why.
    Repair {
        block: String,
        rule: String,
        hint: String,
        attempt: u32,
    },
    Finished {
        ok: bool,
        /// Stopped on request (SIGINT/SIGTERM): the same command resumes it.
        interrupted: bool,
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

/// Records a build's events in its run's event log (`events.jsonl`, the
/// envelope of `belay_record::events`) and its end in the registry, through
/// the run's [`belay_record::RunHandle`], and passes every event on to
/// `inner` (the terminal display).
pub struct Recorder<'a> {
    inner: &'a dyn BuildObserver,
    run: &'a belay_record::RunHandle,
}

impl<'a> Recorder<'a> {
    pub fn new(inner: &'a dyn BuildObserver, run: &'a belay_record::RunHandle) -> Self {
        Recorder { inner, run }
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
            BuildEvent::Executed {
                block,
                phase,
                attempt,
                exit_code,
                timed_out,
                duration,
            } => (
                // Each kind of command its own event kind.
                match phase.as_str() {
                    "validation" | "clean_replay_validation" => "validation",
                    "repair" | "repair_prep" | "probe" | "llm_probe" | "llm_repair" => "repair",
                    "oracle" => "oracle",
                    "clean_replay" => "clean_replay",
                    "docker_build" => "docker_build",
                    "container_preflight" => "preflight",
                    _ => "command",
                },
                Some(block.clone()),
                json!({"phase": phase, "attempt": attempt, "exit_code": exit_code, "timed_out": timed_out, "duration_s": duration.as_secs_f64()}),
            ),
            BuildEvent::Checkpoint {
                block,
                image_ref,
                kind,
                cached,
            } => (
                "checkpoint",
                Some(block.clone()),
                json!({"image_ref": image_ref, "kind": kind, "cached": cached}),
            ),
            BuildEvent::Repair {
                block,
                rule,
                hint,
                attempt,
            } => (
                "repair_chosen",
                Some(block.clone()),
                json!({"rule": rule, "hint": hint, "attempt": attempt}),
            ),
            BuildEvent::Finished {
                ok,
                interrupted,
                final_image,
                error,
                duration,
            } => (
                if *interrupted {
                    "run_interrupted"
                } else {
                    "run_end"
                },
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
        let (kind, step, data) = Self::typed(event);
        if let Err(e) = self
            .run
            .emit("engine", step.as_deref(), &Typed { kind, data: &data })
        {
            tracing::warn!("cannot record a build event: {e}");
        }
        if let BuildEvent::Finished {
            ok,
            interrupted,
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
            if *interrupted {
                self.run.interrupted(end);
            } else {
                self.run.finish(end);
            }
        }
        self.inner.event(event);
    }

    fn output(&self, block: &str, stream: StreamKind, bytes: &[u8]) {
        self.inner.output(block, stream, bytes);
    }
}
