//! `belay ui` and the `--viz` flags of `belay run` and `belay env build`.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct UiArgs {
    /// The port (0: any free one).
    #[arg(long, default_value_t = 8320)]
    pub port: u16,
    /// The address to listen on. Anything but loopback needs --allow-remote.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// Listen on a non-loopback --bind: whoever reaches it with the URL's
    /// token sees every run's logs and can approve jobs (see docs/ui.md).
    #[arg(long)]
    pub allow_remote: bool,
    /// Open the page in the default browser (xdg-open).
    #[arg(long)]
    pub open: bool,
    /// A job queue whose waiting jobs the page shows (repeatable; queues of
    /// the jobs runs in the registry are found on their own).
    #[arg(long = "queue")]
    pub queues: Vec<PathBuf>,
    /// A jobs.toml whose queue the page shows (repeatable).
    #[arg(long = "jobs-config")]
    pub jobs_configs: Vec<PathBuf>,
    /// The access token (from the environment only, so that it is not in
    /// the process list): a restarted server keeps the open pages working.
    #[arg(skip = std::env::var("BELAY_UI_TOKEN").ok().filter(|t| !t.is_empty()))]
    pub token: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct VizArgs {
    /// Serve the live dashboard of this run while it runs, and print its URL.
    #[arg(long)]
    pub viz: bool,
    /// The dashboard's preferred port; a free one is taken when it is busy.
    #[arg(long, default_value_t = belay_ui::DEFAULT_VIZ_PORT)]
    pub viz_port: u16,
}
