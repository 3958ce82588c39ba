//! The `[monitor]` table with the peer's defaults.

use super::raw::RawMonitor;
use super::Src;
use crate::monitor::Detector;
use crate::RoundsError;

/// The peer's auth-failure pattern.
pub const AUTH_FAIL_PATTERN: &str = r"(?i)\b(oauth|unauthorized|401|api[_ ]key|auth(entication)?[_ -]?(failed|error|expired)|session.*expired)\b";

#[derive(Debug, Clone)]
pub struct MonitorConfig {
    pub auth_fail: regex::Regex,
    pub auth_fail_hint: String,
    pub auto_stop_on: Vec<Detector>,
    pub repetitive_window: u32,
    pub repetitive_threshold: u32,
    pub round_progress_interval_s: f64,
    /// `None`: 1.5 × the round budget; `Some(0)`: off.
    pub supervisor_stale_threshold_s: Option<f64>,
    pub interval_s: f64,
    /// The filesystems the disk detectors watch (empty: the work and log dirs).
    pub disk_paths: Vec<std::path::PathBuf>,
    pub disk_warning_pct: f64,
    pub disk_critical_pct: f64,
    pub growth_window_s: f64,
    pub growth_min_span_s: f64,
    pub disk_growth_pct_per_hr: f64,
    pub inode_growth_pct_per_hr: f64,
    pub avail_min_mb: f64,
    pub free_low_mb: f64,
    pub swap_out_noise_floor_mb: f64,
    pub full_avg10_critical: f64,
    pub some_avg10_warning: f64,
}

impl MonitorConfig {
    pub(crate) fn resolve(src: &Src<'_>, m: RawMonitor) -> Result<MonitorConfig, RoundsError> {
        let auth_fail = match &m.auth_fail_patterns {
            None => regex::Regex::new(AUTH_FAIL_PATTERN)
                .map_err(|e| src.err_file(format!("the built-in auth pattern: {e}")))?,
            Some(p) => regex::Regex::new(&format!("(?i){}", p.get_ref())).map_err(|e| {
                src.err(p.span(), format!("auth_fail_patterns is not a regex: {e}"))
            })?,
        };
        let auto_stop_on = match &m.auto_stop_on {
            None => vec![Detector::OauthFail, Detector::DiskCritical],
            Some(list) => list
                .get_ref()
                .iter()
                .map(|n| n.parse::<Detector>().map_err(|e| src.err(list.span(), e)))
                .collect::<Result<_, _>>()?,
        };
        if m.remote_failure_tolerance_s
            .is_some_and(|t| !(0.0..=3600.0).contains(&t))
        {
            return Err(
                src.err_file("[monitor] remote_failure_tolerance_s must be between 0 and 3600")
            );
        }
        let p = &m.host_health.pressure;
        if let Some(n) = &p.in_round_nudge {
            if *n.get_ref() {
                return Err(src.err(n.span(), "in_round_nudge is not supported: belay bounds a round's memory with its container (and the unit's MemoryMax). Remove the key."));
            }
        }
        if let Some(b) = &m.host_health.brake.memory_high {
            if *b.get_ref() {
                return Err(src.err(b.span(), "the memory.high brake is not supported: belay bounds a round's memory with its container (and the unit's MemoryMax). Remove the key."));
            }
        }
        let d = &m.host_health.disk;
        let mem = &m.host_health.memory;
        Ok(MonitorConfig {
            auth_fail,
            auth_fail_hint: m.auth_fail_hint.unwrap_or_default(),
            auto_stop_on,
            repetitive_window: m.anomaly_repetitive_window.unwrap_or(0),
            repetitive_threshold: m.anomaly_repetitive_threshold.unwrap_or(0),
            round_progress_interval_s: m.round_progress_interval_s.unwrap_or(0.0),
            supervisor_stale_threshold_s: m.supervisor_stale_threshold_s.filter(|t| t.is_finite()),
            disk_paths: d
                .paths
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(std::path::PathBuf::from)
                .collect(),
            interval_s: m
                .interval_s
                .filter(|i| i.is_finite())
                .unwrap_or(30.0)
                .clamp(0.05, 86400.0),
            disk_warning_pct: d.warning_pct.or(m.disk_warning_pct).unwrap_or(90.0),
            disk_critical_pct: d.critical_pct.or(m.disk_critical_pct).unwrap_or(95.0),
            growth_window_s: d.growth_window_s.unwrap_or(1800.0),
            growth_min_span_s: d.growth_min_span_s.unwrap_or(600.0),
            disk_growth_pct_per_hr: d.disk_growth_pct_per_hr_warning.unwrap_or(5.0),
            inode_growth_pct_per_hr: d.inode_growth_pct_per_hr_warning.unwrap_or(5.0),
            avail_min_mb: mem.avail_min_mb.unwrap_or(200.0),
            free_low_mb: mem.free_low_mb.unwrap_or(16.0),
            swap_out_noise_floor_mb: mem.swap_out_noise_floor_mb.unwrap_or(32.0),
            full_avg10_critical: p.full_avg10_critical.unwrap_or(60.0),
            some_avg10_warning: p.some_avg10_warning.unwrap_or(5.0),
        })
    }

    /// The staleness threshold for a round budget.
    pub fn stale_after_s(&self, budget_s: f64) -> Option<f64> {
        match self.supervisor_stale_threshold_s {
            Some(t) if t <= 0.0 => None,
            Some(t) => Some(t),
            None => Some(1.5 * budget_s),
        }
    }
}
