//! `belay rounds`: the round supervisor's flags (cli-agent-runner's verbs).

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

#[derive(Debug, Args)]
pub struct RoundsArgs {
    /// The config (cli-agent-runner's agent-runner.toml).
    #[arg(long, global = true, default_value = "agent-runner.toml")]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: RoundsCommand,
}

#[derive(Debug, Subcommand)]
pub enum RoundsCommand {
    /// Write agent-runner.toml, prompts/main.md and a .gitignore line, and
    /// commit them (in the current git work tree).
    Init(RoundsInitArgs),
    /// Run the startup battery and say what each check found (exit 78 for
    /// a broken config, 76 for an environment that is not ready).
    Doctor(JsonArg),
    /// Accept the config and the prompt files in the work tree as they are
    /// now. A config there that changed since belay last trusted it (an
    /// agent could write it) is refused by `round` and `serve` until you do.
    /// After a round that belay did not end (kill -9), what the agent changed
    /// is put back first and listed: make your own change again, then trust.
    Trust(JsonArg),
    /// Run one round. Exit 0 clean, 1 the agent failed or ran over its
    /// budget, 76 not ready (another agent in the repository), 78 bad config,
    /// 130 interrupted.
    Round(RoundArgs),
    /// Run rounds until stopped, with the monitor inside. SIGTERM finishes
    /// the round and exits 0; a second SIGTERM stops it now (130).
    Serve(ServeArgs),
    /// The loop's state: running, idle or interrupted, the last round, the
    /// outstanding stashes, today's usage.
    Status(JsonArg),
    /// A snapshot: the status, the round context, and the last events.
    Peek(PeekArgs),
    /// `peek` again every few seconds until interrupted.
    Watch(WatchArgs),
    /// Query the event log (or follow it with --tail).
    Events(EventsArgs),
    /// Start serve: the installed unit, else a detached process.
    Start(StartArgs),
    /// Ask serve to stop after its round (SIGTERM), and wait for it.
    Stop(StopArgs),
    /// Stop serve now: the round is killed and recorded as killed.
    Kill(JsonArg),
    /// stop, then start.
    Restart(StartArgs),
    /// Write systemd units for serve (and the monitor with --monitor).
    Install(InstallArgs),
    /// Remove exactly the units `install` wrote.
    Uninstall(UninstallArgs),
    /// Run the 14 detectors over the event log and host samples.
    Monitor(MonitorArgs),
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// One JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RoundsInitArgs {
    /// Which agent CLI to set up.
    #[arg(long, default_value = "claude", value_parser = clap::builder::PossibleValuesParser::new(belay_rounds::init::PRESETS))]
    pub preset: String,
    /// Overwrite an existing agent-runner.toml.
    #[arg(long)]
    pub force: bool,
    /// Do not commit the new files.
    #[arg(long)]
    pub no_commit: bool,
}

#[derive(Debug, Args)]
pub struct RoundArgs {
    /// Run this phase instead of the rotation's.
    #[arg(long)]
    pub phase: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// One round, then exit with its code.
    #[arg(long)]
    pub once: bool,
    /// Stop after this many rounds (overrides [runtime] max_rounds).
    #[arg(long)]
    pub max_rounds: Option<u64>,
    /// Run outside the [schedule] windows too.
    #[arg(long)]
    pub ignore_schedule: bool,
    /// Do not run the monitor inside serve (it has its own unit).
    #[arg(long)]
    pub no_monitor: bool,
    /// The loop's events on stdout, one JSON envelope a line as the event
    /// log records them, instead of the progress lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PeekArgs {
    /// How many of the last events.
    #[arg(long, default_value_t = 10)]
    pub events: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 5.0)]
    pub interval: f64,
    /// Stop after this many refreshes (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only these kinds (repeat, or comma-separate).
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
    /// Keep following the log.
    #[arg(long)]
    pub tail: bool,
    /// Only events at or after this time (RFC 3339, or an age: 10m, 2h, 1d).
    #[arg(long)]
    pub since: Option<String>,
    /// Only the last N (after the filters).
    #[arg(long)]
    pub last: Option<usize>,
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// Start a detached serve even if a unit is installed.
    #[arg(long)]
    pub detached: bool,
}

#[derive(Debug, Args)]
pub struct StopArgs {
    /// Do not wait for serve to exit.
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The monitor's unit too.
    #[arg(long)]
    pub monitor: bool,
    /// System units (/etc/systemd/system, with User=), not user units.
    #[arg(long)]
    pub system: bool,
    /// Where to write the units (default: the user's or system unit dir).
    #[arg(long)]
    pub unit_dir: Option<PathBuf>,
    /// The unit's MemoryMax.
    #[arg(long, default_value = "8G")]
    pub memory_max: String,
    /// The unit's TasksMax.
    #[arg(long, default_value_t = 1024)]
    pub tasks_max: u32,
    /// Only write the files (no systemctl daemon-reload / enable).
    #[arg(long)]
    pub no_enable: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// Accepted for the peer's syntax: the record says what was written.
    #[arg(long)]
    pub monitor: bool,
    /// Accepted for the peer's syntax: the record says where.
    #[arg(long)]
    pub system: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum MonitorMode {
    /// Human lines, one per new alert.
    Anomaly,
    /// One JSON object per new alert (JSONL).
    Events,
    /// A status page and its JSON on 127.0.0.1.
    Http,
}

#[derive(Debug, Args)]
pub struct MonitorArgs {
    #[arg(long, value_enum, default_value = "anomaly")]
    pub mode: MonitorMode,
    /// Seconds between ticks.
    #[arg(long, default_value_t = 30.0)]
    pub interval: f64,
    /// Stop after this many ticks (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    pub ticks: u64,
    /// The http mode's port on 127.0.0.1 (0: any free port, printed).
    #[arg(long, default_value_t = 8765)]
    pub port: u16,
    /// Do not stop serve on the auto-stop detectors.
    #[arg(long)]
    pub no_auto_stop: bool,
    /// The peer's JSON switch: the same as --mode events.
    #[arg(long)]
    pub json: bool,
}
