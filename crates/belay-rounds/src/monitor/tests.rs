//! Each of the 14 detectors, with its inputs forced: a synthetic event log
//! and synthetic host samples.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::io::Write;

use jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};

use super::detectors::{run_all, Inputs, Severity};
use super::health::Sample;
use super::view::View;
use super::Detector;

fn cfg() -> crate::config::MonitorConfig {
    let src = crate::config::Src {
        path: std::path::Path::new("t.toml"),
        text: "",
    };
    crate::config::MonitorConfig::resolve(&src, Default::default()).unwrap()
}

fn t0() -> Timestamp {
    "2026-12-01T10:00:00Z".parse().unwrap()
}

fn at(s: i64) -> Timestamp {
    t0().checked_add(SignedDuration::from_secs(s)).unwrap()
}

struct Log {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    seq: u64,
}

impl Log {
    fn new() -> Log {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        Log {
            _dir: dir,
            path,
            seq: 0,
        }
    }

    fn ev(&mut self, s: i64, kind: &str, data: Value) -> &mut Self {
        self.seq += 1;
        let line = json!({"v": 1, "seq": self.seq, "at": at(s).to_string(), "run_id": "r", "mode": "rounds", "source": "rounds", "kind": kind, "data": data});
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .unwrap();
        writeln!(f, "{line}").unwrap();
        self
    }

    /// A whole round ending with `outcome`, plus `marks` events inside it.
    fn round(
        &mut self,
        s: i64,
        n: u64,
        outcome: &str,
        exit: Option<i32>,
        marks: &[&str],
    ) -> &mut Self {
        self.ev(s, "round_start", json!({"round_num": n, "budget_s": 100.0}));
        for m in marks {
            self.ev(
                s,
                m,
                json!({"round_num": n, "reset_at": at(s + 3600).to_string()}),
            );
        }
        self.ev(
            s + 1,
            "round_end",
            json!({"round_num": n, "outcome": outcome, "exit_code": exit, "duration_s": 1.0}),
        )
    }

    fn view(&self) -> View {
        let mut v = View::default();
        v.update(&self.path);
        v
    }
}

fn sample(s: i64, disk: f64) -> Sample {
    Sample {
        at: at(s),
        disk_used_pct: Some(disk),
        inode_used_pct: Some(1.0),
        disk_path: "/d".into(),
        mem_free_mb: Some(4000.0),
        mem_avail_mb: Some(8000.0),
        swap_out_mb: Some(0.0),
        psi_some_avg10: Some(0.0),
        psi_full_avg10: Some(0.0),
    }
}

fn fired(view: &View, samples: &[Sample], now: i64) -> Vec<(Detector, Severity)> {
    let c = cfg();
    let samples: VecDeque<Sample> = samples.iter().cloned().collect();
    run_all(&Inputs {
        cfg: &c,
        view,
        samples: &samples,
        budget_s: 100.0,
        now: at(now),
    })
    .into_iter()
    .map(|f| (f.detector, f.severity))
    .collect()
}

fn only(view: &View, samples: &[Sample], now: i64) -> Vec<Detector> {
    fired(view, samples, now)
        .into_iter()
        .map(|(d, _)| d)
        .collect()
}

#[test]
fn a_quiet_healthy_loop_fires_nothing() {
    let mut l = Log::new();
    for n in 1..=12 {
        l.round(n as i64 * 10, n, "clean", Some(0), &[]);
    }
    assert_eq!(
        only(&l.view(), &[sample(100, 40.0), sample(130, 40.0)], 130),
        []
    );
}

#[test]
fn timeout_rate_needs_ten_rounds_and_a_fifth_of_them() {
    let mut l = Log::new();
    for n in 1..=9 {
        l.round(
            n as i64 * 10,
            n,
            if n <= 2 { "timed_out" } else { "clean" },
            None,
            &[],
        );
    }
    assert_eq!(only(&l.view(), &[], 100), [], "nine rounds are too few");
    l.round(100, 10, "clean", Some(0), &[]);
    assert_eq!(only(&l.view(), &[], 110), [Detector::TimeoutRate]);
}

#[test]
fn hung_is_a_round_without_an_end_past_one_and_a_half_budgets() {
    let mut l = Log::new();
    l.ev(0, "round_start", json!({"round_num": 1, "budget_s": 100.0}));
    assert_eq!(only(&l.view(), &[], 140), []);
    // The silence is also past the staleness threshold (1.5 budgets).
    assert_eq!(
        only(&l.view(), &[], 151),
        [Detector::Hung, Detector::SupervisorStale]
    );
}

#[test]
fn orphan_chain_is_three_rounds_in_a_row_that_left_a_stash() {
    let mut l = Log::new();
    l.round(0, 1, "clean", Some(0), &["orphan_stashed"]).round(
        10,
        2,
        "clean",
        Some(0),
        &["orphan_stashed"],
    );
    assert_eq!(only(&l.view(), &[], 20), []);
    l.round(20, 3, "clean", Some(0), &["orphan_stashed"]);
    assert_eq!(only(&l.view(), &[], 30), [Detector::OrphanChain]);
    l.round(30, 4, "clean", Some(0), &[]);
    assert_eq!(
        only(&l.view(), &[], 40),
        [],
        "a clean round breaks the chain"
    );
}

#[test]
fn disk_warning_critical_and_growth_over_a_real_window() {
    let v = Log::new().view();
    assert_eq!(
        fired(&v, &[sample(0, 91.0)], 0),
        [(Detector::DiskWarning, Severity::Warn)]
    );
    assert_eq!(
        fired(&v, &[sample(0, 96.0)], 0),
        [(Detector::DiskCritical, Severity::Critical)]
    );
    // +3 % in 60 s is +180 %/h, but a minute says nothing about an hour.
    assert_eq!(only(&v, &[sample(0, 50.0), sample(60, 53.0)], 60), []);
    // Over 20 minutes, +3 % is +9 %/h: growth.
    assert_eq!(
        only(&v, &[sample(0, 50.0), sample(1200, 53.0)], 1200),
        [Detector::DiskGrowth]
    );
    // A sample older than the window does not count.
    assert_eq!(
        only(
            &v,
            &[sample(0, 10.0), sample(3000, 40.0), sample(3060, 40.5)],
            3060
        ),
        []
    );
}

#[test]
fn the_memory_ladder_the_unavailable_signal_and_the_inert_gate() {
    let v = Log::new().view();
    let mut s = sample(0, 10.0);
    s.psi_full_avg10 = Some(70.0);
    assert_eq!(
        fired(&v, &[s.clone()], 0),
        [
            (Detector::MemPressure, Severity::Critical),
            (Detector::MemPressureGateInert, Severity::Warn)
        ]
    );
    s.psi_full_avg10 = Some(0.0);
    s.psi_some_avg10 = Some(8.0);
    s.mem_avail_mb = Some(100.0);
    assert_eq!(
        fired(&v, &[s.clone()], 0),
        [(Detector::MemPressure, Severity::Warn)]
    );
    let mut a = sample(0, 10.0);
    let mut b = sample(30, 10.0);
    a.swap_out_mb = Some(100.0);
    b.swap_out_mb = Some(200.0);
    b.mem_free_mb = Some(8.0);
    b.mem_avail_mb = Some(100.0);
    assert_eq!(
        fired(&v, &[a, b], 30),
        [(Detector::MemPressure, Severity::Critical)]
    );
    let mut none = sample(0, 10.0);
    none.psi_some_avg10 = None;
    none.psi_full_avg10 = None;
    none.swap_out_mb = None;
    none.mem_free_mb = None;
    assert_eq!(only(&v, &[none], 0), [Detector::MemSignalUnavailable]);
}

#[test]
fn auth_and_network_failures_are_a_fifth_of_the_last_ten_rounds() {
    let mut l = Log::new();
    for n in 1..=4 {
        l.round(n as i64 * 10, n, "clean", Some(0), &[]);
    }
    l.round(50, 5, "failed", Some(1), &["agent_auth_error_detected"]);
    assert_eq!(
        fired(&l.view(), &[], 60),
        [(Detector::OauthFail, Severity::Critical)]
    );
    let mut l = Log::new();
    l.round(0, 1, "failed", Some(1), &["agent_network_blip"]);
    assert_eq!(only(&l.view(), &[], 10), [Detector::NetworkFail]);
}

#[test]
fn a_rate_limit_is_active_until_its_reset_or_a_recovery() {
    let mut l = Log::new();
    l.round(0, 1, "failed", Some(1), &["transient_error_detected"]);
    assert_eq!(only(&l.view(), &[], 10), [Detector::RateLimitActive]);
    assert!(
        !only(&l.view(), &[], 4000).contains(&Detector::RateLimitActive),
        "past its reset time"
    );
    l.round(20, 2, "clean", Some(0), &["transient_error_recovered"]);
    assert_eq!(only(&l.view(), &[], 30), []);
}

#[test]
fn a_repetitive_tool_loop_in_the_last_five_rounds() {
    let mut l = Log::new();
    l.round(0, 1, "clean", Some(0), &["anomaly_repetitive_tool"]);
    assert_eq!(
        only(&l.view(), &[], 10),
        [Detector::AnomalyRepetitiveActive]
    );
    for n in 2..=6 {
        l.round(n as i64 * 10, n, "clean", Some(0), &[]);
    }
    assert_eq!(only(&l.view(), &[], 70), []);
}

#[test]
fn stale_means_silence_past_the_threshold_but_not_a_deliberate_stop_or_pause() {
    let mut l = Log::new();
    l.ev(0, "serve_started", json!({}))
        .round(1, 1, "clean", Some(0), &[]);
    assert_eq!(only(&l.view(), &[], 140), []);
    assert_eq!(only(&l.view(), &[], 160), [Detector::SupervisorStale]);
    l.ev(2, "schedule_paused", json!({"reason": "night"}));
    assert_eq!(only(&l.view(), &[], 160), [], "paused on purpose");
    l.ev(3, "serve_stopped", json!({"reason": "SIGTERM"}));
    assert_eq!(only(&l.view(), &[], 1000), [], "stopped on purpose");
}

#[test]
fn every_detector_has_a_name_that_parses_back() {
    for d in Detector::ALL {
        assert_eq!(d.as_str().parse::<Detector>().unwrap(), d);
    }
    assert_eq!(
        "auth_fail".parse::<Detector>().unwrap(),
        Detector::OauthFail
    );
    assert!("nope"
        .parse::<Detector>()
        .unwrap_err()
        .contains("timeout_rate"));
}
