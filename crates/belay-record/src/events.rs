//! One event envelope for every mode, and the sink that writes it.
//!
//! Every event belay records is one JSON line of `events.jsonl`:
//!
//! ```json
//! {"v":1,"seq":7,"at":"2026-12-01T10:00:00.123Z","run_id":"…","mode":"pipeline",
//!  "source":"engine","kind":"step_end","step":"test","data":{…}}
//! ```
//!
//! `seq` counts from 1 within a run (a resumed run continues it), so a reader
//! that has seen `seq` N resumes after it and loses nothing. `kind` names the
//! event; each engine's kinds are an enum of its own, serialised with
//! `#[serde(tag = "kind", content = "data")]` into these two fields. `source`
//! says who produced it (`engine`, `agent`, `sandbox`, …).
//!
//! The [`EventSink`] appends each event as it happens (redacted, one `write`
//! per line). Readers (`belay runs events --follow`, the dashboard) tail
//! the file: one stream for every process.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::{JsonlAppender, RecordError, Redactor};

/// The envelope's version.
pub const ENVELOPE_VERSION: u32 = 1;

/// Which engine a run belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Env,
    Pipeline,
    Agent,
    Plan,
    Rounds,
    Jobs,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Env => "env",
            Mode::Pipeline => "pipeline",
            Mode::Agent => "agent",
            Mode::Plan => "plan",
            Mode::Rounds => "rounds",
            Mode::Jobs => "jobs",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = RecordError;
    fn from_str(s: &str) -> Result<Self, RecordError> {
        Ok(match s {
            "env" => Mode::Env,
            "pipeline" => Mode::Pipeline,
            "agent" => Mode::Agent,
            "plan" => Mode::Plan,
            "rounds" => Mode::Rounds,
            "jobs" => Mode::Jobs,
            o => {
                return Err(RecordError::UnknownMode {
                    value: o.to_string(),
                })
            }
        })
    }
}

/// One recorded event, as read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub v: u32,
    pub seq: u64,
    pub at: String,
    pub run_id: String,
    pub mode: Mode,
    pub source: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default)]
    pub data: serde_json::Value,
}

#[derive(Serialize)]
struct Out<'a, E: Serialize> {
    v: u32,
    seq: u64,
    at: String,
    run_id: &'a str,
    mode: Mode,
    source: &'a str,
    #[serde(flatten)]
    event: &'a E,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a str>,
}

struct Inner {
    log: JsonlAppender,
    seq: u64,
    /// Shared by every clone, so that secrets added while the run goes on
    /// ([`EventSink::add_secrets`]) are scrubbed by all of them.
    redactor: Redactor,
}

/// Appends events to a run's `events.jsonl`. Cheap to clone; every clone
/// writes the same log in order.
#[derive(Clone)]
pub struct EventSink {
    run_id: Arc<str>,
    mode: Mode,
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink")
            .field("run_id", &self.run_id)
            .field("mode", &self.mode)
            .finish()
    }
}

/// The last `seq` in an existing log (0 for none), read from its tail.
fn last_seq(path: &Path) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return 0;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut back = 64 * 1024u64;
    loop {
        let start = len.saturating_sub(back);
        if f.seek(SeekFrom::Start(start)).is_err() {
            return 0;
        }
        let mut buf = Vec::new();
        if f.read_to_end(&mut buf).is_err() {
            return 0;
        }
        let text = String::from_utf8_lossy(&buf);
        let found = text
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|v| v.get("seq").and_then(|s| s.as_u64()));
        if let Some(s) = found {
            return s;
        }
        if start == 0 {
            return 0;
        }
        back *= 4;
    }
}

impl EventSink {
    /// Open (or continue) the log at `path`.
    pub fn open(
        path: &Path,
        run_id: &str,
        mode: Mode,
        redactor: Redactor,
    ) -> Result<EventSink, RecordError> {
        let seq = last_seq(path);
        let log = JsonlAppender::open(path)?;
        Ok(EventSink {
            run_id: run_id.into(),
            mode,
            inner: Arc::new(Mutex::new(Inner { log, seq, redactor })),
        })
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Record one event. `event` serialises to `{"kind": …, "data": …}`.
    pub fn emit<E: Serialize>(
        &self,
        source: &str,
        step: Option<&str>,
        event: &E,
    ) -> Result<u64, RecordError> {
        self.write(source, step, event).map(|(seq, _)| seq)
    }

    /// Record one event, then tell `obs` the same typed value: the envelope
    /// as written ([`Observer::recorded`]), then the event
    /// ([`Observer::event`]). An event that cannot be written is still told
    /// (without an envelope), and the write's error returned.
    pub fn emit_to<E: Serialize>(
        &self,
        source: &str,
        step: Option<&str>,
        event: &E,
        obs: &dyn Observer<E>,
    ) -> Result<u64, RecordError> {
        let written = self.write(source, step, event);
        if let Ok((_, line)) = &written {
            obs.recorded(line);
        }
        obs.event(step, event);
        written.map(|(seq, _)| seq)
    }

    /// Write one envelope: its `seq` and the line as written (redacted).
    fn write<E: Serialize>(
        &self,
        source: &str,
        step: Option<&str>,
        event: &E,
    ) -> Result<(u64, String), RecordError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let seq = inner.seq + 1;
        let out = Out {
            v: ENVELOPE_VERSION,
            seq,
            at: crate::now_rfc3339(),
            run_id: &self.run_id,
            mode: self.mode,
            source,
            event,
            step,
        };
        let line = inner.log.append_line(&out, &inner.redactor)?;
        inner.seq = seq;
        Ok((seq, line))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Scrub `secrets` too from every line written from now on, by this sink
    /// and every clone of it: a secret learnt while the run goes on (a login
    /// token copied in for an agent).
    pub fn add_secrets(&self, secrets: &Redactor) {
        self.lock().redactor.extend_from(secrets);
    }

    /// What the log is scrubbed of now (the secrets it was opened with and
    /// those added since).
    pub fn redactor(&self) -> Redactor {
        self.lock().redactor.clone()
    }

    /// Make what was written durable (at state checkpoints).
    pub fn sync(&self) -> Result<(), RecordError> {
        self.lock().log.sync()
    }
}

/// Who is told an engine's events as they are recorded: the binary's
/// renderer of them (a line on the terminal, the envelope with `--json`).
/// An engine records an event and tells its observer the same typed value in
/// one call ([`EventSink::emit_to`], [`crate::RunHandle::emit_to`]), so what
/// the terminal shows is what the log holds. An event an engine has no run
/// to record in (a front end of the job queue listening) is told with
/// [`Observer::event`] alone.
pub trait Observer<E>: Send + Sync {
    /// One event, of `step` when it has one.
    fn event(&self, step: Option<&str>, e: &E);

    /// The envelope of the event told next, as written to the run's log (one
    /// JSON line, redacted). Not told for an event that was not recorded.
    fn recorded(&self, _envelope: &str) {}
}

/// The observer that is told nothing (a library caller, a test).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl<E> Observer<E> for NoObserver {
    fn event(&self, _step: Option<&str>, _e: &E) {}
}

/// Read a log: every whole line that parses as an envelope (a torn last line,
/// from a kill mid-write, is skipped).
pub fn read_events(path: &Path) -> Result<Vec<Envelope>, RecordError> {
    let text = fs_err::read_to_string(path).map_err(|e| RecordError::io("cannot read", path, e))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Serialize)]
    #[serde(tag = "kind", content = "data", rename_all = "snake_case")]
    enum Ev {
        StepEnd {
            verdict: &'static str,
            secret: String,
        },
        RunEnd,
    }

    #[test]
    fn envelopes_are_numbered_redacted_and_continued() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("events.jsonl");
        let red = Redactor::new([("T".to_string(), "tok-secret-1".to_string())]);
        let sink = EventSink::open(&p, "r1", Mode::Pipeline, red.clone()).unwrap();
        sink.emit(
            "engine",
            Some("test"),
            &Ev::StepEnd {
                verdict: "pass",
                secret: "x tok-secret-1".into(),
            },
        )
        .unwrap();
        assert_eq!(sink.emit("engine", None, &Ev::RunEnd).unwrap(), 2);
        drop(sink);
        // A torn line from a kill does not stop the reader, and a reopened
        // sink continues the numbering.
        use std::io::Write as _;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"{\"v\":1,\"se")
            .unwrap();
        let sink = EventSink::open(&p, "r1", Mode::Pipeline, red).unwrap();
        assert_eq!(sink.emit("engine", None, &Ev::RunEnd).unwrap(), 3);
        let ev = read_events(&p).unwrap();
        assert_eq!(ev.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(ev[0].kind, "step_end");
        assert_eq!(ev[0].step.as_deref(), Some("test"));
        assert_eq!(ev[0].data["verdict"], "pass");
        assert_eq!(ev[0].data["secret"], "x [REDACTED:T]");
        assert_eq!(ev[1].data, serde_json::Value::Null);
    }

    #[test]
    fn an_observer_is_told_what_is_recorded() {
        #[derive(Default)]
        struct Seen(Mutex<Vec<String>>);
        impl Observer<Ev> for Seen {
            fn event(&self, step: Option<&str>, e: &Ev) {
                let what = match e {
                    Ev::StepEnd { verdict, .. } => format!("end {verdict}"),
                    Ev::RunEnd => "run end".into(),
                };
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("{} {what}", step.unwrap_or("-")));
            }
            fn recorded(&self, envelope: &str) {
                self.0.lock().unwrap().push(envelope.to_string());
            }
        }
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("events.jsonl");
        let red = Redactor::new([("T".to_string(), "tok-secret-1".to_string())]);
        let sink = EventSink::open(&p, "r1", Mode::Plan, red).unwrap();
        let seen = Seen::default();
        let ev = Ev::StepEnd {
            verdict: "pass",
            secret: "tok-secret-1".into(),
        };
        assert_eq!(sink.emit_to("engine", Some("c1"), &ev, &seen).unwrap(), 1);
        let seen = seen.0.into_inner().unwrap();
        assert_eq!(seen.len(), 2);
        // The envelope told is the line written, redacted.
        let written = std::fs::read_to_string(&p).unwrap();
        assert_eq!(seen[0], written.trim_end());
        assert!(seen[0].contains("[REDACTED:T]"), "{}", seen[0]);
        assert_eq!(seen[1], "c1 end pass");
        sink.emit_to("engine", None, &Ev::RunEnd, &NoObserver)
            .unwrap();
    }

    #[test]
    fn secrets_added_later_are_scrubbed_by_every_clone() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("events.jsonl");
        let sink = EventSink::open(&p, "r1", Mode::Rounds, Redactor::default()).unwrap();
        let early_clone = sink.clone();
        let ev = |s: &str| Ev::StepEnd {
            verdict: "pass",
            secret: s.into(),
        };
        sink.add_secrets(&Redactor::new([(
            "LOGIN".to_string(),
            "refresh-token-0123456789".to_string(),
        )]));
        early_clone
            .emit("agent", None, &ev("cat: refresh-token-0123456789"))
            .unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(!text.contains("refresh-token-0123456789"), "{text}");
        assert!(text.contains("[REDACTED:LOGIN]"), "{text}");
        assert_eq!(sink.redactor().secrets().len(), 1);
    }
}
