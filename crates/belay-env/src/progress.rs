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

    /// The event as the envelope records it: its kind, its step (a block),
    /// and its typed data.
    fn typed(event: &BuildEvent) -> (Option<&str>, EnvEvent<'_>) {
        use EnvEvent as E;
        match event {
            BuildEvent::RunStarted {
                run_id,
                run_dir,
                resumed_from,
            } => {
                let d = RunStart {
                    run_id,
                    run_dir,
                    resumed_from: resumed_from.as_deref(),
                };
                (
                    None,
                    if resumed_from.is_some() {
                        E::RunResumed(d)
                    } else {
                        E::RunStarted(d)
                    },
                )
            }
            BuildEvent::Phase { name, detail } => (
                None,
                E::Phase {
                    phase: name,
                    detail,
                },
            ),
            BuildEvent::Plan { blocks } => (
                None,
                E::Plan {
                    blocks: blocks
                        .iter()
                        .map(|(id, title)| PlanBlock { id, title })
                        .collect(),
                },
            ),
            BuildEvent::BlockStarted {
                id,
                title,
                index,
                total,
            } => (
                Some(id),
                E::BlockStarted {
                    title,
                    index: *index,
                    total: *total,
                },
            ),
            BuildEvent::BlockFinished {
                id,
                ok,
                cached,
                duration,
                detail,
            } => {
                let d = BlockEnd {
                    ok: *ok,
                    cached: *cached,
                    duration_s: duration.as_secs_f64(),
                    detail,
                };
                (
                    Some(id),
                    if *cached {
                        E::CacheHit(d)
                    } else {
                        E::BlockFinished(d)
                    },
                )
            }
            BuildEvent::Executed {
                block,
                phase,
                attempt,
                exit_code,
                timed_out,
                duration,
            } => {
                let d = Exec {
                    phase,
                    attempt: *attempt,
                    exit_code: *exit_code,
                    timed_out: *timed_out,
                    duration_s: duration.as_secs_f64(),
                };
                // Each kind of command its own event kind.
                let e = match phase.as_str() {
                    "validation" | "clean_replay_validation" => E::Validation(d),
                    "repair" | "repair_prep" | "probe" | "llm_probe" | "llm_repair" => E::Repair(d),
                    "oracle" => E::Oracle(d),
                    "clean_replay" => E::CleanReplay(d),
                    "docker_build" => E::DockerBuild(d),
                    "container_preflight" => E::Preflight(d),
                    _ => E::Command(d),
                };
                (Some(block), e)
            }
            BuildEvent::Checkpoint {
                block,
                image_ref,
                kind,
                cached,
            } => (
                Some(block),
                E::Checkpoint {
                    image_ref,
                    kind,
                    cached: *cached,
                },
            ),
            BuildEvent::Repair {
                block,
                rule,
                hint,
                attempt,
            } => (
                Some(block),
                E::RepairChosen {
                    rule,
                    hint,
                    attempt: *attempt,
                },
            ),
            BuildEvent::Finished {
                ok,
                interrupted,
                final_image,
                error,
                duration,
            } => {
                let d = RunEnd {
                    ok: *ok,
                    final_image: final_image.as_deref(),
                    error: error.as_deref(),
                    duration_s: duration.as_secs_f64(),
                };
                (
                    None,
                    if *interrupted {
                        E::RunInterrupted(d)
                    } else {
                        E::RunEnd(d)
                    },
                )
            }
        }
    }
}

/// The env builder's events in the shared envelope (`kind`, `data`): typed,
/// as the other engines' are.
#[derive(serde::Serialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
enum EnvEvent<'a> {
    RunStarted(RunStart<'a>),
    RunResumed(RunStart<'a>),
    Phase {
        phase: &'a str,
        detail: &'a str,
    },
    Plan {
        blocks: Vec<PlanBlock<'a>>,
    },
    BlockStarted {
        title: &'a str,
        index: usize,
        total: usize,
    },
    BlockFinished(BlockEnd<'a>),
    CacheHit(BlockEnd<'a>),
    Validation(Exec<'a>),
    Repair(Exec<'a>),
    Oracle(Exec<'a>),
    CleanReplay(Exec<'a>),
    DockerBuild(Exec<'a>),
    Preflight(Exec<'a>),
    Command(Exec<'a>),
    Checkpoint {
        image_ref: &'a str,
        kind: &'a str,
        cached: bool,
    },
    RepairChosen {
        rule: &'a str,
        hint: &'a str,
        attempt: u32,
    },
    RunEnd(RunEnd<'a>),
    RunInterrupted(RunEnd<'a>),
}

#[derive(serde::Serialize)]
struct RunStart<'a> {
    run_id: &'a str,
    run_dir: &'a str,
    resumed_from: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct PlanBlock<'a> {
    id: &'a str,
    title: &'a str,
}

#[derive(serde::Serialize)]
struct BlockEnd<'a> {
    ok: bool,
    cached: bool,
    duration_s: f64,
    detail: &'a str,
}

#[derive(serde::Serialize)]
struct Exec<'a> {
    phase: &'a str,
    attempt: u32,
    exit_code: Option<i64>,
    timed_out: bool,
    duration_s: f64,
}

#[derive(serde::Serialize)]
struct RunEnd<'a> {
    ok: bool,
    final_image: Option<&'a str>,
    error: Option<&'a str>,
    duration_s: f64,
}

impl BuildObserver for Recorder<'_> {
    fn event(&self, event: &BuildEvent) {
        let (step, typed) = Self::typed(event);
        if let Err(e) = self.run.emit("engine", step, &typed) {
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
