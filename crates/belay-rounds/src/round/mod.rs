//! One round: repository lock, recovery of a round a killed belay left,
//! battery, round number and phase, round context, the agent under its
//! budget, then the dirty tree, the status and the round's end: in that
//! order, whatever way the agent ended.

mod agent;
mod dirty;
mod guard;
mod login;
mod recover;

use std::time::Instant;

use jiff::Timestamp;
use serde::Serialize;

use crate::config::{AgentConfig, Phase};
use crate::events::{RoundEvent, Usage};
use crate::state::{self, DayUsage, OrphanBlock, OrphanState, Previous, RoundContext, Status};
use crate::supervisor::Supervisor;
use crate::RoundsError;
use belay_vcs::RepoLock;

pub use guard::GUARD_FILE;

/// How a round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The agent exited 0 (or gave its result).
    Clean,
    /// The agent exited non-zero, or reported failure.
    Failed,
    /// The round budget ran out: everything the round started was killed.
    TimedOut,
    /// The agent gave its result and did not exit within the grace: killed.
    GraceKilled,
    /// One of belay's cost or turn limits stopped the agent.
    Limit,
    /// Stopped now (a second SIGTERM, or `belay rounds kill`).
    Killed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Clean => "clean",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::GraceKilled => "grace_killed",
            Outcome::Limit => "limit",
            Outcome::Killed => "killed",
        }
    }

    /// The exit code of `belay rounds round` (the peer's).
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Clean | Outcome::GraceKilled => crate::exit::OK,
            Outcome::Killed => crate::exit::INTERRUPTED,
            _ => crate::exit::AGENT_FAILED,
        }
    }
}

/// What a round did, for serve's breakers and the caller.
#[derive(Debug, Clone, Serialize)]
pub struct RoundOutcome {
    pub round_num: u64,
    pub phase: Option<String>,
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub duration_s: f64,
    pub usage: Usage,
    /// The adapter reports usage for this agent (for the no-progress breaker).
    pub usage_capable: bool,
    pub new_commits: bool,
    pub stashed: Option<String>,
    pub auth_failed: bool,
    /// A rate limit: its class and when it resets.
    pub transient: Option<(String, Option<String>)>,
    /// The agent's `.agent-done`: stop the loop, with its reason.
    pub agent_done: Option<String>,
    pub log: String,
}

/// Options of one round.
#[derive(Default)]
pub struct RoundOptions<'a> {
    /// Run this phase instead of the rotation's.
    pub phase: Option<&'a str>,
    /// Resolved when the round must stop now.
    /// Stop the agent when this token is tripped *now*.
    pub kill: Option<belay_record::Stop>,
}

fn utc_day(t: Timestamp) -> String {
    t.to_string().chars().take(10).collect()
}

impl Supervisor {
    /// Run one round. Errors are what kept the round from starting (the
    /// battery, the lock, a limit already spent); once the agent started,
    /// its end is an [`Outcome`], never an error.
    pub async fn round(&self, o: RoundOptions<'_>) -> Result<RoundOutcome, RoundsError> {
        let cfg = &self.cfg;
        let log_dir = self.log_dir().to_path_buf();
        let _repo_lock = self.lock_repo()?;
        // Recovery before any read of a file the agent could write: a round
        // a killed belay left has its guard applied first.
        let status = self.recover().await?;
        // No agent runs now: a prompt file changed since it was trusted was
        // changed by the user.
        self.refresh_trust()?;
        self.battery()?;

        // Day limits are checked before anything is spent.
        let now = Timestamp::now();
        let mut day = self.day_within_limits(&log_dir, now)?;

        let round_num = status.round_num + 1;
        let (phase_index, phase) = self.pick_phase(o.phase, round_num)?;
        let phase_name = phase.map(|p| p.name.clone());
        let started_at = belay_record::now_rfc3339();
        let ctx = self
            .write_context(&status, round_num, &started_at, &phase_name)
            .await?;
        let body = crate::prompt::assemble_files(cfg, phase)?;
        let prompt = crate::prompt::with_context(cfg, &body, &ctx);
        let budget_s = cfg.budget_s(phase);
        let agent_cfg = cfg.agent_of(phase);

        let running = running_status(&status, round_num, &phase_name, phase_index, &started_at);
        state::write(&log_dir, state::STATUS_FILE, &running, &self.redactor())?;
        let step = format!("R{round_num}");
        self.emit_round_start(&step, round_num, &phase_name, budget_s, agent_cfg);
        let head_before = self.git.head().await.ok();
        let (rounds_dir, log) = open_round_log(&log_dir, round_num, now)?;
        let fresh_eyes = cfg
            .runtime
            .fresh_eyes_every_n
            .is_some_and(|n| round_num % n == 0);
        let (max_cost, max_turns) = self.agent_limits(&day);
        self.emit_agent_spawn(&step, round_num, budget_s, agent_cfg);
        let call = agent::AgentCall {
            agent: agent_cfg,
            round_num,
            phase: phase_name.as_deref(),
            prompt: &prompt,
            budget_s,
            log: &log,
            ctx: &ctx,
            fresh_eyes,
            max_cost,
            max_turns,
            kill: o.kill,
        };
        let (ran, duration_s) = self
            .run_guarded(call, &running, head_before.as_deref(), &step)
            .await?;
        let outcome = ran.outcome;
        self.report_agent_end(&ran, round_num, duration_s, budget_s, &step);
        // What the output says about the outside.
        let (auth_line, transient) = self.read_output(
            &ran,
            &log,
            round_num,
            duration_s,
            status.transient_active,
            &step,
        );

        // The tree, whatever way the agent ended (its sentinel is not work).
        let (agent_done, stashed, new_commits) = self
            .settle_tree(
                round_num,
                phase_name.as_deref(),
                outcome,
                &step,
                head_before.as_deref(),
            )
            .await;

        day.cost_usd += ran.usage.cost_usd;
        day.turns += u64::from(ran.usage.turns);
        day.rounds += 1;
        state::write(&log_dir, state::DAY_FILE, &day, &self.redactor())?;
        let transient_active =
            transient.is_some() || (status.transient_active && outcome != Outcome::Clean);
        self.finish(
            &running,
            round_num,
            ran.exit_code,
            outcome,
            duration_s,
            &step,
            transient_active,
        );
        self.prune_logs(&rounds_dir);
        Ok(RoundOutcome {
            round_num,
            phase: phase_name,
            outcome,
            exit_code: ran.exit_code,
            duration_s,
            usage: ran.usage,
            usage_capable: ran.usage_capable,
            new_commits,
            stashed,
            auth_failed: auth_line.is_some(),
            transient: transient
                .map(|(_, at)| ("rate_limit".to_string(), at.map(|t| t.to_string()))),
            agent_done,
            log: log.display().to_string(),
        })
    }

    /// Take the repository's lock: one agent per repository.
    fn lock_repo(&self) -> Result<RepoLock, RoundsError> {
        RepoLock::try_acquire(
            &self.git_common,
            &format!("config {}", self.cfg.path.display()),
        )
        .map_err(|e| match e {
            belay_vcs::VcsError::Locked { repo, holder } => RoundsError::Environment(format!(
                "another belay is writing the repository {} ({holder}): one agent per repository; wait for its round to end",
                repo.display()
            )),
            e => e.into(),
        })
    }

    /// Trust the prompt files as they are now (no agent runs), saying which changed.
    fn refresh_trust(&self) -> Result<(), RoundsError> {
        let retrusted = self.trust.refresh(&self.cfg)?;
        if !retrusted.is_empty() {
            self.emit(None, &RoundEvent::ControlFileTrusted { paths: retrusted });
        }
        Ok(())
    }

    /// The day's usage so far (a new UTC day starts at zero); an error when a day limit is spent.
    fn day_within_limits(
        &self,
        log_dir: &std::path::Path,
        now: Timestamp,
    ) -> Result<DayUsage, RoundsError> {
        let cfg = &self.cfg;
        let mut day: DayUsage = state::read(log_dir, state::DAY_FILE)
            .ok()
            .flatten()
            .unwrap_or_default();
        if day.day != utc_day(now) {
            day = DayUsage {
                day: utc_day(now),
                ..Default::default()
            };
        }
        if let Some(max) = cfg.limits.day_cost_usd.filter(|m| day.cost_usd >= *m) {
            return Err(RoundsError::Environment(format!(
                "the day's cost limit (${max:.2}) is spent (${:.2} today): the next round can start after 00:00 UTC (raise [limits] day_cost_usd to go on)",
                day.cost_usd
            )));
        }
        if let Some(max) = cfg.limits.day_turns.filter(|m| day.turns >= u64::from(*m)) {
            return Err(RoundsError::Environment(format!(
                "the day's turn limit ({max}) is spent: the next round can start after 00:00 UTC (raise [limits] day_turns to go on)"
            )));
        }
        Ok(day)
    }

    /// The phase of round `round_num` (its index and phase): `--phase`'s, else the rotation's.
    fn pick_phase(
        &self,
        wanted: Option<&str>,
        round_num: u64,
    ) -> Result<(usize, Option<&Phase>), RoundsError> {
        let cfg = &self.cfg;
        Ok(match wanted {
            Some(name) => match cfg.phases.iter().position(|p| p.name == name) {
                Some(i) => (i, cfg.phases.get(i)),
                None => {
                    return Err(RoundsError::Config(format!(
                        "--phase {name}: no such phase in [phases] list ({})",
                        cfg.phases
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )))
                }
            },
            None => match cfg.phase_of(round_num) {
                Some((i, p)) => (i, Some(p)),
                None => (0, None),
            },
        })
    }

    /// Build the round context (the previous round, the outstanding stashes) and write it.
    async fn write_context(
        &self,
        status: &Status,
        round_num: u64,
        started_at: &str,
        phase_name: &Option<String>,
    ) -> Result<RoundContext, RoundsError> {
        let outstanding = self.outstanding_orphans().await?;
        let previous = (status.round_num > 0).then(|| Previous {
            round_num: status.round_num,
            exit_code: status.last_exit_code,
            duration_s: status.last_duration_s,
            ended_at: status.last_completed_at.clone(),
            outcome: status
                .last_outcome
                .clone()
                .unwrap_or_else(|| "unknown".into()),
            had_dirty_tree: outstanding
                .stashes
                .iter()
                .any(|s| s.round_num == status.round_num),
        });
        let blocks: Vec<OrphanBlock> = outstanding.stashes.iter().map(OrphanBlock::from).collect();
        let ctx = RoundContext {
            round_num,
            started_at: started_at.to_string(),
            phase: phase_name.clone(),
            previous,
            orphan_stash: blocks.last().cloned(),
            orphan_stashes: blocks,
        };
        state::write(self.log_dir(), state::CONTEXT_FILE, &ctx, &self.redactor())?;
        Ok(ctx)
    }

    /// Record `round_start`.
    fn emit_round_start(
        &self,
        step: &str,
        round_num: u64,
        phase_name: &Option<String>,
        budget_s: f64,
        agent_cfg: &AgentConfig,
    ) {
        self.emit(
            Some(step),
            &RoundEvent::RoundStart {
                round_num,
                phase: phase_name.clone(),
                budget_s,
                placement: match agent_cfg.placement {
                    crate::config::PlacementKind::Container => "container",
                    crate::config::PlacementKind::Host => "host",
                },
            },
        );
    }

    /// The round's cost and turn limits: the round's, within what the day has left.
    fn agent_limits(&self, day: &DayUsage) -> (Option<f64>, Option<u32>) {
        let limits = &self.cfg.limits;
        let remaining_cost = limits.day_cost_usd.map(|m| (m - day.cost_usd).max(0.0));
        let remaining_turns = limits
            .day_turns
            .map(|m| (u64::from(m).saturating_sub(day.turns)) as u32);
        (
            min_opt(limits.round_cost_usd, remaining_cost),
            min_opt(limits.round_turns, remaining_turns),
        )
    }

    /// Record `agent_spawn`.
    fn emit_agent_spawn(&self, step: &str, round_num: u64, budget_s: f64, agent_cfg: &AgentConfig) {
        self.emit(
            Some(step),
            &RoundEvent::AgentSpawn {
                round_num,
                timeout_s: budget_s,
                agent: agent_cfg
                    .name
                    .clone()
                    .unwrap_or_else(|| agent_cfg.binary.clone()),
            },
        );
    }

    /// Write the end of a round that failed before its agent's end was known.
    fn finish_failed(&self, running: &Status, round_num: u64, duration_s: f64, step: &str) {
        self.finish(
            running,
            round_num,
            None,
            Outcome::Failed,
            duration_s,
            step,
            running.transient_active,
        );
    }

    /// Run the agent under the round's guard, then apply the guard; a round
    /// that fails here is recorded as failed before the error goes up.
    async fn run_guarded(
        &self,
        call: agent::AgentCall<'_>,
        running: &Status,
        head_before: Option<&str>,
        step: &str,
    ) -> Result<(agent::Ran, f64), RoundsError> {
        let round_num = call.round_num;
        let guard = self.take_guard()?;
        let t0 = Instant::now();
        let ran = self.run_agent(call).await;
        let duration_s = t0.elapsed().as_secs_f64();
        // The agent's processes are gone: undo what it must not leave.
        if let Err(e) = self.apply_guard(&guard, round_num, step) {
            self.finish_failed(running, round_num, duration_s, step);
            return Err(e);
        }
        if ran.as_ref().is_ok_and(|r| r.repos_planted) {
            self.quarantine_new_submodules(head_before, round_num, step)
                .await;
        }
        match ran {
            Ok(r) => Ok((r, duration_s)),
            Err(e) => {
                // The agent could not start (no engine, a missing image):
                // the round is recorded as failed before the error goes up.
                self.finish_failed(running, round_num, duration_s, step);
                Err(e)
            }
        }
    }

    /// Record how the agent ended: its exit, a kill or limit, leftovers, its usage.
    fn report_agent_end(
        &self,
        ran: &agent::Ran,
        round_num: u64,
        duration_s: f64,
        budget_s: f64,
        step: &str,
    ) {
        let outcome = ran.outcome;
        self.emit(
            Some(step),
            &RoundEvent::AgentExit {
                round_num,
                exit_code: ran.exit_code,
                duration_s,
                timed_out: outcome == Outcome::TimedOut,
                outcome: outcome.as_str().into(),
            },
        );
        match outcome {
            Outcome::TimedOut => self.emit(
                Some(step),
                &RoundEvent::RoundTimeoutKill {
                    round_num,
                    reason: format!("exceeded round_budget_s={budget_s}"),
                },
            ),
            Outcome::GraceKilled => self.emit(
                Some(step),
                &RoundEvent::RoundGraceKill {
                    round_num,
                    reason: "the agent gave its result and did not exit within the grace".into(),
                },
            ),
            Outcome::Limit => self.emit(
                Some(step),
                &RoundEvent::LimitReached {
                    round_num,
                    limit: ran.stop.clone(),
                },
            ),
            _ => {}
        }
        if ran.leftovers > 0 {
            self.emit(
                Some(step),
                &RoundEvent::LeftoversKilled {
                    round_num,
                    count: ran.leftovers,
                },
            );
        }
        if ran.usage.turns > 0
            || ran.usage.input_tokens + ran.usage.output_tokens > 0
            || ran.usage.cost_usd > 0.0
        {
            self.emit(
                Some(step),
                &RoundEvent::AgentUsageRecorded {
                    round_num,
                    usage: ran.usage.clone(),
                },
            );
        }
    }

    /// What the agent's output says about the outside (an auth failure, a
    /// rate limit, a network blip, a repeated tool), recorded; the auth line and the rate limit.
    fn read_output(
        &self,
        ran: &agent::Ran,
        log: &std::path::Path,
        round_num: u64,
        duration_s: f64,
        was_transient: bool,
        step: &str,
    ) -> (Option<String>, Option<(String, Option<Timestamp>)>) {
        let cfg = &self.cfg;
        let outcome = ran.outcome;
        let tail = crate::detect::tail(log);
        let tail = format!("{tail}\n{}", ran.stderr_tail);
        let short_failure =
            ran.exit_code != Some(0) && outcome != Outcome::TimedOut && duration_s < 60.0;
        let auth_line = short_failure
            .then(|| crate::detect::auth_failure(&tail, &cfg.monitor.auth_fail))
            .flatten();
        if let Some(line) = &auth_line {
            self.emit(
                Some(step),
                &RoundEvent::AgentAuthErrorDetected {
                    round_num,
                    line: line.clone(),
                },
            );
        }
        let transient = (outcome != Outcome::Clean)
            .then(|| crate::detect::rate_limit(&tail, Timestamp::now()))
            .flatten();
        if let Some((line, at)) = &transient {
            self.emit(
                Some(step),
                &RoundEvent::TransientErrorDetected {
                    round_num,
                    class: "rate_limit".into(),
                    reset_at: at.map(|t| t.to_string()),
                    line: line.clone(),
                },
            );
        } else if was_transient && outcome == Outcome::Clean {
            self.emit(
                Some(step),
                &RoundEvent::TransientErrorRecovered { round_num },
            );
        }
        if short_failure && auth_line.is_none() {
            if let Some(line) = crate::detect::network_failure(&tail) {
                self.emit(
                    Some(step),
                    &RoundEvent::AgentNetworkBlip { round_num, line },
                );
            }
        }
        if let Some((cmd, n)) = crate::detect::repetitive(
            &ran.commands,
            cfg.monitor.repetitive_window,
            cfg.monitor.repetitive_threshold,
        ) {
            self.emit(
                Some(step),
                &RoundEvent::AnomalyRepetitiveTool {
                    round_num,
                    command: cmd,
                    count: n,
                },
            );
        }
        (auth_line, transient)
    }

    /// The tree after the agent: its `.agent-done`, the dirty tree's stash,
    /// whether HEAD moved (`(agent_done, stashed, new_commits)`).
    async fn settle_tree(
        &self,
        round_num: u64,
        phase_name: Option<&str>,
        outcome: Outcome,
        step: &str,
        head_before: Option<&str>,
    ) -> (Option<String>, Option<String>, bool) {
        let agent_done = self.take_agent_done();
        let stashed = self
            .handle_dirty(round_num, phase_name, outcome.as_str(), step)
            .await;
        if let Err(e) = self.outstanding_orphans().await {
            self.warn(format!("cannot check the outstanding stashes: {e}"));
        }
        let new_commits = match (head_before, self.git.head().await.ok()) {
            (Some(a), Some(b)) => a != b.as_str(),
            (None, Some(_)) => true,
            _ => false,
        };
        if let Some(reason) = &agent_done {
            self.emit(
                Some(step),
                &RoundEvent::AgentDone {
                    reason: reason.clone(),
                },
            );
        }
        (agent_done, stashed, new_commits)
    }

    /// The startup battery (skipped with `AGENT_RUNNER_SKIP_STARTUP_CHECK`).
    fn battery(&self) -> Result<(), RoundsError> {
        if std::env::var_os("AGENT_RUNNER_SKIP_STARTUP_CHECK").is_some() {
            return Ok(());
        }
        let checks = crate::battery::run(&self.cfg);
        let Some(code) = crate::battery::exit_code(&checks) else {
            return Ok(());
        };
        let failed: Vec<String> = checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {} (fix: {})", c.name, c.reason, c.how_to_fix))
            .collect();
        for f in &failed {
            self.emit(None, &RoundEvent::SmokeCheckFailed { reason: f.clone() });
        }
        let msg = format!("the startup battery failed:\n  {}", failed.join("\n  "));
        Err(if code == crate::exit::CONFIG {
            RoundsError::Config(msg)
        } else {
            RoundsError::Environment(msg)
        })
    }

    /// Write the round's end: the status (`running: false`) and `round_end`.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        running: &Status,
        round_num: u64,
        exit_code: Option<i32>,
        outcome: Outcome,
        duration_s: f64,
        step: &str,
        transient_active: bool,
    ) {
        let done = Status {
            transient_active,
            running: false,
            started_at: None,
            holder: None,
            last_completed_at: Some(belay_record::now_rfc3339()),
            last_exit_code: exit_code,
            last_duration_s: Some((duration_s * 1000.0).round() / 1000.0),
            last_outcome: Some(outcome.as_str().into()),
            ..running.clone()
        };
        if let Err(e) = state::write(self.log_dir(), state::STATUS_FILE, &done, &self.redactor()) {
            self.warn(format!("cannot write status.json: {e}"));
        }
        self.emit(
            Some(step),
            &RoundEvent::RoundEnd {
                round_num,
                exit_code,
                outcome: outcome.as_str().into(),
                duration_s,
            },
        );
        if let Err(e) = self.run.sink().sync() {
            self.warn(format!("cannot sync the event log: {e}"));
        }
    }

    /// The stashes a round left that are still in the stash list.
    async fn outstanding_orphans(&self) -> Result<OrphanState, RoundsError> {
        let mut st: OrphanState = state::read(self.log_dir(), state::ORPHAN_FILE)
            .map_err(|e| {
                self.emit(
                    None,
                    &RoundEvent::StatusRecovered {
                        reason: format!("orphan-state.json: {e}"),
                    },
                );
                e
            })
            .ok()
            .flatten()
            .unwrap_or_default();
        if st.stashes.is_empty() {
            return Ok(st);
        }
        let listed: Vec<String> = self
            .git
            .stash_list()
            .await?
            .into_iter()
            .map(|s| s.sha)
            .collect();
        let before = st.stashes.len();
        st.stashes.retain(|s| listed.contains(&s.sha));
        // Applied and dropped (by the agent or a human): no longer outstanding.
        if st.stashes.len() != before {
            state::write(self.log_dir(), state::ORPHAN_FILE, &st, &self.redactor())?;
        }
        Ok(st)
    }

    /// The agent's `.agent-done` sentinel in the work tree: read (200
    /// characters) as a regular file only, never through a link, then
    /// removed. One belay will not or cannot read (a link, a FIFO, an I/O
    /// error) still ends the loop.
    fn take_agent_done(&self) -> Option<String> {
        let root = &self.cfg.runtime.work_dir;
        let text = match belay_sandbox::hostfs::read(root, AGENT_DONE, 64 * 1024) {
            Ok(None) => return None,
            Ok(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
            // Present but unreadable (a link, a FIFO, mode 000): it still
            // ends the loop, as the stop file does.
            Err(_) => String::new(),
        };
        let _ = belay_sandbox::hostfs::remove(root, AGENT_DONE);
        let reason: String = text
            .trim()
            .chars()
            .filter(|c| !c.is_control())
            .take(200)
            .collect();
        Some(if reason.is_empty() {
            "the agent wrote .agent-done".into()
        } else {
            reason
        })
    }

    /// Keep the newest `round_log_retention` logs; prune at most as many as
    /// are kept per round (a lowered retention prunes gradually).
    fn prune_logs(&self, dir: &std::path::Path) {
        let keep = self.cfg.runtime.round_log_retention as usize;
        if keep == 0 {
            return;
        }
        // host-owned: the log dir's rounds, belay's own.
        let Ok(rd) = fs_err::read_dir(dir) else {
            return;
        };
        let mut logs: Vec<(std::time::SystemTime, std::path::PathBuf)> = rd
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        logs.sort();
        let excess = logs.len().saturating_sub(keep).min(keep);
        for (_, p) in logs.into_iter().take(excess) {
            let _ = fs_err::remove_file(p);
        }
    }
}

/// The agent's sentinel in the work tree: the loop is done.
const AGENT_DONE: &str = ".agent-done";

fn min_opt<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b < a { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// The status of round `round_num` while it runs.
fn running_status(
    status: &Status,
    round_num: u64,
    phase_name: &Option<String>,
    phase_index: usize,
    started_at: &str,
) -> Status {
    Status {
        round_num,
        running: true,
        current_phase: phase_name.clone(),
        phase_index,
        started_at: Some(started_at.to_string()),
        holder: belay_record::ProcessIdentity::current(),
        ..status.clone()
    }
}

/// Create the rounds dir and name this round's log in it, pointed at by
/// `round-current.log` (`(rounds_dir, log)`).
fn open_round_log(
    log_dir: &std::path::Path,
    round_num: u64,
    now: Timestamp,
) -> Result<(std::path::PathBuf, std::path::PathBuf), RoundsError> {
    let rounds_dir = log_dir.join("rounds");
    fs_err::create_dir_all(&rounds_dir)
        .map_err(|e| RoundsError::io("cannot create", &rounds_dir, e))?;
    let stamp = now.strftime("%Y%m%dT%H%M%S").to_string();
    let log = rounds_dir.join(format!("R{round_num}-{stamp}.log"));
    point_current(log_dir, &log);
    Ok((rounds_dir, log))
}

/// `round-current.log` points at the running round's log.
fn point_current(log_dir: &std::path::Path, log: &std::path::Path) {
    let link = log_dir.join("round-current.log");
    let tmp = log_dir.join(".round-current.log.tmp");
    let _ = fs_err::remove_file(&tmp);
    let rel = log.strip_prefix(log_dir).unwrap_or(log);
    if std::os::unix::fs::symlink(rel, &tmp).is_ok() {
        let _ = fs_err::rename(&tmp, &link);
    }
}
