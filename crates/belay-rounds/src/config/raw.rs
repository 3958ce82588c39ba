//! `agent-runner.toml` as written: the peer's tables and keys with its
//! defaults (cli-agent-runner 0.3.14), the seed's aliases, and belay's own
//! additions. Every table denies unknown keys, so a typo is an error at its
//! line, never a silently ignored setting.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub schema_version: Option<Spanned<i64>>,
    pub agent: Spanned<RawAgent>,
    pub runtime: RawRuntime,
    pub prompt: Spanned<RawPrompt>,
    #[serde(default)]
    pub vcs: RawVcs,
    pub phases: Option<RawPhases>,
    #[serde(default)]
    pub schedule: RawSchedule,
    #[serde(default)]
    pub monitor: RawMonitor,
    /// belay's own: cost and turn limits per round and per day.
    #[serde(default)]
    pub limits: RawLimits,
    /// The peer's goal ledger and checks: not supported (refused).
    pub goal: Option<Spanned<toml::Value>>,
    /// The peer's plugin switches: not supported (refused).
    pub plugins: Option<Spanned<toml::Value>>,
    /// The seed's reserved table (never used by the peer either): refused.
    pub llm: Option<Spanned<toml::Value>>,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawAgent {
    /// The peer's agent: the command (program first).
    pub command: Option<Vec<String>>,
    pub prompt_arg_template: Option<Vec<String>>,
    /// `argv` (default) or `stdin`.
    pub prompt_delivery: Option<String>,
    pub name: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub exec_prefix: Option<Vec<String>>,
    pub terminal_marker: Option<String>,
    pub sigterm_grace_s: Option<Spanned<f64>>,
    /// belay's own: a belay agent spec (`codex@gpt-5-codex`, `cmd:./a.sh`),
    /// instead of `command`.
    pub agent: Option<Spanned<String>>,
    /// belay's own: `container` (the default) or `host` (the opt-out).
    pub placement: Option<Spanned<String>>,
    /// belay's own: the container image.
    pub image: Option<String>,
    /// belay's own: the model endpoint the agent may reach (the only network
    /// a container gets).
    pub model_url: Option<String>,
    /// `responses`, `chat-completions` or `anthropic`.
    pub model_api: Option<Spanned<String>>,
    /// The host variable that holds the endpoint's key (passed by reference).
    pub model_key_env: Option<String>,
    /// Host variables passed to the agent by name; their values are secrets,
    /// scrubbed from every file belay writes.
    pub pass_env: Option<Vec<String>>,
    /// The CLI's own login directories, mounted read-write under the
    /// container's home (default: `~/.claude`, `~/.codex` or `~/.gemini`
    /// after the CLI, where it exists).
    pub login_dirs: Option<Vec<String>>,
    /// Copy a refreshed login token back to the host's login dir after a
    /// round (off: an agent could swap the user's login).
    pub login_write_back: Option<bool>,
    /// Pass a belay spec's auto-approval flag (a peer `command` carries its own).
    pub auto_approve: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRuntime {
    pub work_dir: Spanned<String>,
    pub log_dir: Spanned<String>,
    #[serde(alias = "round_timeout_s")]
    pub round_budget_s: Option<Spanned<f64>>,
    pub restart_delay_s: Option<Spanned<f64>>,
    pub round_log_retention: Option<u64>,
    pub narrative_file: Option<Spanned<String>>,
    pub transient_error_action: Option<Spanned<String>>,
    pub max_rounds: Option<u64>,
    pub stop_file: Option<String>,
    pub substrate_fingerprint_paths: Option<Spanned<Vec<String>>>,
    pub fresh_eyes_every_n: Option<u64>,
    pub dry_run: Option<bool>,
    pub max_grace_after_result_s: Option<f64>,
    pub grace_kill_ignore_patterns: Option<Vec<String>>,
    /// Removed by the peer: a hard error with its migration hint.
    pub round_timeout_per_phase: Option<Spanned<toml::Value>>,
    pub rate_limit_action: Option<Spanned<toml::Value>>,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawPrompt {
    pub file: Option<String>,
    pub files: Option<Vec<String>>,
    pub inject_context: Option<bool>,
    pub context_injection_mode: Option<Spanned<String>>,
    pub concat_separator: Option<String>,
    pub strip_yaml_frontmatter: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVcs {
    #[serde(alias = "orphan_action")]
    pub dirty_action: Option<Spanned<String>>,
    pub stash_idempotency_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
pub struct RawPhases {
    #[serde(default)]
    pub list: Vec<String>,
    pub phase_policy: Option<Spanned<String>>,
    /// `[phases.<name>]`: a phase's overrides.
    #[serde(flatten)]
    pub overrides: BTreeMap<String, Spanned<RawPhaseOverride>>,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawPhaseOverride {
    pub round_budget_s: Option<f64>,
    pub prompt: Option<RawPhasePrompt>,
    pub agent: Option<RawAgent>,
    pub runtime: Option<RawPhaseRuntime>,
    pub schedule: Option<RawSchedule>,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawPhasePrompt {
    pub files: Option<Vec<String>>,
    pub file: Option<String>,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawPhaseRuntime {
    pub round_budget_s: Option<f64>,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawSchedule {
    pub timezone: Option<Spanned<String>>,
    #[serde(default)]
    pub run_windows: Vec<Spanned<String>>,
    #[serde(default)]
    pub pause_windows: Vec<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMonitor {
    pub auth_fail_patterns: Option<Spanned<String>>,
    pub auth_fail_hint: Option<String>,
    pub auto_stop_on: Option<Spanned<Vec<String>>>,
    pub remote_failure_tolerance_s: Option<f64>,
    pub anomaly_repetitive_window: Option<u32>,
    pub anomaly_repetitive_threshold: Option<u32>,
    pub round_progress_interval_s: Option<f64>,
    pub supervisor_stale_threshold_s: Option<f64>,
    /// The seed's names for the disk thresholds.
    pub disk_warning_pct: Option<f64>,
    pub disk_critical_pct: Option<f64>,
    /// belay's own: seconds between the monitor's samples inside `serve`.
    pub interval_s: Option<f64>,
    #[serde(default)]
    pub host_health: RawHostHealth,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHostHealth {
    #[serde(default)]
    pub disk: RawDisk,
    #[serde(default)]
    pub memory: RawMemory,
    #[serde(default)]
    pub pressure: RawPressure,
    #[serde(default)]
    pub brake: RawBrake,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDisk {
    pub warning_pct: Option<f64>,
    pub critical_pct: Option<f64>,
    pub growth_window_s: Option<f64>,
    pub disk_growth_pct_per_hr_warning: Option<f64>,
    pub inode_growth_pct_per_hr_warning: Option<f64>,
    /// belay's own: the shortest span a growth rate is computed over (the
    /// peer extrapolated from samples minutes apart).
    pub growth_min_span_s: Option<f64>,
    /// belay's own: the filesystems to watch, by a path on each (default:
    /// the work dir's and the log dir's).
    pub paths: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMemory {
    pub avail_min_mb: Option<f64>,
    pub free_low_mb: Option<f64>,
    pub swap_out_noise_floor_mb: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPressure {
    pub full_avg10_critical: Option<f64>,
    pub some_avg10_warning: Option<f64>,
    pub critical_consecutive_samples: Option<u32>,
    pub in_round_terminate: Option<bool>,
    pub cgroup_growth_rate_warning_mb_per_min: Option<f64>,
    pub in_round_nudge: Option<Spanned<bool>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBrake {
    pub memory_high: Option<Spanned<bool>>,
    pub memory_high_step_pct: Option<f64>,
    pub warning_consecutive_samples: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub round_cost_usd: Option<f64>,
    pub day_cost_usd: Option<f64>,
    pub round_turns: Option<u32>,
    pub day_turns: Option<u32>,
}
