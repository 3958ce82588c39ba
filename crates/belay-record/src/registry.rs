//! The run registry: one index of every run of every mode, wherever its state
//! directory is, in the user's state directory (`$BELAY_STATE_HOME`, else
//! `$XDG_STATE_HOME/belay`, else `~/.local/state/belay`): `runs.jsonl`.
//!
//! The index is append-only. A run appends a `start` record when it opens
//! and an `end` record when it finishes (with its status, duration, tokens and
//! cost); a resume appends `start` again. Each record is one `write` of one
//! line that begins with a newline, under a shared `flock`, so concurrent
//! writers never interleave, and a record torn by a `kill -9` mid-write is
//! only ever a prefix that the next record's newline closes off: it is
//! skipped, and nothing after it is lost. `gc` compacts the file under an
//! exclusive lock.
//!
//! A run whose last record is `start` is `running` while its owner process
//! (pid, start time and boot id, recorded) is alive, and `interrupted` once it
//! is gone.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Mode, ProcessIdentity, RecordError};

/// A run's status as the registry tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Ok,
    Failed,
    Interrupted,
}

impl std::str::FromStr for RunStatus {
    type Err = RecordError;
    fn from_str(s: &str) -> Result<Self, RecordError> {
        Ok(match s {
            "running" => RunStatus::Running,
            "ok" => RunStatus::Ok,
            "failed" => RunStatus::Failed,
            "interrupted" => RunStatus::Interrupted,
            o => {
                return Err(RecordError::UnknownStatus {
                    value: o.to_string(),
                })
            }
        })
    }
}

impl RunStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Ok => "ok",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

/// How a run ended, for its `end` record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    /// `ok` or `failed`.
    pub ok: bool,
    pub duration_s: f64,
    #[serde(default)]
    pub tokens: u64,
    #[serde(default)]
    pub cost_usd: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Record {
    Start {
        run_id: String,
        mode: Mode,
        dir: PathBuf,
        at: String,
        owner: Option<ProcessIdentity>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repo: Option<PathBuf>,
    },
    End {
        run_id: String,
        at: String,
        #[serde(flatten)]
        end: RunEnd,
    },
    /// What a run made for other runs to use (an env build's final image,
    /// by id), and the commit of its repository it was made from.
    Artifact {
        run_id: String,
        at: String,
        image: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        commit: Option<String>,
    },
    /// Stopped on request (SIGINT/SIGTERM): the same command resumes it.
    Interrupted {
        run_id: String,
        at: String,
        #[serde(flatten)]
        end: RunEnd,
    },
}

/// One run, folded from its records.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEntry {
    pub run_id: String,
    pub mode: Mode,
    pub status: RunStatus,
    /// Where the run's records live.
    pub dir: PathBuf,
    pub title: Option<String>,
    /// The repository the run is for, when it recorded one (env builds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repo: Option<PathBuf>,
    /// What the run made for other runs (an env build's final image id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// The commit of `repo` the artifact was made from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// When it first started.
    pub started_at: String,
    pub ended_at: Option<String>,
    pub duration_s: Option<f64>,
    pub tokens: u64,
    pub cost_usd: f64,
    pub summary: Option<String>,
    #[serde(skip)]
    owner: Option<ProcessIdentity>,
}

/// The registry at a path.
#[derive(Debug, Clone)]
pub struct Registry {
    dir: PathBuf,
}

impl Registry {
    /// The user's registry (see the module docs for the directory).
    pub fn default_location() -> Registry {
        Registry {
            dir: crate::state_home(),
        }
    }

    pub fn at(dir: &Path) -> Registry {
        Registry {
            dir: dir.to_path_buf(),
        }
    }

    pub fn index(&self) -> PathBuf {
        self.dir.join("runs.jsonl")
    }

    fn lock_file(&self) -> Result<File, RecordError> {
        fs_err::create_dir_all(&self.dir)
            .map_err(|e| RecordError::io("cannot create the registry directory", &self.dir, e))?;
        let p = self.dir.join("runs.lock");
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| RecordError::io("cannot open", &p, e))
    }

    fn append(&self, rec: &Record) -> Result<(), RecordError> {
        let lock = self.lock_file()?;
        lock.lock_shared()
            .map_err(|e| RecordError::io("cannot lock", self.dir.join("runs.lock"), e))?;
        let path = self.index();
        let mut line = String::from("\n");
        line.push_str(
            &serde_json::to_string(rec).map_err(|source| RecordError::Json {
                path: path.clone(),
                source,
            })?,
        );
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| RecordError::io("cannot open", &path, e))?;
        f.write_all(line.as_bytes())
            .map_err(|e| RecordError::io("cannot append to", &path, e))
    }

    /// Record that a run started (or resumed) in `dir`, owned by this process.
    pub fn started(
        &self,
        run_id: &str,
        mode: Mode,
        dir: &Path,
        title: Option<&str>,
        repo: Option<&Path>,
    ) -> Result<(), RecordError> {
        let dir = fs_err::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let repo = repo.map(|r| fs_err::canonicalize(r).unwrap_or_else(|_| r.to_path_buf()));
        self.append(&Record::Start {
            run_id: run_id.into(),
            mode,
            dir,
            at: crate::now_rfc3339(),
            owner: ProcessIdentity::current(),
            title: title.map(String::from),
            repo,
        })
    }

    /// Record how a run ended.
    pub fn ended(&self, run_id: &str, end: RunEnd) -> Result<(), RecordError> {
        self.append(&Record::End {
            run_id: run_id.into(),
            at: crate::now_rfc3339(),
            end,
        })
    }

    /// Record what a run made for other runs: an env build's final image
    /// (its id) and the commit it was made from.
    pub fn artifact(
        &self,
        run_id: &str,
        image: &str,
        commit: Option<&str>,
    ) -> Result<(), RecordError> {
        self.append(&Record::Artifact {
            run_id: run_id.into(),
            at: crate::now_rfc3339(),
            image: image.into(),
            commit: commit.map(String::from),
        })
    }

    /// Record that a run was stopped on request and can be resumed.
    pub fn interrupted(&self, run_id: &str, end: RunEnd) -> Result<(), RecordError> {
        self.append(&Record::Interrupted {
            run_id: run_id.into(),
            at: crate::now_rfc3339(),
            end,
        })
    }

    /// Every run, newest start first.
    pub fn list(&self) -> Result<Vec<RunEntry>, RecordError> {
        let path = self.index();
        let text = match fs_err::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(RecordError::io("cannot read", &path, e)),
        };
        let mut by_id: HashMap<String, RunEntry> = HashMap::new();
        let mut order: Vec<String> = Vec::new();
        for line in text.split('\n').filter(|l| !l.is_empty()) {
            let Ok(rec) = serde_json::from_str::<Record>(line) else {
                continue;
            };
            let stopped = matches!(rec, Record::Interrupted { .. });
            match rec {
                Record::Start {
                    run_id,
                    mode,
                    dir,
                    at,
                    owner,
                    title,
                    repo,
                } => match by_id.get_mut(&run_id) {
                    Some(e) => {
                        e.status = RunStatus::Running;
                        e.repo = repo.or(e.repo.take());
                        e.owner = owner;
                        e.ended_at = None;
                        e.dir = dir;
                    }
                    None => {
                        order.push(run_id.clone());
                        by_id.insert(
                            run_id.clone(),
                            RunEntry {
                                run_id,
                                mode,
                                status: RunStatus::Running,
                                dir,
                                title,
                                repo,
                                artifact: None,
                                commit: None,
                                started_at: at,
                                ended_at: None,
                                duration_s: None,
                                tokens: 0,
                                cost_usd: 0.0,
                                summary: None,
                                owner,
                            },
                        );
                    }
                },
                Record::Artifact {
                    run_id,
                    image,
                    commit,
                    ..
                } => {
                    if let Some(e) = by_id.get_mut(&run_id) {
                        e.artifact = Some(image);
                        e.commit = commit;
                    }
                }
                Record::End { run_id, at, end } | Record::Interrupted { run_id, at, end } => {
                    if let Some(e) = by_id.get_mut(&run_id) {
                        e.status = if stopped {
                            RunStatus::Interrupted
                        } else if end.ok {
                            RunStatus::Ok
                        } else {
                            RunStatus::Failed
                        };
                        e.ended_at = Some(at);
                        e.duration_s = Some(end.duration_s);
                        e.tokens = end.tokens;
                        e.cost_usd = end.cost_usd;
                        e.summary = end.summary;
                    }
                }
            }
        }
        let mut out: Vec<RunEntry> = order
            .into_iter()
            .filter_map(|id| by_id.remove(&id))
            .collect();
        for e in &mut out {
            if e.status == RunStatus::Running && !e.owner.as_ref().is_some_and(|o| o.is_alive()) {
                e.status = RunStatus::Interrupted;
            }
        }
        out.reverse();
        Ok(out)
    }

    /// One run by id (or by a unique prefix of one).
    pub fn find(&self, id: &str) -> Result<Option<RunEntry>, RecordError> {
        let all = self.list()?;
        if let Some(e) = all.iter().find(|e| e.run_id == id) {
            return Ok(Some(e.clone()));
        }
        let mut hits = all.into_iter().filter(|e| e.run_id.starts_with(id));
        match (hits.next(), hits.next()) {
            (Some(e), None) => Ok(Some(e)),
            _ => Ok(None),
        }
    }

    /// Drop the records of `gone` runs (rewrites the index atomically, under
    /// an exclusive lock, so no concurrent append is lost).
    pub fn forget(&self, gone: &[String]) -> Result<(), RecordError> {
        let lock = self.lock_file()?;
        lock.lock()
            .map_err(|e| RecordError::io("cannot lock", self.dir.join("runs.lock"), e))?;
        let path = self.index();
        let text = match fs_err::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(RecordError::io("cannot read", &path, e)),
        };
        let mut keep = String::with_capacity(text.len());
        for line in text.split('\n').filter(|l| !l.is_empty()) {
            let id = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("run_id").and_then(|r| r.as_str()).map(String::from));
            match id {
                Some(id) if gone.contains(&id) => {}
                Some(_) => {
                    keep.push('\n');
                    keep.push_str(line);
                }
                None => {}
            }
        }
        crate::atomic_write(&path, keep.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_stopped_run_is_interrupted_while_its_owner_lives_and_keeps_its_figures() {
        let d = tempfile::tempdir().unwrap();
        let r = Registry::at(d.path());
        r.started("s", Mode::Plan, d.path(), None, None).unwrap();
        r.interrupted(
            "s",
            RunEnd {
                ok: false,
                duration_s: 1.5,
                tokens: 7,
                cost_usd: 0.5,
                summary: Some("SIGINT received".into()),
            },
        )
        .unwrap();
        let e = r.find("s").unwrap().unwrap();
        assert_eq!(e.status, RunStatus::Interrupted);
        assert_eq!((e.tokens, e.cost_usd), (7, 0.5));
        assert!(e.ended_at.is_some());
        // A resume that then finishes is what the run is.
        r.ended(
            "s",
            RunEnd {
                ok: true,
                ..RunEnd::default()
            },
        )
        .unwrap();
        assert_eq!(r.find("s").unwrap().unwrap().status, RunStatus::Ok);
    }

    #[test]
    fn runs_fold_into_entries_and_torn_records_are_skipped() {
        let d = tempfile::tempdir().unwrap();
        let r = Registry::at(d.path());
        r.started("a", Mode::Env, d.path(), Some("build x"), None)
            .unwrap();
        r.started("b", Mode::Pipeline, d.path(), None, None)
            .unwrap();
        r.ended(
            "a",
            RunEnd {
                ok: true,
                duration_s: 2.5,
                tokens: 10,
                cost_usd: 0.01,
                summary: None,
            },
        )
        .unwrap();
        // A torn record (a kill mid-write), then more records.
        std::fs::OpenOptions::new()
            .append(true)
            .open(r.index())
            .unwrap()
            .write_all(b"\n{\"op\":\"start\",\"run_")
            .unwrap();
        r.started("c", Mode::Agent, d.path(), None, None).unwrap();
        let all = r.list().unwrap();
        let ids: Vec<&str> = all.iter().map(|e| e.run_id.as_str()).collect();
        assert_eq!(ids, ["c", "b", "a"]);
        assert_eq!(all[2].status, RunStatus::Ok);
        assert_eq!(all[2].tokens, 10);
        // This process is alive: its unfinished runs are running.
        assert_eq!(all[0].status, RunStatus::Running);
        // A start by a process that is gone is an interrupted run.
        let mut rec = serde_json::to_value(Record::Start {
            run_id: "dead".into(),
            mode: Mode::Env,
            dir: d.path().into(),
            at: "x".into(),
            owner: Some(ProcessIdentity {
                pid: u32::MAX - 1,
                start_ticks: 1,
                boot_id: "b".into(),
            }),
            title: None,
            repo: None,
        })
        .unwrap();
        rec["op"] = "start".into();
        std::fs::OpenOptions::new()
            .append(true)
            .open(r.index())
            .unwrap()
            .write_all(format!("\n{rec}").as_bytes())
            .unwrap();
        assert_eq!(
            r.find("dead").unwrap().unwrap().status,
            RunStatus::Interrupted
        );
        r.forget(&["b".into()]).unwrap();
        assert!(r.find("b").unwrap().is_none());
        assert_eq!(r.list().unwrap().len(), 3);
    }
}
