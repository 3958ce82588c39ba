//! A round a killed belay left behind: `status.json` says `running` but its
//! holder is gone. The next start kills what the recorded agent left (its
//! process group), removes its container, applies the round's guard (the git
//! dir, and the config and prompt files from belay's trusted copies), stashes
//! its tree, and records the round as interrupted, so that the next round's
//! `previous` says so. (The config itself was already checked, and put back
//! if changed, before it was read: see [`crate::trusted`].)

use crate::events::RoundEvent;
use crate::state::{self, Status};
use crate::supervisor::Supervisor;
use crate::RoundsError;

impl Supervisor {
    /// The status to continue from, after recording an interrupted round.
    pub(crate) async fn recover(&self) -> Result<Status, RoundsError> {
        let log_dir = self.log_dir();
        let status: Status = match state::read(log_dir, state::STATUS_FILE) {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                // A torn or hand-edited status: start from the event log's
                // highest round, never from 0 (which would reuse numbers).
                let n = self.highest_round();
                self.emit(
                    None,
                    &RoundEvent::StatusRecovered {
                        reason: format!("{e}; continuing after round {n}"),
                    },
                );
                Status {
                    round_num: n,
                    ..Default::default()
                }
            }
        };
        if !status.running {
            // A guard without a running round (a torn status): applied all the same.
            self.settle_guard(status.round_num, &format!("R{}", status.round_num))?;
            return Ok(status);
        }
        let holder_alive = status
            .holder
            .as_ref()
            .is_some_and(|h| h.is_alive() && h.pid != std::process::id());
        if holder_alive {
            return Err(RoundsError::Environment(format!(
                "round {} is still running in pid {}: wait for it (`belay rounds status`)",
                status.round_num,
                status.holder.as_ref().map(|h| h.pid).unwrap_or(0)
            )));
        }
        let killed = belay_agent::cli::kill_recorded(&log_dir.join("agent.pid"));
        self.remove_round_containers().await;
        if let Some(rt) = &self.rt {
            let _ = belay_sandbox::reaper::reap_orphans(rt.as_ref()).await;
        }
        let step = format!("R{}", status.round_num);
        // The agent is gone: its guard puts back the git dir and the
        // supervisor's inputs before anything reads them.
        self.settle_guard(status.round_num, &step)?;
        self.emit(
            Some(&step),
            &RoundEvent::RoundInterrupted {
                round_num: status.round_num,
                started_at: status.started_at.clone().unwrap_or_default(),
                agent_killed: killed,
            },
        );
        let stashed = self
            .handle_dirty(
                status.round_num,
                status.current_phase.as_deref(),
                "interrupted",
                &step,
            )
            .await;
        let _ = stashed;
        let done = Status {
            running: false,
            started_at: None,
            holder: None,
            last_completed_at: Some(belay_record::now_rfc3339()),
            last_exit_code: None,
            last_duration_s: None,
            last_outcome: Some("interrupted".into()),
            ..status.clone()
        };
        state::write(log_dir, state::STATUS_FILE, &done, &self.redactor())?;
        self.emit(
            Some(&step),
            &RoundEvent::RoundEnd {
                round_num: status.round_num,
                exit_code: None,
                outcome: "interrupted".into(),
                duration_s: 0.0,
            },
        );
        Ok(done)
    }

    /// The highest round number in the event log.
    fn highest_round(&self) -> u64 {
        let path = self.run.path(belay_record::EVENTS_FILE);
        let mut max = 0;
        crate::monitor::view::each_event(&path, 0, &mut |e| {
            if e.kind == "round_start" {
                if let Some(n) = e.data.get("round_num").and_then(|v| v.as_u64()) {
                    max = max.max(n);
                }
            }
        });
        max
    }
}
