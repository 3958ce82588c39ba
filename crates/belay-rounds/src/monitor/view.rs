//! What the monitor knows of the loop, folded from the event log as it
//! grows (read from where it stopped, never the whole file again), bounded
//! to the last rounds.

use std::collections::VecDeque;
use std::io::{BufRead, Seek, SeekFrom};
use std::path::Path;

use belay_record::Envelope;
use jiff::Timestamp;

/// Rounds kept for the rate detectors.
const KEEP_ROUNDS: usize = 20;

/// Call `f` for each complete event line of `path` from byte `offset`; the
/// offset after the last complete line. A torn last line waits for the next
/// read; a line that does not parse is skipped.
pub fn each_event(path: &Path, offset: u64, f: &mut dyn FnMut(&Envelope)) -> u64 {
    // host-owned: events.jsonl in the log dir, belay's own.
    let Ok(mut file) = fs_err::File::open(path) else {
        return offset;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    // A log shorter than what was read was replaced: read it again.
    let start = if len < offset { 0 } else { offset };
    if file.seek(SeekFrom::Start(start)).is_err() {
        return offset;
    }
    let mut r = std::io::BufReader::with_capacity(64 * 1024, file);
    let mut pos = start;
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if line.last() != Some(&b'\n') {
                    break;
                }
                pos += n as u64;
                if let Ok(e) = serde_json::from_slice::<Envelope>(&line) {
                    f(&e);
                }
            }
        }
    }
    pos
}

#[derive(Debug, Clone, Default)]
pub struct RoundRec {
    pub num: u64,
    pub outcome: String,
    pub exit_code: Option<i32>,
    pub duration_s: f64,
    pub auth: bool,
    pub network: bool,
    pub orphan: bool,
    pub repetitive: bool,
}

#[derive(Debug, Clone, Default)]
pub struct View {
    offset: u64,
    pub rounds: VecDeque<RoundRec>,
    /// A round started and not ended: its number, start and budget.
    pub open_round: Option<(u64, Timestamp, f64)>,
    current: Option<RoundRec>,
    /// The newest event that is not the monitor's own.
    pub last_event_at: Option<Timestamp>,
    /// The loop stopped on purpose (its last word was `serve_stopped`).
    pub serve_stopped: bool,
    /// The loop is waiting on purpose (a schedule pause, a rate-limit back-off).
    pub paused: bool,
    /// The newest rate limit's reset time, until a clean round recovers it.
    pub rate_limit_until: Option<Timestamp>,
    pub rate_limit_active: bool,
}

impl View {
    /// Read what the log gained since the last call.
    pub fn update(&mut self, events: &Path) {
        let mut evs = Vec::new();
        self.offset = each_event(events, self.offset, &mut |e| evs.push(e.clone()));
        for e in &evs {
            self.take(e);
        }
    }

    fn take(&mut self, e: &Envelope) {
        let at = e.at.parse::<Timestamp>().ok();
        let monitor_own = e.kind.starts_with("monitor_") || e.kind == "detector_error";
        if !monitor_own {
            self.last_event_at = at.or(self.last_event_at);
        }
        let num = e.data.get("round_num").and_then(|v| v.as_u64());
        match e.kind.as_str() {
            "serve_started" => {
                self.serve_stopped = false;
                self.paused = false;
                // A new serve is judged on its own rounds: an earlier
                // serve's auth failure or crash loop does not stop it.
                self.rounds.clear();
                self.current = None;
                self.open_round = None;
            }
            "serve_stopped" => self.serve_stopped = true,
            "schedule_paused" | "transient_error_backoff" => self.paused = true,
            "schedule_resumed" => self.paused = false,
            "round_start" => {
                self.paused = false;
                if let (Some(n), Some(at)) = (num, at) {
                    let budget = e
                        .data
                        .get("budget_s")
                        .and_then(|v| v.as_f64())
                        .unwrap_or(1800.0);
                    self.open_round = Some((n, at, budget));
                    self.current = Some(RoundRec {
                        num: n,
                        ..Default::default()
                    });
                }
            }
            "agent_auth_error_detected" => self.mark(|r| r.auth = true),
            "agent_network_blip" => self.mark(|r| r.network = true),
            "anomaly_repetitive_tool" => self.mark(|r| r.repetitive = true),
            "orphan_stashed" => self.mark(|r| r.orphan = true),
            "transient_error_detected" => {
                self.rate_limit_active = true;
                self.rate_limit_until = e
                    .data
                    .get("reset_at")
                    .and_then(|v| v.as_str())
                    .and_then(|s| s.parse().ok());
            }
            "transient_error_recovered" => self.rate_limit_active = false,
            "round_end" => {
                let mut r = self.current.take().unwrap_or_default();
                r.num = num.unwrap_or(r.num);
                r.outcome = e
                    .data
                    .get("outcome")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                r.exit_code = e
                    .data
                    .get("exit_code")
                    .and_then(|v| v.as_i64())
                    .map(|c| c as i32);
                r.duration_s = e
                    .data
                    .get("duration_s")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0);
                if self.open_round.is_some_and(|(n, _, _)| Some(n) == num) {
                    self.open_round = None;
                }
                self.rounds.push_back(r);
                while self.rounds.len() > KEEP_ROUNDS {
                    self.rounds.pop_front();
                }
            }
            _ => {}
        }
    }

    fn mark(&mut self, f: impl FnOnce(&mut RoundRec)) {
        if let Some(r) = self.current.as_mut() {
            f(r);
        } else if let Some(r) = self.rounds.back_mut() {
            // Recorded after the round's end (a stash of an interrupted round).
            f(r);
        }
    }

    /// The last `n` ended rounds.
    pub fn last(&self, n: usize) -> impl Iterator<Item = &RoundRec> {
        self.rounds.iter().skip(self.rounds.len().saturating_sub(n))
    }
}
