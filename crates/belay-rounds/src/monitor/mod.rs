//! The monitor: the peer's 14 detectors over the event log and host
//! samples, each episode reported once, auto-stop on the configured list.
//! It runs inside `serve` (no process of its own) and as `belay rounds
//! monitor` for its own unit.

pub mod detectors;
pub mod health;
pub mod http;
pub mod view;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use jiff::Timestamp;
use serde::Serialize;

pub use detectors::{Finding, Severity};

use crate::config::Config;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Detector {
    TimeoutRate,
    Hung,
    OrphanChain,
    DiskWarning,
    DiskCritical,
    DiskGrowth,
    MemPressure,
    MemSignalUnavailable,
    MemPressureGateInert,
    OauthFail,
    NetworkFail,
    RateLimitActive,
    AnomalyRepetitiveActive,
    SupervisorStale,
}

impl Detector {
    pub const ALL: [Detector; 14] = [
        Detector::TimeoutRate,
        Detector::Hung,
        Detector::OrphanChain,
        Detector::DiskWarning,
        Detector::DiskCritical,
        Detector::DiskGrowth,
        Detector::MemPressure,
        Detector::MemSignalUnavailable,
        Detector::MemPressureGateInert,
        Detector::OauthFail,
        Detector::NetworkFail,
        Detector::RateLimitActive,
        Detector::AnomalyRepetitiveActive,
        Detector::SupervisorStale,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Detector::TimeoutRate => "timeout_rate",
            Detector::Hung => "hung",
            Detector::OrphanChain => "orphan_chain",
            Detector::DiskWarning => "disk_warning",
            Detector::DiskCritical => "disk_critical",
            Detector::DiskGrowth => "disk_growth",
            Detector::MemPressure => "mem_pressure",
            Detector::MemSignalUnavailable => "mem_signal_unavailable",
            Detector::MemPressureGateInert => "mem_pressure_gate_inert",
            Detector::OauthFail => "oauth_fail",
            Detector::NetworkFail => "network_fail",
            Detector::RateLimitActive => "rate_limit_active",
            Detector::AnomalyRepetitiveActive => "anomaly_repetitive_active",
            Detector::SupervisorStale => "supervisor_stale",
        }
    }
}

impl std::str::FromStr for Detector {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = match s {
            "auth_fail" => "oauth_fail",
            "mem_gate_inert" | "pressure_gate_inert" => "mem_pressure_gate_inert",
            o => o,
        };
        Detector::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown detector `{s}`: use one of {}",
                    Detector::ALL.map(|d| d.as_str()).join(", ")
                )
            })
    }
}

/// What one tick found new.
#[derive(Debug, Default)]
pub struct Tick {
    /// Episodes seen for the first time.
    pub new: Vec<Finding>,
    /// Detectors whose episode ended.
    pub cleared: Vec<Detector>,
    /// The first new finding on the auto-stop list.
    pub stop: Option<Finding>,
}

pub struct Monitor {
    cfg: crate::config::MonitorConfig,
    events: PathBuf,
    disk_paths: Vec<PathBuf>,
    budget_s: f64,
    view: view::View,
    samples: VecDeque<health::Sample>,
    active: BTreeMap<Detector, String>,
    /// Every finding of the last tick (the status page shows them).
    pub current: Vec<Finding>,
}

impl Monitor {
    pub fn new(cfg: &Config) -> Monitor {
        Monitor {
            cfg: cfg.monitor.clone(),
            events: cfg.runtime.log_dir.join(belay_record::EVENTS_FILE),
            disk_paths: if cfg.monitor.disk_paths.is_empty() {
                vec![cfg.runtime.work_dir.clone(), cfg.runtime.log_dir.clone()]
            } else {
                cfg.monitor.disk_paths.clone()
            },
            budget_s: cfg.runtime.round_budget_s,
            view: view::View::default(),
            samples: VecDeque::new(),
            active: BTreeMap::new(),
            current: Vec::new(),
        }
    }

    pub fn view(&self) -> &view::View {
        &self.view
    }

    pub fn latest_sample(&self) -> Option<&health::Sample> {
        self.samples.back()
    }

    /// Read the log's new events and a fresh sample, run the detectors.
    pub fn tick(&mut self, now: Timestamp) -> Tick {
        self.view.update(&self.events);
        let paths: Vec<&std::path::Path> = self.disk_paths.iter().map(|p| p.as_path()).collect();
        self.samples.push_back(health::sample(&paths));
        let horizon = self.cfg.growth_window_s.max(self.cfg.growth_min_span_s) * 1.5;
        while self.samples.len() > 2
            && self.samples.front().is_some_and(|s| {
                (now.as_millisecond() - s.at.as_millisecond()) as f64 / 1000.0 > horizon
            })
        {
            self.samples.pop_front();
        }
        while self.samples.len() > 10_000 {
            self.samples.pop_front();
        }
        let found = detectors::run_all(&detectors::Inputs {
            cfg: &self.cfg,
            view: &self.view,
            samples: &self.samples,
            budget_s: self.budget_s,
            now,
        });
        let mut tick = Tick::default();
        let firing: Vec<Detector> = found.iter().map(|f| f.detector).collect();
        for d in self.active.keys().copied().collect::<Vec<_>>() {
            if !firing.contains(&d) {
                self.active.remove(&d);
                tick.cleared.push(d);
            }
        }
        for f in &found {
            if self.active.get(&f.detector) != Some(&f.episode) {
                self.active.insert(f.detector, f.episode.clone());
                if tick.stop.is_none() && self.cfg.auto_stop_on.contains(&f.detector) {
                    tick.stop = Some(f.clone());
                }
                tick.new.push(f.clone());
            }
        }
        self.current = found;
        tick
    }
}
