//! The completion record (`<on_complete_dir>/<id>.json`) and the on-commit
//! hook, the seed's deploy queue made general: a command of the owner's that
//! gets the record, once per commit.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::answer::FixResult;
use crate::JobsError;

/// The most of the report a record keeps.
pub const MAX_REPORT_CHARS: usize = 4_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Committed,
    NoChanges,
    LimitReached,
    CheckFailed,
    PublishFailed,
    Failed,
    /// belay's addition: the commit waits for the owner's approval.
    Held,
    /// belay's addition: the owner declined the job or discarded its diff.
    Declined,
}

impl Status {
    /// A job that failed: its checks, its agent, its push, or its limit
    /// (the exit class of a failed check for `belay jobs work --once`).
    pub fn failed(self) -> bool {
        match self {
            Status::LimitReached | Status::CheckFailed | Status::PublishFailed | Status::Failed => {
                true
            }
            Status::Committed | Status::NoChanges | Status::Held | Status::Declined => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Committed => "committed",
            Status::NoChanges => "no_changes",
            Status::LimitReached => "limit_reached",
            Status::CheckFailed => "check_failed",
            Status::PublishFailed => "publish_failed",
            Status::Failed => "failed",
            Status::Held => "held",
            Status::Declined => "declined",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRef {
    pub repo: String,
    pub branch: String,
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub runtime: String,
    pub model: Option<String>,
    pub reasoning_effort: Option<String>,
    pub iteration_limit: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cached_input: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    pub tokens: Tokens,
    pub cost_usd: f64,
    pub duration_s: f64,
    pub agent_s: f64,
    pub turns: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRecord {
    pub job_id: String,
    pub status: Status,
    pub commits: Vec<CommitRef>,
    pub completed_at: String,
    pub runtime: String,
    pub configured_profile: Profile,
    pub telemetry: Telemetry,
    pub report: String,
    pub pipeline_role: String,
    /// On whose behalf the job ran (for `/jobs`: each sender sees theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixer_outcome: Option<FixResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_detail: Option<String>,
    /// A branch kept for a commit that could not be pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserved_branch: Option<String>,
}

/// Write the record unless the same job's record with the same commits is
/// there already (a rerun after a crash writes nothing twice). Whether it
/// was written.
pub fn write(
    dir: &Path,
    rec: &CompletionRecord,
    redactor: &belay_record::Redactor,
) -> Result<bool, JobsError> {
    fs_err::create_dir_all(dir).map_err(|e| JobsError::io("create", dir, e))?;
    let path = dir.join(format!("{}.json", rec.job_id));
    // host-owned: the record in `done/` or the owner's `on_complete_dir`.
    if let Ok(text) = fs_err::read_to_string(&path) {
        if let Ok(old) = serde_json::from_str::<CompletionRecord>(&text) {
            if old.job_id == rec.job_id && old.commits == rec.commits && old.status == rec.status {
                return Ok(false);
            }
        }
    }
    let mut rec = rec.clone();
    rec.report = belay_agent::checks::last_chars(rec.report.trim(), MAX_REPORT_CHARS);
    let mut v = serde_json::to_value(&rec)
        .map_err(|e| JobsError::Environment(format!("cannot encode the record: {e}")))?;
    redactor.redact_value(&mut v);
    belay_record::write_json_atomic(&path, &v)?;
    Ok(true)
}

/// The completion records in `dir` (the queue's `done/`), oldest first;
/// a file that is no record is skipped.
pub fn finished(dir: &Path) -> Vec<CompletionRecord> {
    // host-owned: the queue's done/ (0700, belay's own; no agent mounts it).
    let Ok(rd) = fs_err::read_dir(dir) else {
        return vec![];
    };
    let mut out: Vec<CompletionRecord> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        // host-owned: a record belay wrote in its own done/.
        .filter_map(|e| fs_err::read_to_string(e.path()).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect();
    out.sort_by(|a: &CompletionRecord, b| a.completed_at.cmp(&b.completed_at));
    out
}

/// The hook's marker for these commits: it ran to success once.
fn marker(hooks: &Path, rec: &CompletionRecord) -> PathBuf {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(rec.job_id.as_bytes());
    for c in &rec.commits {
        h.update([0]);
        h.update(c.hash.as_bytes());
    }
    hooks.join(format!("{}.done", hex::encode(&h.finalize()[..12])))
}

/// What the hook did.
#[derive(Debug, Clone)]
pub struct HookRun {
    pub exit_code: Option<i32>,
    pub ok: bool,
    /// It had run for these commits before: not run again.
    pub skipped: bool,
}

/// Run the on-commit hook for a committed job: `argv` plus the record's
/// path, the record on stdin, in its own process group with an explicit
/// environment, killed as a group on `timeout`. Once per commit: a success
/// leaves a marker.
pub async fn run_hook(
    argv: &[String],
    hooks_dir: &Path,
    record_path: &Path,
    rec: &CompletionRecord,
    timeout: Duration,
    log: &Path,
) -> Result<HookRun, JobsError> {
    let mark = marker(hooks_dir, rec);
    if mark.exists() {
        return Ok(HookRun {
            exit_code: Some(0),
            ok: true,
            skipped: true,
        });
    }
    let Some((program, args)) = argv.split_first() else {
        return Ok(HookRun {
            exit_code: None,
            ok: true,
            skipped: true,
        });
    };
    // host-owned: the record belay just wrote (`done/` or the owner's `on_complete_dir`).
    let text = fs_err::read(record_path).map_err(|e| JobsError::io("read", record_path, e))?;
    if let Some(d) = log.parent() {
        fs_err::create_dir_all(d).map_err(|e| JobsError::io("create", d, e))?;
    }
    let out = fs_err::File::create(log).map_err(|e| JobsError::io("create", log, e))?;
    let err = out.try_clone().map_err(|e| JobsError::io("open", log, e))?;
    let mut env = belay_agent::cli::scrubbed_env();
    env.push(("BELAY_JOB_ID".into(), rec.job_id.clone()));
    env.push((
        "BELAY_COMMITS".into(),
        rec.commits
            .iter()
            .map(|c| c.hash.as_str())
            .collect::<Vec<_>>()
            .join(" "),
    ));
    env.push(("BELAY_RECORD".into(), record_path.display().to_string()));
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .arg(record_path)
        .env_clear()
        .envs(env)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::from(out.into_parts().0))
        .stderr(Stdio::from(err.into_parts().0))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            JobsError::Config(format!(
                "cannot start the on-commit hook `{program}`: {e} (is it installed, and executable?)"
            ))
        })?;
    let pid = child.id();
    if let Some(mut stdin) = child.stdin.take() {
        tokio::spawn(async move {
            let _ = stdin.write_all(&text).await;
            let _ = stdin.shutdown().await;
        });
    }
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(s) => s.map_err(|e| JobsError::io("wait for", Path::new(program), e))?,
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.wait().await;
            return Ok(HookRun {
                exit_code: None,
                ok: false,
                skipped: false,
            });
        }
    };
    // What the hook left in its group goes with it.
    if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let ok = status.success();
    if ok {
        belay_record::atomic_write(&mark, rec.job_id.as_bytes())?;
    }
    Ok(HookRun {
        exit_code: status.code(),
        ok,
        skipped: false,
    })
}
