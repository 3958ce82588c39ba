//! `status` and `peek`: what the log dir says, checked against the live
//! processes (a `running` round whose holder died is reported interrupted).

use std::path::Path;

use serde::Serialize;

use crate::state::{self, DayUsage, OrphanState, Status};

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub project: String,
    pub log_dir: String,
    /// `running`, `idle`, `interrupted` (a killed belay left a round), `never_run`.
    pub state: String,
    /// A serve process is alive.
    pub serving: bool,
    pub serve_pid: Option<u32>,
    pub status: Status,
    pub orphans: OrphanState,
    pub today: DayUsage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The serve process recorded in the log dir, if it is alive.
pub fn live_serve(log_dir: &Path) -> Option<belay_record::ProcessIdentity> {
    // host-owned: the log dir, belay's own.
    let text = fs_err::read_to_string(log_dir.join(crate::serve::SERVE_PID_FILE)).ok()?;
    let id: belay_record::ProcessIdentity = serde_json::from_str(&text).ok()?;
    id.is_alive().then_some(id)
}

pub fn report(project: &str, log_dir: &Path) -> Report {
    let (status, problem) = match state::read::<Status>(log_dir, state::STATUS_FILE) {
        Ok(s) => (s, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let never = status.is_none();
    let status = status.unwrap_or_default();
    let serve = live_serve(log_dir);
    let st = if never {
        "never_run"
    } else if status.running {
        if status.holder.as_ref().is_some_and(|h| h.is_alive()) {
            "running"
        } else {
            "interrupted"
        }
    } else {
        "idle"
    };
    Report {
        project: project.to_string(),
        log_dir: log_dir.display().to_string(),
        state: st.into(),
        serving: serve.is_some(),
        serve_pid: serve.map(|s| s.pid),
        status,
        orphans: state::read(log_dir, state::ORPHAN_FILE)
            .ok()
            .flatten()
            .unwrap_or_default(),
        today: state::read(log_dir, state::DAY_FILE)
            .ok()
            .flatten()
            .unwrap_or_default(),
        problem,
    }
}
