//! [`RunHandle`]: one run of any mode, opened the one way. It owns the run
//! directory, the kernel lock that keeps a second process out of it, the
//! typed and atomic state file, the event log, and the run's records in the
//! user's registry. Every engine opens its runs through it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{EventSink, Mode, RecordError, Redactor, Registry, RunEnd, RunLock};

/// The file names of a run directory that every mode shares.
pub const STATE_FILE: &str = "state.json";
pub const EVENTS_FILE: &str = "events.jsonl";
pub const LOCK_FILE: &str = "run.lock";

/// Where belay keeps state of its own when nothing else is said:
/// `$BELAY_STATE_HOME`, `$XDG_STATE_HOME/belay`, or `~/.local/state/belay`.
pub fn state_home() -> PathBuf {
    std::env::var_os("BELAY_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_STATE_HOME").map(|d| PathBuf::from(d).join("belay")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/belay")))
        .unwrap_or_else(|| PathBuf::from("/var/lib/belay"))
}

/// The empty hooks directory belay's git runs point `core.hooksPath` at
/// (no repository's hooks ever run on the host), under [`state_home`].
pub fn no_hooks_dir() -> PathBuf {
    state_home().join("no-hooks")
}

/// How to open a run.
pub struct OpenRun<'a> {
    /// The run directory (for env builds and pipelines,
    /// `<state dir>/runs/<id>`; an agent run's `--out`).
    pub dir: PathBuf,
    pub id: &'a str,
    pub mode: Mode,
    /// A short description for `belay runs list`.
    pub title: Option<&'a str>,
    /// The repository the run is for, when it has one (an env build's: how
    /// the other modes find the repository's latest environment image).
    pub repo: Option<&'a Path>,
    /// What every file the run writes must not hold.
    pub redactor: Redactor,
    pub registry: Registry,
}

/// Runs this process opened and has not ended, by handle: what an end must
/// still be written for when a handle goes without one (an error between
/// the start and the end) or the process exits at once on a second signal.
static UNENDED: std::sync::Mutex<Vec<(u64, String, Registry, Instant)>> =
    std::sync::Mutex::new(Vec::new());
static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn unended() -> std::sync::MutexGuard<'static, Vec<(u64, String, Registry, Instant)>> {
    UNENDED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Write the end of every run this process has open and not ended, as
/// stopped on request (`interrupted`): for a process about to exit at once
/// on a second signal.
pub fn end_open_runs_interrupted() {
    end_open_runs_where(|_| true);
}

fn end_open_runs_where(pick: impl Fn(&Registry) -> bool) {
    let picked: Vec<_> = {
        let mut open = unended();
        let (picked, rest) = open.drain(..).partition(|(_, _, r, _)| pick(r));
        *open = rest;
        picked
    };
    for (_, id, registry, started) in picked {
        let end = end_without_result(started, "stopped at once by a second signal");
        let _ = registry.interrupted(&id, end);
    }
}

fn end_without_result(started: Instant, why: &str) -> RunEnd {
    RunEnd {
        ok: false,
        duration_s: started.elapsed().as_secs_f64(),
        tokens: 0,
        cost_usd: 0.0,
        summary: Some(why.to_string()),
    }
}

/// One open run. Dropping it releases the lock. A handle dropped before its
/// end was recorded (an error on the way) records one: `interrupted` when a
/// signal asked this process to stop, `failed` otherwise. A process killed
/// while it holds one leaves the run `interrupted` in the registry.
#[derive(Debug)]
pub struct RunHandle {
    serial: u64,
    id: String,
    mode: Mode,
    dir: PathBuf,
    redactor: Redactor,
    sink: EventSink,
    registry: Registry,
    started: Instant,
    _lock: RunLock,
}

impl RunHandle {
    /// Create the run directory (or reopen it, to resume), take its lock,
    /// open its event log (a resumed log continues its `seq`), and record the
    /// run in the registry. A run another process holds is refused with
    /// [`RecordError::Locked`]. The registry is an index: when it cannot be
    /// written, the run goes on and the reason is logged.
    pub fn open(o: OpenRun<'_>) -> Result<RunHandle, RecordError> {
        Self::open_with(o, true)
    }

    /// Reopen a run that ended, to add to it (a held job's approval): as
    /// [`RunHandle::open`], but the registry gets no second start record;
    /// the run's next end record is its end.
    pub fn reopen(o: OpenRun<'_>) -> Result<RunHandle, RecordError> {
        Self::open_with(o, false)
    }

    fn open_with(o: OpenRun<'_>, record_start: bool) -> Result<RunHandle, RecordError> {
        crate::run_id::validate(o.id)?;
        fs_err::create_dir_all(&o.dir)
            .map_err(|e| RecordError::io("cannot create the run directory", &o.dir, e))?;
        let lock = RunLock::acquire(&o.dir.join(LOCK_FILE))?;
        let sink = EventSink::open(&o.dir.join(EVENTS_FILE), o.id, o.mode, o.redactor.clone())?;
        // The title may quote a prompt: it is redacted like every record.
        let title = o.title.map(|t| o.redactor.redact(t).into_owned());
        if record_start {
            if let Err(e) = o
                .registry
                .started(o.id, o.mode, &o.dir, title.as_deref(), o.repo)
            {
                tracing::warn!("run {} is not in the registry: {e}", o.id);
            }
        }
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unended().push((serial, o.id.to_string(), o.registry.clone(), Instant::now()));
        Ok(RunHandle {
            serial,
            id: o.id.to_string(),
            mode: o.mode,
            dir: o.dir,
            redactor: o.redactor,
            sink,
            registry: o.registry,
            started: Instant::now(),
            _lock: lock,
        })
    }

    /// Record what this run made for other runs (`Registry::artifact`); a
    /// registry that cannot be written is logged, as for every record.
    pub fn artifact(&self, image: &str, commit: Option<&str>) {
        if let Err(e) = self.registry.artifact(&self.id, image, commit) {
            tracing::warn!("run {}: its artifact is not in the registry: {e}", self.id);
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A file of the run.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The secrets the run was opened with. Those added since
    /// ([`RunHandle::add_secrets`]) are in [`RunHandle::live_redactor`].
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Secrets learnt while the run goes on (a login token copied in for an
    /// agent): from now on the event log (every clone of its sink) and the
    /// run's own records scrub them too. Safe from any thread.
    pub fn add_secrets(&self, secrets: &Redactor) {
        self.sink.add_secrets(secrets);
    }

    /// The secrets the run was opened with and those added since.
    pub fn live_redactor(&self) -> Redactor {
        self.sink.redactor()
    }

    /// Seconds since the run was opened in this process.
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The event log (cloneable, for tasks that emit on their own).
    pub fn sink(&self) -> &EventSink {
        &self.sink
    }

    /// Record one event (`{"kind": …, "data": …}`) from `source`.
    pub fn emit<E: Serialize>(
        &self,
        source: &str,
        step: Option<&str>,
        event: &E,
    ) -> Result<u64, RecordError> {
        self.sink.emit(source, step, event)
    }

    /// Record one event and tell `obs` the same value
    /// ([`EventSink::emit_to`]).
    pub fn emit_to<E: Serialize>(
        &self,
        source: &str,
        step: Option<&str>,
        event: &E,
        obs: &dyn crate::Observer<E>,
    ) -> Result<u64, RecordError> {
        self.sink.emit_to(source, step, event, obs)
    }

    /// Write the typed state atomically (a crash leaves the old file or the
    /// new one, never a torn one), redacted. Its size is the state's, not the
    /// history's: what grows with the run goes to the event log.
    pub fn save_state<T: Serialize>(&self, state: &T) -> Result<(), RecordError> {
        self.write_json(STATE_FILE, state)
    }

    /// Any other JSON record of the run (a summary), atomic and redacted.
    pub fn write_json<T: Serialize>(&self, name: &str, value: &T) -> Result<(), RecordError> {
        let path = self.path(name);
        let mut v = serde_json::to_value(value).map_err(|source| RecordError::Json {
            path: path.clone(),
            source,
        })?;
        self.live_redactor().redact_value(&mut v);
        let text = serde_json::to_string_pretty(&v).map_err(|source| RecordError::Json {
            path: path.clone(),
            source,
        })?;
        crate::atomic_write(&path, text.as_bytes())
    }

    /// A text record of the run (`commits/<sha>.patch`), atomic and
    /// redacted; its directory is made.
    pub fn write_text(&self, name: &str, text: &str) -> Result<PathBuf, RecordError> {
        let path = self.path(name);
        if let Some(parent) = path.parent() {
            fs_err::create_dir_all(parent)
                .map_err(|e| RecordError::io("cannot create", parent, e))?;
        }
        crate::atomic_write(&path, self.live_redactor().redact(text).as_bytes())?;
        Ok(path)
    }

    /// The typed state of the run in `dir`, or `None` when it has none yet.
    /// A file that does not parse is an error naming the file and the line.
    pub fn load_state<T: DeserializeOwned>(dir: &Path) -> Result<Option<T>, RecordError> {
        let path = dir.join(STATE_FILE);
        let text = match fs_err::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(RecordError::io("cannot read", &path, e)),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| RecordError::BadState {
                path,
                line: e.line(),
                message: e.to_string(),
            })
    }

    /// Record the run's end in the registry (the lock goes with the handle).
    pub fn finish(&self, end: RunEnd) {
        self.mark_ended();
        if let Err(e) = self.registry.ended(&self.id, end) {
            tracing::warn!("the end of run {} is not in the registry: {e}", self.id);
        }
    }

    /// Record that the run was stopped on request (SIGINT/SIGTERM) and
    /// can be resumed: `interrupted` in `belay runs`, never `failed`.
    pub fn interrupted(&self, end: RunEnd) {
        self.mark_ended();
        if let Err(e) = self.registry.interrupted(&self.id, end) {
            tracing::warn!("the stop of run {} is not in the registry: {e}", self.id);
        }
    }

    /// Whether this handle's end is recorded.
    fn mark_ended(&self) -> bool {
        let mut open = unended();
        let before = open.len();
        open.retain(|(s, ..)| *s != self.serial);
        open.len() != before
    }
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        if !self.mark_ended() {
            return;
        }
        let signalled = crate::stop::signalled();
        let end = end_without_result(
            self.started,
            if signalled {
                "stopped by a signal before its result was recorded"
            } else {
                "ended by an error before its result was recorded (the command's output says which)"
            },
        );
        let written = if signalled {
            self.registry.interrupted(&self.id, end)
        } else {
            self.registry.ended(&self.id, end)
        };
        if let Err(e) = written {
            tracing::warn!("the end of run {} is not in the registry: {e}", self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn open(dir: &Path, reg: &Path, id: &str) -> Result<RunHandle, RecordError> {
        RunHandle::open(OpenRun {
            dir: dir.join("runs").join(id),
            id,
            mode: Mode::Pipeline,
            title: Some("t"),
            repo: None,
            redactor: Redactor::new([("TOKEN".to_string(), "s3cr3t-value-1".to_string())]),
            registry: Registry::at(reg),
        })
    }

    #[derive(Serialize, serde::Deserialize, PartialEq, Debug)]
    struct State {
        step: u32,
        note: String,
    }

    /// Whatever ends a run's handle, the registry gets its end: one the mode
    /// wrote, or, for a handle dropped on an error's way out, `failed` with
    /// why; never a second one from the drop.
    #[test]
    fn a_handle_dropped_without_an_end_records_one() {
        let d = tempfile::tempdir().unwrap();
        let reg = d.path().join("reg");
        drop(open(d.path(), &reg, "run-err").unwrap());
        let e = Registry::at(&reg).find("run-err").unwrap().unwrap();
        assert_eq!(e.status, crate::RunStatus::Failed);
        assert!(e.summary.unwrap().contains("ended by an error"));
        let h = open(d.path(), &reg, "run-ok").unwrap();
        h.finish(RunEnd {
            ok: true,
            summary: Some("done".into()),
            ..Default::default()
        });
        drop(h);
        let e = Registry::at(&reg).find("run-ok").unwrap().unwrap();
        assert_eq!(e.status, crate::RunStatus::Ok);
        assert_eq!(e.summary.as_deref(), Some("done"));
        let index = std::fs::read_to_string(reg.join("runs.jsonl")).unwrap();
        assert_eq!(index.matches("\"run-ok\"").count(), 2, "{index}");
        // A second signal's exit ends the open ones as interrupted.
        let h = open(d.path(), &reg, "run-sig").unwrap();
        // (Only this test's registry: the other tests' runs are open too.)
        end_open_runs_where(|r| r.index() == Registry::at(&reg).index());
        let e = Registry::at(&reg).find("run-sig").unwrap().unwrap();
        assert_eq!(e.status, crate::RunStatus::Interrupted);
        drop(h);
        let e = Registry::at(&reg).find("run-sig").unwrap().unwrap();
        assert_eq!(e.status, crate::RunStatus::Interrupted);
    }

    #[test]
    fn one_run_one_holder_typed_state_and_a_continuing_log() {
        let d = tempfile::tempdir().unwrap();
        let reg = d.path().join("reg");
        let h = open(d.path(), &reg, "run-1").unwrap();
        // A second holder is refused while the first lives.
        assert!(matches!(
            open(d.path(), &reg, "run-1"),
            Err(RecordError::Locked { .. })
        ));
        h.save_state(&State {
            step: 2,
            note: "saw s3cr3t-value-1".into(),
        })
        .unwrap();
        let text = std::fs::read_to_string(h.path(STATE_FILE)).unwrap();
        assert!(!text.contains("s3cr3t-value-1"), "{text}");
        #[derive(Serialize)]
        struct Ev {
            kind: &'static str,
        }
        assert_eq!(h.emit("engine", None, &Ev { kind: "a" }).unwrap(), 1);
        let dir = h.dir().to_path_buf();
        drop(h);
        let s: State = RunHandle::load_state(&dir).unwrap().unwrap();
        assert_eq!(s.step, 2);
        // Reopened (a resume): the lock is free again, the log continues.
        let h = open(d.path(), &reg, "run-1").unwrap();
        assert_eq!(h.emit("engine", None, &Ev { kind: "b" }).unwrap(), 2);
        let e = Registry::at(&reg).find("run-1").unwrap().unwrap();
        assert_eq!(e.mode, Mode::Pipeline);
        // A torn state file names itself and its line.
        std::fs::write(dir.join(STATE_FILE), "{\n\"step\": 2,\n\"note\": ").unwrap();
        let err = RunHandle::load_state::<State>(&dir)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("state.json") && err.contains("line 3"),
            "{err}"
        );
        assert!(open(d.path(), &reg, "../escape").is_err());
    }

    #[test]
    fn secrets_added_to_a_live_run_are_scrubbed_from_its_records() {
        let d = tempfile::tempdir().unwrap();
        let h = open(d.path(), &d.path().join("reg"), "run-2").unwrap();
        let token = "ya29.login-access-token-42";
        h.add_secrets(&Redactor::new([("LOGIN".to_string(), token.to_string())]));
        assert!(h.live_redactor().redact(token).contains("[REDACTED:LOGIN]"));
        assert!(h
            .live_redactor()
            .redact("s3cr3t-value-1")
            .contains("[REDACTED:TOKEN]"));
        #[derive(Serialize)]
        struct Ev {
            kind: &'static str,
            data: String,
        }
        h.emit(
            "agent",
            None,
            &Ev {
                kind: "out",
                data: format!("cat: {token}"),
            },
        )
        .unwrap();
        h.write_text("note.txt", token).unwrap();
        for f in [EVENTS_FILE, "note.txt"] {
            let text = std::fs::read_to_string(h.path(f)).unwrap();
            assert!(
                !text.contains(token) && text.contains("[REDACTED:LOGIN]"),
                "{f}: {text}"
            );
        }
    }
}
