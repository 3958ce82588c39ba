//! `belay jobs`: the job queue builder's flags.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct JobsArgs {
    /// The queue directory (default: `queue` of the jobs.toml).
    #[arg(long, global = true)]
    pub queue: Option<PathBuf>,
    /// The config (default: <queue>/jobs.toml, ./jobs.toml, ~/.config/belay/jobs.toml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: JobsCommand,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Queue a job: the request as the last argument, or on stdin. A job
    /// without --sender is the owner's and runs; anyone else's waits for
    /// `belay jobs accept`.
    Submit(Box<SubmitArgs>),
    /// Run the queue: recover what a killed worker left, then run jobs
    /// (with the configured front ends: XMPP, the drop directory, HTTP)
    /// until SIGTERM, or until the inbox is empty with --once. SIGTERM puts
    /// a running job back in the inbox. With --once, exit 1 when a job
    /// failed (its checks, its agent, its push, its limit).
    Work(WorkArgs),
    /// The jobs in the queue, by state (with --all, the finished ones too).
    List(ListArgs),
    /// One job: its state, its file, its record once done.
    Show(IdJson),
    /// Start a third party's job (the start approval).
    Accept(Id),
    /// Drop a third party's job unseen.
    Decline(Id),
    /// Commit and push a held change (the commit approval).
    Approve(Id),
    /// Drop a held change; nothing is committed.
    Discard(Id),
    /// Drop a sender's carried context.
    Reset(SenderArg),
    /// Put a failed job back in the inbox.
    Requeue(Id),
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// A repository the job may write (repeatable): a [[repo]] name of
    /// jobs.toml or a path. Default: the config's default repositories.
    #[arg(long = "repo")]
    pub repos: Vec<String>,
    /// Who sent it (a chat address); default: the owner.
    #[arg(long)]
    pub sender: Option<String>,
    /// On whose behalf (default: the sender).
    #[arg(long)]
    pub requested_by: Option<String>,
    /// The agent spec (codex, claude, builtin, cmd:PROGRAM …, @MODEL).
    #[arg(long)]
    pub agent: Option<String>,
    /// The seed's runtime: codex, claude or openrouter.
    #[arg(long)]
    pub runtime: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long)]
    pub reasoning_effort: Option<String>,
    /// Agent actions before the session is stopped with an interim report.
    #[arg(long)]
    pub iteration_limit: Option<u32>,
    /// builder, or fixer (answers with one FIX_RESULT block).
    #[arg(long, default_value = "builder")]
    pub role: String,
    /// Where the completion record goes (default: <queue>/done).
    #[arg(long = "on-complete")]
    pub on_complete: Option<PathBuf>,
    #[arg(long)]
    pub board: Option<String>,
    /// Carry no context in, save none.
    #[arg(long)]
    pub fresh: bool,
    /// The request; `-` or none: read stdin.
    pub body: Option<String>,
}

#[derive(Debug, Args)]
pub struct WorkArgs {
    /// Run until the inbox is empty, then exit (no front ends).
    #[arg(long)]
    pub once: bool,
    /// Workers side by side (default: `workers` of jobs.toml, else 1).
    #[arg(long)]
    pub workers: Option<usize>,
    /// The jobs' events on stdout, one JSON envelope a line as their event
    /// logs record them, instead of the progress lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The finished jobs too (their outcome and when), from the queue's
    /// completion records.
    #[arg(long)]
    pub all: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct IdJson {
    pub id: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct Id {
    pub id: String,
}

#[derive(Debug, Args)]
pub struct SenderArg {
    /// The sender whose context to drop (default: the owner, `local`).
    pub sender: Option<String>,
}
