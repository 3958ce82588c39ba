//! The peer's 14 detectors, with its defaults, over the [`View`] and the
//! host samples. Each finding names its episode: the same episode is
//! reported once, however many ticks it lasts.

use std::collections::VecDeque;

use jiff::Timestamp;
use serde::Serialize;

use super::health::Sample;
use super::view::View;
use super::Detector;
use crate::config::MonitorConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warn,
    Critical,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub detector: Detector,
    pub severity: Severity,
    pub message: String,
    /// What makes two ticks the same episode.
    pub episode: String,
}

/// What the detectors read.
pub struct Inputs<'a> {
    pub cfg: &'a MonitorConfig,
    pub view: &'a View,
    pub samples: &'a VecDeque<Sample>,
    pub budget_s: f64,
    pub now: Timestamp,
}

fn secs(a: Timestamp, b: Timestamp) -> f64 {
    (b.as_millisecond() - a.as_millisecond()) as f64 / 1000.0
}

/// Share of the last `n` rounds for which `f` holds (needs `min` rounds).
fn share(
    v: &View,
    n: usize,
    min: usize,
    f: impl Fn(&super::view::RoundRec) -> bool,
) -> Option<(usize, usize)> {
    let rounds: Vec<_> = v.last(n).collect();
    if rounds.len() < min {
        return None;
    }
    let hits = rounds.iter().filter(|r| f(r)).count();
    (hits * 5 >= rounds.len() && hits > 0).then_some((hits, rounds.len()))
}

pub fn run_all(i: &Inputs<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    round_detectors(i, &mut out);
    if let Some(s) = i.samples.back() {
        disk_detectors(i, s, &mut out);
        memory_detectors(i, s, &mut out);
    }
    loop_detectors(i, &mut out);
    out
}

/// Add a finding.
fn push(out: &mut Vec<Finding>, d: Detector, s: Severity, message: String, episode: String) {
    out.push(Finding {
        detector: d,
        severity: s,
        message,
        episode,
    })
}

/// The number of the first of the last 10 rounds for which `f` holds (`0`: none).
fn first_of(v: &View, f: &dyn Fn(&super::view::RoundRec) -> bool) -> String {
    v.last(10)
        .find(|r| f(r))
        .map(|r| r.num)
        .unwrap_or(0)
        .to_string()
}

/// The rounds: the timeout rate, a hung round, a chain of dirty trees.
fn round_detectors(i: &Inputs<'_>, out: &mut Vec<Finding>) {
    let v = i.view;
    if let Some((h, n)) = share(v, 10, 10, |r| r.outcome == "timed_out") {
        push(
            out,
            Detector::TimeoutRate,
            Severity::Warn,
            format!("{h} of the last {n} rounds ran over their budget"),
            first_of(v, &|r| r.outcome == "timed_out"),
        );
    }
    if let Some((n, started, budget)) = v.open_round {
        let age = secs(started, i.now);
        if age > 1.5 * budget {
            push(
                out,
                Detector::Hung,
                Severity::Warn,
                format!(
                    "round {n} started {age:.0} s ago and has not ended (budget {budget:.0} s)"
                ),
                n.to_string(),
            );
        }
    }
    let streak: Vec<_> = v.rounds.iter().rev().take_while(|r| r.orphan).collect();
    if streak.len() >= 3 {
        let first = streak.last().map(|r| r.num).unwrap_or(0);
        push(
            out,
            Detector::OrphanChain,
            Severity::Warn,
            format!(
                "{} rounds in a row left a dirty tree (stashed); the agent is not committing",
                streak.len()
            ),
            first.to_string(),
        );
    }
}

/// The disk of the last sample: its fill, and its growth over the window.
fn disk_detectors(i: &Inputs<'_>, s: &Sample, out: &mut Vec<Finding>) {
    let c = i.cfg;
    if let Some(d) = s.disk_used_pct {
        if d >= c.disk_critical_pct {
            push(
                out,
                Detector::DiskCritical,
                Severity::Critical,
                format!(
                    "the disk of {} is {d:.1} % full (critical at {:.0} %)",
                    s.disk_path, c.disk_critical_pct
                ),
                s.disk_path.clone(),
            );
        } else if d >= c.disk_warning_pct {
            push(
                out,
                Detector::DiskWarning,
                Severity::Warn,
                format!(
                    "the disk of {} is {d:.1} % full (warning at {:.0} %)",
                    s.disk_path, c.disk_warning_pct
                ),
                s.disk_path.clone(),
            );
        }
    }
    // Growth: over the oldest sample in the window, and never over less
    // than the minimum span (a few minutes say nothing about an hour).
    if let Some(old) = i
        .samples
        .iter()
        .find(|o| secs(o.at, s.at) <= c.growth_window_s)
    {
        let span = secs(old.at, s.at);
        if span >= c.growth_min_span_s && span > 0.0 {
            let rate =
                |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a) / span * 3600.0);
            let disk =
                rate(old.disk_used_pct, s.disk_used_pct).filter(|r| *r >= c.disk_growth_pct_per_hr);
            let inode = rate(old.inode_used_pct, s.inode_used_pct)
                .filter(|r| *r >= c.inode_growth_pct_per_hr);
            if let Some(r) = disk.or(inode) {
                let what = if disk.is_some() { "space" } else { "inodes" };
                push(
                    out,
                    Detector::DiskGrowth,
                    Severity::Warn,
                    format!(
                        "disk {what} of {} grows {r:.1} %/h over the last {span:.0} s",
                        s.disk_path
                    ),
                    format!("{}:{what}", s.disk_path),
                );
            }
        }
    }
}

/// Memory in the last sample: the peer's ladder, an inert admission gate, no signal at all.
fn memory_detectors(i: &Inputs<'_>, s: &Sample, out: &mut Vec<Finding>) {
    let c = i.cfg;
    // Memory: the peer's ladder.
    let prev = i.samples.iter().rev().nth(1);
    let swap_delta = prev
        .and_then(|p| p.swap_out_mb.zip(s.swap_out_mb))
        .map(|(a, b)| b - a);
    let mut pressure = None;
    if let Some(full) = s.psi_full_avg10.filter(|f| *f >= c.full_avg10_critical) {
        pressure = Some((
            Severity::Critical,
            format!(
                "memory pressure: PSI full avg10 {full:.1} (critical at {:.0})",
                c.full_avg10_critical
            ),
        ));
    } else if let Some(some) = s.psi_some_avg10.filter(|f| *f >= c.some_avg10_warning) {
        pressure = Some((
            Severity::Warn,
            format!(
                "memory pressure: PSI some avg10 {some:.1} (warning at {:.0})",
                c.some_avg10_warning
            ),
        ));
    } else if let Some(d) = swap_delta.filter(|d| *d > c.swap_out_noise_floor_mb) {
        let crit = s.mem_free_mb.is_some_and(|f| f < c.free_low_mb);
        pressure = Some((
            if crit {
                Severity::Critical
            } else {
                Severity::Warn
            },
            format!("{d:.0} MiB swapped out since the last sample"),
        ));
    } else if s.mem_free_mb.is_some_and(|f| f < c.free_low_mb)
        && s.mem_avail_mb.is_some_and(|a| a < c.avail_min_mb)
    {
        pressure = Some((
            Severity::Warn,
            format!(
                "memory low: {:.0} MiB free, {:.0} MiB available",
                s.mem_free_mb.unwrap_or(0.0),
                s.mem_avail_mb.unwrap_or(0.0)
            ),
        ));
    }
    if let Some((sev, msg)) = &pressure {
        push(
            out,
            Detector::MemPressure,
            *sev,
            msg.clone(),
            format!("{sev:?}"),
        );
        if s.mem_avail_mb.is_some_and(|a| a >= c.avail_min_mb)
            && (s.psi_some_avg10.is_some() || swap_delta.is_some())
        {
            push(out, Detector::MemPressureGateInert, Severity::Warn, format!("{msg}, yet {:.0} MiB is available: an admission gate on MemAvailable would not see it", s.mem_avail_mb.unwrap_or(0.0)), "inert".into());
        }
    }
    if s.psi_some_avg10.is_none() && s.swap_out_mb.is_none() && s.mem_free_mb.is_none() {
        push(
            out,
            Detector::MemSignalUnavailable,
            Severity::Warn,
            "no memory signal: no PSI, no swap counters, no MemFree".into(),
            "none".into(),
        );
    }
}

/// The loop: authentication and network failures, a rate limit, a
/// repeated tool, a supervisor gone quiet.
fn loop_detectors(i: &Inputs<'_>, out: &mut Vec<Finding>) {
    let v = i.view;
    let c = i.cfg;
    if let Some((h, n)) = share(v, 10, 1, |r| r.auth) {
        let hint = if c.auth_fail_hint.is_empty() {
            String::new()
        } else {
            format!(" {}", c.auth_fail_hint)
        };
        push(out, Detector::OauthFail, Severity::Critical, format!("{h} of the last {n} rounds failed authentication: every round burns quota for nothing.{hint}"), first_of(v, &|r| r.auth));
    }
    if let Some((h, n)) = share(v, 10, 1, |r| r.network) {
        push(
            out,
            Detector::NetworkFail,
            Severity::Warn,
            format!("{h} of the last {n} rounds ended on a network failure"),
            first_of(v, &|r| r.network),
        );
    }
    if v.rate_limit_active && v.rate_limit_until.is_none_or(|t| t > i.now) {
        let until = v
            .rate_limit_until
            .map(|t| t.to_string())
            .unwrap_or_else(|| "an unknown time".into());
        push(
            out,
            Detector::RateLimitActive,
            Severity::Warn,
            format!("the agent is rate limited until {until}"),
            until,
        );
    }
    if v.last(5).any(|r| r.repetitive) {
        push(
            out,
            Detector::AnomalyRepetitiveActive,
            Severity::Warn,
            "the agent repeated one tool call past the threshold in the last 5 rounds".into(),
            first_of(v, &|r| r.repetitive),
        );
    }
    if let (Some(threshold), Some(last)) = (c.stale_after_s(i.budget_s), v.last_event_at) {
        let age = secs(last, i.now);
        // A loop stopped or paused on purpose is quiet, not stale.
        if age > threshold && !v.serve_stopped && !v.paused {
            push(
                out,
                Detector::SupervisorStale,
                Severity::Warn,
                format!("no event for {age:.0} s (threshold {threshold:.0} s): is serve running?"),
                last.to_string(),
            );
        }
    }
}
