//! Usage accounting: every model call adds to a [`UsageReport`], which is
//! written atomically to `llm-usage.json` after each call, so that a crash
//! loses nothing but the call in flight.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::types::{Api, Usage};

/// USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    pub input: f64,
    #[serde(default)]
    pub cached_input: f64,
    pub output: f64,
}

impl Prices {
    pub fn cost(&self, u: &Usage) -> f64 {
        let fresh = u.input_tokens.saturating_sub(u.cached_tokens) as f64;
        (fresh * self.input
            + u.cached_tokens as f64 * self.cached_input
            + u.output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

/// Prices by model name. A key ending in `*` matches by prefix; the longest
/// match wins. Load one with `--llm-prices FILE` (TOML):
///
/// ```toml
/// [models."gpt-5*"]
/// input = 1.25
/// cached_input = 0.125
/// output = 10.0
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PriceTable {
    pub models: BTreeMap<String, Prices>,
}

impl PriceTable {
    /// A small built-in table (USD per million tokens, list prices when this
    /// was written). Local and unknown models cost nothing; override with a file.
    pub fn builtin() -> Self {
        let rows: &[(&str, f64, f64, f64)] = &[
            ("gpt-5*", 1.25, 0.125, 10.0),
            ("gpt-5-mini*", 0.25, 0.025, 2.0),
            ("gpt-5-nano*", 0.05, 0.005, 0.4),
            ("gpt-4.1*", 2.0, 0.5, 8.0),
            ("gpt-4.1-mini*", 0.4, 0.1, 1.6),
            ("gpt-4o*", 2.5, 1.25, 10.0),
            ("gpt-4o-mini*", 0.15, 0.075, 0.6),
            ("o4-mini*", 1.1, 0.275, 4.4),
            ("claude-opus-4*", 15.0, 1.5, 75.0),
            ("claude-sonnet-4*", 3.0, 0.3, 15.0),
            ("claude-haiku-4*", 1.0, 0.1, 5.0),
        ];
        PriceTable {
            models: rows
                .iter()
                .map(|(m, i, c, o)| {
                    (
                        m.to_string(),
                        Prices {
                            input: *i,
                            cached_input: *c,
                            output: *o,
                        },
                    )
                })
                .collect(),
        }
    }

    /// Read a TOML price table; its entries override the built-in ones.
    pub fn load(path: &Path) -> Result<Self, crate::ModelError> {
        let text = fs_err::read_to_string(path)
            .map_err(|e| crate::ModelError::Config(format!("cannot read the price table: {e}")))?;
        let t: PriceTable = toml::from_str(&text).map_err(|e| {
            crate::ModelError::Config(format!("{}: not a price table: {e}", path.display()))
        })?;
        let mut all = Self::builtin();
        all.models.extend(t.models);
        Ok(all)
    }

    pub fn lookup(&self, model: &str) -> Option<Prices> {
        let mut best: Option<(usize, Prices)> = None;
        for (k, p) in &self.models {
            let hit = match k.strip_suffix('*') {
                Some(prefix) => model.starts_with(prefix),
                None => model == k,
            };
            let len = if k.ends_with('*') {
                k.len() - 1
            } else {
                usize::MAX
            };
            if hit && best.is_none_or(|(l, _)| len > l) {
                best = Some((len, *p));
            }
        }
        best.map(|(_, p)| p)
    }
}

/// One model call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CallRecord {
    pub at: String,
    /// What the call was for (`plan`, `repair`, `agent`...).
    pub purpose: String,
    pub ok: bool,
    /// HTTP attempts, retries included.
    pub attempts: u32,
    pub latency_ms: f64,
    #[serde(flatten)]
    pub usage: Usage,
    /// The server sent no token counts: these are estimated (4 bytes a token).
    #[serde(default)]
    pub usage_estimated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How many recent calls `llm-usage.json` lists; the totals cover all of them.
pub const RECENT_CALLS: usize = 200;
const LATENCY_SAMPLES: usize = 10_000;

/// The contents of `llm-usage.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UsageReport {
    pub api: String,
    pub model: String,
    /// The endpoint, without credentials.
    pub base_url: String,
    pub requests: u64,
    pub failed_requests: u64,
    pub retries: u64,
    /// Calls whose token counts are estimates (the server sent none).
    #[serde(default)]
    pub estimated_usage_calls: u64,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    pub latency_s_total: f64,
    pub latency_ms_median: f64,
    pub latency_ms_max: f64,
    pub cost_usd: f64,
    /// Whether the price table knew this model (if not, the cost is 0).
    pub price_known: bool,
    pub prices: Option<Prices>,
    pub recent_calls: Vec<CallRecord>,
}

/// Shared by every client of a run; cheap to record into.
#[derive(Debug)]
pub struct UsageLedger {
    path: Option<PathBuf>,
    inner: Mutex<(UsageReport, Vec<f64>)>,
}

fn strip_credentials(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((cred, host)) if !cred.contains('/') => format!("{scheme}://{host}"),
            _ => url.to_string(),
        },
        None => url.to_string(),
    }
}

impl UsageLedger {
    /// `path`: where `llm-usage.json` goes (None: memory only).
    pub fn new(
        path: Option<PathBuf>,
        api: Api,
        model: &str,
        base_url: &str,
        prices: &PriceTable,
    ) -> Self {
        let p = prices.lookup(model);
        // A resumed run continues its own counts.
        let previous: Option<UsageReport> = path
            .as_ref()
            .and_then(|p| fs_err::read(p).ok())
            .and_then(|b| serde_json::from_slice(&b).ok());
        let latencies: Vec<f64> = previous
            .as_ref()
            .map(|r| r.recent_calls.iter().map(|c| c.latency_ms).collect())
            .unwrap_or_default();
        let report = UsageReport {
            api: api.to_string(),
            model: model.to_string(),
            base_url: strip_credentials(base_url),
            price_known: p.is_some(),
            prices: p,
            ..previous.unwrap_or_default()
        };
        UsageLedger {
            path,
            inner: Mutex::new((report, latencies)),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Add a call, and write the file.
    pub fn record(&self, call: CallRecord) -> Result<(), belay_record::RecordError> {
        let Ok(mut g) = self.inner.lock() else {
            return Ok(());
        };
        let (r, lat) = &mut *g;
        r.requests += 1;
        if !call.ok {
            r.failed_requests += 1;
        }
        r.retries += u64::from(call.attempts.saturating_sub(1));
        if call.usage_estimated {
            r.estimated_usage_calls += 1;
        }
        r.input_tokens += call.usage.input_tokens;
        r.cached_tokens += call.usage.cached_tokens;
        r.output_tokens += call.usage.output_tokens;
        r.reasoning_tokens += call.usage.reasoning_tokens;
        r.latency_s_total += call.latency_ms / 1000.0;
        r.latency_ms_max = r.latency_ms_max.max(call.latency_ms);
        if lat.len() < LATENCY_SAMPLES {
            lat.push(call.latency_ms);
            let mut sorted = lat.clone();
            sorted.sort_by(f64::total_cmp);
            r.latency_ms_median = sorted[sorted.len() / 2];
        }
        if let Some(p) = &r.prices {
            r.cost_usd += p.cost(&call.usage);
        }
        if r.recent_calls.len() == RECENT_CALLS {
            r.recent_calls.remove(0);
        }
        r.recent_calls.push(call);
        match &self.path {
            Some(path) => belay_record::write_json_atomic(path, r),
            None => Ok(()),
        }
    }

    pub fn report(&self) -> UsageReport {
        self.inner.lock().map(|g| g.0.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn longest_prefix_wins_and_cost_counts_cached() {
        let t = PriceTable::builtin();
        assert_eq!(t.lookup("gpt-5-mini-2025").unwrap().input, 0.25);
        assert_eq!(t.lookup("gpt-5").unwrap().input, 1.25);
        assert!(t.lookup("smollm2").is_none());
        let p = Prices {
            input: 1.0,
            cached_input: 0.1,
            output: 10.0,
        };
        let u = Usage {
            input_tokens: 1_000_000,
            cached_tokens: 500_000,
            output_tokens: 100_000,
            reasoning_tokens: 0,
        };
        assert!((p.cost(&u) - (0.5 + 0.05 + 1.0)).abs() < 1e-9);
    }

    #[test]
    fn ledger_writes_totals_and_keeps_recent_calls_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("llm-usage.json");
        let l = UsageLedger::new(
            Some(path.clone()),
            Api::Responses,
            "gpt-5",
            "https://u:p@h/v1",
            &PriceTable::builtin(),
        );
        for i in 0..(RECENT_CALLS + 5) {
            l.record(CallRecord {
                at: String::new(),
                purpose: "t".into(),
                ok: i % 2 == 0,
                attempts: 2,
                latency_ms: i as f64,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 1,
                    ..Default::default()
                },
                usage_estimated: i % 3 == 0,
                error: None,
            })
            .unwrap();
        }
        let r: UsageReport = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(r.requests, (RECENT_CALLS + 5) as u64);
        assert_eq!(r.retries, r.requests);
        assert_eq!(r.input_tokens, 10 * r.requests);
        assert_eq!(r.recent_calls.len(), RECENT_CALLS);
        assert_eq!(
            r.estimated_usage_calls,
            (0..(RECENT_CALLS + 5)).filter(|i| i % 3 == 0).count() as u64
        );
        assert_eq!(r.base_url, "https://h/v1");
        assert!(r.cost_usd > 0.0);
    }
}
