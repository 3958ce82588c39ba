//! `serve`: rounds one after another in this one process, the monitor
//! included. Before each round, in order: a stop request, the stop file,
//! `max_rounds`, the schedule, a rate-limit pause. After it: the breakers
//! (a crash loop, rounds without progress), then the restart delay.
//! SIGTERM finishes the round and exits 0; a second one (or `kill`) stops
//! the round now, records it as killed, and exits 130.

use std::ops::ControlFlow;
use std::time::Duration;

use jiff::Timestamp;

use crate::config::TransientAction;
use crate::events::RoundEvent;
use crate::round::{Outcome, RoundOptions, RoundOutcome};
use crate::supervisor::Supervisor;
use crate::RoundsError;

pub const SERVE_PID_FILE: &str = "serve.pid";

/// Consecutive rounds that trip a breaker.
const BREAKER_ROUNDS: u32 = 5;
/// A failing round shorter than this counts toward the crash loop.
const CRASH_ROUND_S: f64 = 60.0;
/// A clean round shorter than this, without usage or commits, makes no progress.
const STALL_ROUND_S: f64 = 30.0;
const MAX_DELAY_S: f64 = 1800.0;

#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    pub once: bool,
    pub max_rounds: Option<u64>,
    pub ignore_schedule: bool,
    /// Run the monitor inside serve (the default).
    pub monitor: bool,
}

#[derive(Debug, Clone)]
pub struct ServeEnd {
    pub exit_code: u8,
    pub reason: String,
    pub rounds: u64,
}

/// Stop requests: the one token's first level stops after the round, its
/// second (`Stop::wait_now`) at once.
use belay_record::Stop;

/// Sleep `d`, or less when a stop comes. Whether a stop came.
async fn sleep_or_stop(d: Duration, stops: &Stop) -> bool {
    if stops.is_set() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stops.wait() => true,
    }
}

fn until(t: Timestamp) -> Duration {
    let ms = t.as_millisecond() - Timestamp::now().as_millisecond();
    Duration::from_millis(ms.max(0) as u64)
}

impl Supervisor {
    pub async fn serve(&self, o: ServeOptions, stops: &Stop) -> Result<ServeEnd, RoundsError> {
        let cfg = &self.cfg;
        let log_dir = self.log_dir().to_path_buf();
        let pid_file = log_dir.join(SERVE_PID_FILE);
        if let Some(id) = belay_record::ProcessIdentity::current() {
            let text = serde_json::to_string(&id).unwrap_or_default();
            belay_record::atomic_write(&pid_file, text.as_bytes())?;
        }
        let max_rounds = o.max_rounds.or(cfg.runtime.max_rounds);
        self.emit(
            None,
            &RoundEvent::ServeStarted {
                pid: std::process::id(),
                config: cfg.path.display().to_string(),
                max_rounds,
            },
        );
        let poke = std::sync::Arc::new(tokio::sync::Notify::new());
        let monitor = o.monitor.then(|| self.spawn_monitor(stops, poke.clone()));
        let end = self.serve_loop(&o, max_rounds, stops, &poke).await;
        if let Some(m) = monitor {
            m.abort();
        }
        let _ = fs_err::remove_file(&pid_file);
        let end = match end {
            Ok(e) => e,
            Err(e) => ServeEnd {
                exit_code: e.exit_code(),
                reason: e.to_string(),
                rounds: 0,
            },
        };
        self.emit(
            None,
            &RoundEvent::ServeStopped {
                reason: end.reason.clone(),
                exit_code: end.exit_code,
                rounds: end.rounds,
            },
        );
        let _ = self.run.sink().sync();
        self.close_env().await;
        self.end_run(
            match end.exit_code {
                crate::exit::OK => belay_record::RunStatus::Ok,
                crate::exit::INTERRUPTED => belay_record::RunStatus::Interrupted,
                _ => belay_record::RunStatus::Failed,
            },
            &format!("{} round(s): {}", end.rounds, end.reason),
        );
        Ok(end)
    }

    async fn serve_loop(
        &self,
        o: &ServeOptions,
        max_rounds: Option<u64>,
        stops: &Stop,
        poke: &tokio::sync::Notify,
    ) -> Result<ServeEnd, RoundsError> {
        let cfg = &self.cfg;
        let delay = Duration::from_secs_f64(cfg.runtime.restart_delay_s);
        let mut rounds = 0u64;
        let mut crashes = 0u32;
        let mut stalls = 0u32;
        let mut backoff_s = 60.0f64;
        let mut paused_reported = false;
        loop {
            if let Some(end) = self.stop_before_round(stops, max_rounds, rounds) {
                return Ok(end);
            }
            if !o.ignore_schedule && self.outside_schedule(stops, &mut paused_reported).await {
                continue;
            }
            let phase = self.phase_for_schedule(o.ignore_schedule).await;
            let kill = stops.clone();
            let result = self
                .round(RoundOptions {
                    phase: phase.as_deref(),
                    kill: Some(kill),
                })
                .await;
            let r: RoundOutcome = match result {
                Ok(r) => r,
                Err(e) => match self.not_started(e, o.once, delay, stops, rounds).await {
                    Some(end) => return Ok(end),
                    None => continue,
                },
            };
            rounds += 1;
            // The monitor looks at the round at once (an auth failure stops
            // the loop before the next round burns quota).
            poke.notify_one();
            if let Some(end) = round_ends_loop(&r, o.once, rounds) {
                return Ok(end);
            }
            // Breakers.
            if let Some(end) = self.breakers(&r, &mut crashes, &mut stalls, rounds) {
                return Ok(end);
            }
            // The last round: no restart delay before saying so.
            if let Some(end) = self.max_rounds_reached(max_rounds, rounds) {
                return Ok(end);
            }
            // The next start: a rate-limit pause, a crash back-off, or the delay.
            let wait = match self.next_wait(&r, delay, crashes, &mut backoff_s, rounds) {
                ControlFlow::Continue(wait) => wait,
                ControlFlow::Break(end) => return Ok(end),
            };
            if sleep_or_stop(wait, stops).await {
                continue;
            }
        }
    }

    /// Before a round: a stop request, the stop file, `max_rounds` end the loop.
    fn stop_before_round(
        &self,
        stops: &Stop,
        max_rounds: Option<u64>,
        rounds: u64,
    ) -> Option<ServeEnd> {
        if let Some(why) = stops.reason() {
            return Some(serve_end(crate::exit::OK, why, rounds));
        }
        if let Some(f) = &self.cfg.runtime.stop_file {
            if let Some(reason) = self.stop_requested(f) {
                self.emit(
                    None,
                    &RoundEvent::StopFileDetected {
                        path: f.display().to_string(),
                        reason,
                    },
                );
                return Some(serve_end(
                    crate::exit::OK,
                    format!("the stop file {} exists", f.display()),
                    rounds,
                ));
            }
        }
        self.max_rounds_reached(max_rounds, rounds)
    }

    /// `max_rounds` reached: recorded, the loop's end.
    fn max_rounds_reached(&self, max_rounds: Option<u64>, rounds: u64) -> Option<ServeEnd> {
        let m = max_rounds.filter(|m| rounds >= *m)?;
        self.emit(None, &RoundEvent::MaxRoundsReached { max_rounds: m });
        Some(serve_end(
            crate::exit::OK,
            format!("max_rounds ({m}) reached"),
            rounds,
        ))
    }

    /// Outside the schedule: the pause reported once, then a wait (at most
    /// 5 minutes, less on a stop). Whether the round must wait (the loop goes on).
    async fn outside_schedule(&self, stops: &Stop, paused_reported: &mut bool) -> bool {
        let cfg = &self.cfg;
        if let Err(why) = cfg.schedule.check(Timestamp::now()) {
            let next = cfg.schedule.next_open(Timestamp::now());
            if !*paused_reported {
                self.emit(
                    None,
                    &RoundEvent::SchedulePaused {
                        reason: why.to_string(),
                        until: next.map(|t| t.to_string()),
                    },
                );
                *paused_reported = true;
            }
            let wait = next
                .map(until)
                .unwrap_or(Duration::from_secs(3600))
                .max(Duration::from_secs(1));
            sleep_or_stop(wait.min(Duration::from_secs(300)), stops).await;
            return true;
        }
        if *paused_reported {
            self.emit(None, &RoundEvent::ScheduleResumed {});
            *paused_reported = false;
        }
        false
    }

    /// A round that did not start: the loop's end, or `None` after a wait
    /// (not ready: twice the delay, or until the next UTC day for a day limit).
    async fn not_started(
        &self,
        e: RoundsError,
        once: bool,
        delay: Duration,
        stops: &Stop,
        rounds: u64,
    ) -> Option<ServeEnd> {
        match e {
            RoundsError::Config(m) => Some(serve_end(crate::exit::CONFIG, m, rounds)),
            // The agent cannot be started as configured (its program is not
            // there, its spec is wrong): waiting does not fix that.
            RoundsError::Agent(a)
                if belay_record::Classify::exit_class(&a) == belay_record::ExitClass::Usage =>
            {
                let msg = format!("the agent cannot start: {a}; fix [agent] in the config");
                self.emit(
                    None,
                    &RoundEvent::RoundNotStarted {
                        reason: msg.clone(),
                    },
                );
                Some(serve_end(crate::exit::CONFIG, msg, rounds))
            }
            e @ RoundsError::Environment(_)
            | e @ RoundsError::Record(_)
            | e @ RoundsError::Sandbox(_)
            | e @ RoundsError::Agent(_) => {
                // Not ready (another agent in the repository, no engine,
                // a limit spent): wait twice the delay, then try again.
                let msg = e.to_string();
                self.emit(
                    None,
                    &RoundEvent::RoundNotStarted {
                        reason: msg.clone(),
                    },
                );
                if once {
                    return Some(serve_end(e.exit_code(), msg, rounds));
                }
                let wait = if msg.contains("00:00 UTC") {
                    next_utc_day()
                } else {
                    delay * 2
                };
                sleep_or_stop(wait, stops).await;
                None
            }
            e => Some(serve_end(e.exit_code(), e.to_string(), rounds)),
        }
    }

    /// The breakers after a round: a crash loop, rounds without progress.
    fn breakers(
        &self,
        r: &RoundOutcome,
        crashes: &mut u32,
        stalls: &mut u32,
        rounds: u64,
    ) -> Option<ServeEnd> {
        let failing = r.exit_code != Some(0)
            && !matches!(r.outcome, Outcome::Clean | Outcome::GraceKilled)
            && r.duration_s < CRASH_ROUND_S
            && r.transient.is_none();
        *crashes = if failing { *crashes + 1 } else { 0 };
        let no_usage = r.usage.turns == 0 && r.usage.input_tokens + r.usage.output_tokens == 0;
        // Only an agent that reports usage can be judged by its absence
        // (the peer's rule): a plain command's silence is not a stall.
        let stalled = r.usage_capable
            && r.outcome == Outcome::Clean
            && r.duration_s < STALL_ROUND_S
            && no_usage
            && !r.new_commits
            && r.stashed.is_none();
        *stalls = if stalled { *stalls + 1 } else { 0 };
        let (crashes, stalls) = (*crashes, *stalls);
        if crashes >= BREAKER_ROUNDS {
            self.emit(
                None,
                &RoundEvent::CrashLoop {
                    rounds: crashes,
                    delay_s: 0.0,
                    tripped: true,
                },
            );
            return Some(serve_end(crate::exit::BREAKER, format!("crash loop: {crashes} rounds in a row failed within {CRASH_ROUND_S:.0} s; read the round logs, fix, then start again"), rounds));
        }
        if stalls >= BREAKER_ROUNDS {
            self.emit(None, &RoundEvent::StalledNoProgress { rounds: stalls });
            return Some(serve_end(crate::exit::BREAKER, format!("no progress: {stalls} short clean rounds with no usage, no commits and no changes"), rounds));
        }
        None
    }

    /// The wait before the next round (a rate-limit pause, a crash back-off,
    /// or the delay), or the loop's end (`transient_error_action = stop`).
    fn next_wait(
        &self,
        r: &RoundOutcome,
        delay: Duration,
        crashes: u32,
        backoff_s: &mut f64,
        rounds: u64,
    ) -> ControlFlow<ServeEnd, Duration> {
        let cfg = &self.cfg;
        let mut wait = delay;
        if let Some((class, reset)) = &r.transient {
            match cfg.runtime.transient_error_action {
                TransientAction::Stop => {
                    return ControlFlow::Break(serve_end(
                        crate::exit::OK,
                        format!("{class}: transient_error_action = stop"),
                        rounds,
                    ))
                }
                TransientAction::Skip => {}
                TransientAction::BackOff => wait = self.back_off(class, reset, backoff_s),
            }
        } else {
            *backoff_s = 60.0;
        }
        if crashes > 0 {
            let d = (cfg.runtime.restart_delay_s * 2f64.powi(crashes as i32)).min(MAX_DELAY_S);
            self.emit(
                None,
                &RoundEvent::CrashLoop {
                    rounds: crashes,
                    delay_s: d,
                    tripped: false,
                },
            );
            wait = wait.max(Duration::from_secs_f64(d));
        }
        ControlFlow::Continue(wait)
    }

    /// A rate limit's pause: until its reset, else the back-off (doubled
    /// for the next), with jitter; recorded.
    fn back_off(&self, class: &str, reset: &Option<String>, backoff_s: &mut f64) -> Duration {
        // Jitter: up to a tenth of the wait, at most 30 s (many
        // loops sharing a quota do not all resume at once).
        let jitter = |w: Duration| {
            let cap = (w.as_millis() as u64 / 10).clamp(1, 30_000);
            w + Duration::from_millis(fastrand::u64(0..cap))
        };
        let wait = match reset.as_deref().and_then(|t| t.parse::<Timestamp>().ok()) {
            Some(t) if t > Timestamp::now() => jitter(until(t)),
            _ => {
                let w = jitter(Duration::from_secs_f64(*backoff_s));
                *backoff_s = (*backoff_s * 2.0).min(MAX_DELAY_S);
                w
            }
        };
        let at = Timestamp::now()
            .checked_add(jiff::SignedDuration::try_from(wait).unwrap_or_default())
            .unwrap_or(Timestamp::now());
        self.emit(
            None,
            &RoundEvent::TransientErrorBackoff {
                until: at.to_string(),
                class: class.to_string(),
            },
        );
        wait
    }

    /// Whether the stop file asks the loop to stop, with its reason (the
    /// first 200 characters). The agent can write it when it is in the work
    /// tree: it is read only as a regular file of its own (never through a
    /// link, at most 4 KiB, opened without waiting, so a FIFO or `/dev/zero`
    /// cannot hold serve). One that is there but refused still stops the
    /// loop; only why is recorded, never what it leads to.
    fn stop_requested(&self, f: &std::path::Path) -> Option<String> {
        match crate::trusted::read_prefix(&self.cfg.runtime.work_dir, f, 4096) {
            Ok(None) => None,
            Ok(Some((_, b))) => Some(
                String::from_utf8_lossy(&b)
                    .chars()
                    .take(200)
                    .collect::<String>()
                    .trim()
                    .to_string(),
            ),
            Err(e) => {
                self.emit(
                    None,
                    &RoundEvent::StopFileRefused {
                        path: f.display().to_string(),
                        error: e.to_string(),
                    },
                );
                Some(String::new())
            }
        }
    }

    /// The phase to run when phase schedules say the rotation's phase is
    /// closed and the policy is `skip`: the next open one. `None`: the
    /// rotation's own.
    async fn phase_for_schedule(&self, ignore: bool) -> Option<String> {
        let cfg = &self.cfg;
        if ignore || cfg.phases.iter().all(|p| p.schedule.is_none()) {
            return None;
        }
        let status: crate::state::Status =
            crate::state::read(self.log_dir(), crate::state::STATUS_FILE)
                .ok()
                .flatten()
                .unwrap_or_default();
        let n = status.round_num + 1;
        let now = Timestamp::now();
        let (i, p) = cfg.phase_of(n)?;
        if p.schedule.as_ref().is_none_or(|s| s.check(now).is_ok()) {
            return None;
        }
        if cfg.phase_policy == crate::config::PhasePolicy::Wait {
            return None;
        }
        let len = cfg.phases.len();
        for k in 1..len {
            let q = &cfg.phases[(i + k) % len];
            if q.schedule.as_ref().is_none_or(|s| s.check(now).is_ok()) {
                self.emit(
                    None,
                    &RoundEvent::SchedulePhaseSkipped {
                        phase: p.name.clone(),
                        reason: format!("outside its schedule; running {}", q.name),
                    },
                );
                return Some(q.name.clone());
            }
        }
        None
    }

    /// The monitor inside serve: a task on this process's runtime.
    fn spawn_monitor(
        &self,
        stops: &Stop,
        poke: std::sync::Arc<tokio::sync::Notify>,
    ) -> tokio::task::JoinHandle<()> {
        let mut m = crate::monitor::Monitor::new(&self.cfg);
        let sink = self.run.sink().clone();
        let interval = Duration::from_secs_f64(self.cfg.monitor.interval_s);
        let stops = stops.clone();
        // Every event told as it is recorded, as the rounds' own are.
        let obs = self.observer.clone();
        tokio::spawn(async move {
            let _ = sink.emit_to(
                "monitor",
                None,
                &RoundEvent::MonitorStarted {
                    mode: "serve".into(),
                    interval_s: interval.as_secs_f64(),
                },
                &*obs,
            );
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = poke.notified() => {}
                }
                let tick = m.tick(Timestamp::now());
                for f in &tick.new {
                    let _ = sink.emit_to(
                        "monitor",
                        None,
                        &RoundEvent::MonitorAlertEmitted {
                            detector: f.detector.as_str().into(),
                            severity: format!("{:?}", f.severity).to_lowercase(),
                            message: f.message.clone(),
                        },
                        &*obs,
                    );
                }
                for d in &tick.cleared {
                    let _ = sink.emit_to(
                        "monitor",
                        None,
                        &RoundEvent::MonitorAlertCleared {
                            detector: d.as_str().into(),
                        },
                        &*obs,
                    );
                }
                if let Some(f) = tick.stop {
                    let draining = m.view().open_round.is_some();
                    stops.trip(format!(
                        "the monitor stopped the loop: {}: {}",
                        f.detector.as_str(),
                        f.message
                    ));
                    let _ = sink.emit_to(
                        "monitor",
                        None,
                        &RoundEvent::MonitorAutoStopTriggered {
                            detector: f.detector.as_str().into(),
                            draining,
                        },
                        &*obs,
                    );
                }
            }
        })
    }
}

/// The loop's end.
fn serve_end(exit_code: u8, reason: String, rounds: u64) -> ServeEnd {
    ServeEnd {
        exit_code,
        reason,
        rounds,
    }
}

/// After a round: a killed round, the agent's `.agent-done`, `--once` end the loop.
fn round_ends_loop(r: &RoundOutcome, once: bool, rounds: u64) -> Option<ServeEnd> {
    if r.outcome == Outcome::Killed {
        return Some(serve_end(
            crate::exit::INTERRUPTED,
            "stopped now: the round was killed".into(),
            rounds,
        ));
    }
    if let Some(reason) = &r.agent_done {
        return Some(serve_end(
            crate::exit::OK,
            format!("the agent is done: {reason}"),
            rounds,
        ));
    }
    if once {
        return Some(serve_end(
            r.outcome.exit_code(),
            format!("one round ({})", r.outcome.as_str()),
            rounds,
        ));
    }
    None
}

fn next_utc_day() -> Duration {
    let now = Timestamp::now().as_second();
    let next = (now / 86400 + 1) * 86400;
    Duration::from_secs((next - now).max(1) as u64 + 5)
}
