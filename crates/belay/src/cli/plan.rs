//! `belay plan`: the checkpoint plan loop's flags.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{parse_secs, EndpointArgs};

#[derive(Debug, Subcommand)]
pub enum PlanCommand {
    /// Ask an agent for 2 to 6 ordered checkpoints and write the plan file.
    ///
    /// The answer must be raw JSON or exactly one fenced block; anything else
    /// is refused with the reason, and the agent gets one correction round
    /// (then exit 2). The branch defaults to feature/<slug>; main and master
    /// are refused before the agent is called. The write is atomic and
    /// exclusive: --force replaces an existing file.
    Init(Box<PlanInitArgs>),
    /// Check the plan file against the schema; errors name file:line:col.
    Validate(PlanFileArgs),
    /// The branch and each checkpoint's status and attempts (the unfinished
    /// run's state, where there is one).
    Status(PlanStatusArgs),
    /// Run (or resume) the loop: developer, belay's gate, reviewer, a commit
    /// per step on the feature branch. Exit 0 completed, 1 halted or failed,
    /// 2 bad input.
    Run(Box<PlanRunArgs>),
    /// Clear checkpoints' attempts (reviews and failed builds) in the
    /// unfinished run, so that a halted run can go on.
    Reset(PlanResetArgs),
}

#[derive(Debug, Args)]
pub struct PlanFileArgs {
    /// The plan file.
    #[arg(long, default_value = belay_plan::schema::DEFAULT_PLAN)]
    pub state: PathBuf,
}

#[derive(Debug, Args)]
pub struct PlanStatusArgs {
    #[command(flatten)]
    pub file: PlanFileArgs,
    /// One JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PlanResetArgs {
    #[command(flatten)]
    pub file: PlanFileArgs,
    /// The checkpoints to reset.
    #[arg(required = true)]
    pub ids: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PlanInitArgs {
    /// The feature, in words.
    #[arg(
        conflicts_with = "feature_file",
        required_unless_present = "feature_file"
    )]
    pub feature: Option<String>,
    /// The feature, in a Markdown file (recorded as the plan_file).
    #[arg(long)]
    pub feature_file: Option<PathBuf>,
    #[command(flatten)]
    pub file: PlanFileArgs,
    /// The branch (default feature/<slug of the feature>).
    #[arg(long)]
    pub branch: Option<String>,
    /// The plan document recorded in the file (default
    /// docs/implementation_plan.md, or the --feature-file).
    #[arg(long)]
    pub plan_file: Option<String>,
    /// The planning agent: builtin, codex, claude, gemini, grok, antigravity
    /// or cmd:PROGRAM ARG…, each optionally @MODEL.
    #[arg(long, default_value = "claude")]
    pub agent: belay_agent::AgentSpec,
    /// Limit of the agent call.
    #[arg(long, default_value = "1800s", value_parser = parse_secs)]
    pub timeout: std::time::Duration,
    /// Replace an existing plan file.
    #[arg(long)]
    pub force: bool,
    /// Run the agent on the host instead of in a container.
    #[arg(long)]
    pub on_host: bool,
    /// The container image agents run in: an image, or the run id of an env
    /// build (default: the repository's latest successful env build, else
    /// belay-base:bookworm).
    #[arg(long)]
    pub image: Option<String>,
    #[command(flatten)]
    pub model: EndpointArgs,
}

#[derive(Debug, Args)]
pub struct PlanRunArgs {
    #[command(flatten)]
    pub file: PlanFileArgs,
    /// The developer agent (the one spec syntax: codex, claude@MODEL,
    /// cmd:./dev.sh, …).
    #[arg(long)]
    pub developer: belay_agent::AgentSpec,
    /// The reviewer agent.
    #[arg(long)]
    pub reviewer: belay_agent::AgentSpec,
    /// The developer's model (before the plan's `models`, then the CLI's default).
    #[arg(long)]
    pub developer_model: Option<String>,
    #[arg(long)]
    pub reviewer_model: Option<String>,
    /// Reviews a checkpoint may use (and developer runs that may fail) before
    /// the loop halts for a human.
    #[arg(long, default_value_t = 3)]
    pub max_review_attempts: u32,
    /// Wall time of each agent call.
    #[arg(long, default_value = "1800s", value_parser = parse_secs)]
    pub timeout: std::time::Duration,
    /// Stop an agent call that prints nothing for this long.
    #[arg(long, default_value = "600s", value_parser = parse_secs)]
    pub idle: std::time::Duration,
    /// Actions (tool calls, commands, edits) per agent call.
    #[arg(long)]
    pub max_turns: Option<u32>,
    /// The whole run's cost budget in USD.
    #[arg(long)]
    pub max_cost: Option<f64>,
    /// How much agent text the run's records keep: off (none), redacted
    /// (known secret shapes scrubbed), full. Known secrets' values are
    /// scrubbed at every level.
    #[arg(long, default_value = "redacted", env = "BELAY_PLAN_AUDIT_LEVEL")]
    pub audit_level: belay_plan::audit::AuditLevel,
    /// Limit of each build, test or lint command of belay's gate.
    #[arg(long, default_value = "1800s", value_parser = parse_secs)]
    pub gate_timeout: std::time::Duration,
    /// Run the agents on the host instead of in containers (the gate still
    /// runs in a container).
    #[arg(long)]
    pub on_host: bool,
    /// Let the CLIs act without asking: pass their auto-approval flags
    /// (claude --dangerously-skip-permissions, codex
    /// --dangerously-bypass-approvals-and-sandbox, gemini --yolo, grok
    /// --always-approve, agy --dangerously-skip-permissions) on the host too. In
    /// belay's container they are always passed (the container is the
    /// sandbox; a headless CLI's own permission layer only refuses there).
    #[arg(long)]
    pub auto_approve: bool,
    /// More environment variables whose values are secrets (scrubbed from
    /// every record and refused in every commit).
    #[arg(long = "secret-env")]
    pub secret_env: Vec<String>,
    /// Take the plan file as it is now although it changed since belay last
    /// wrote it (a human's edit between runs of an unfinished run); without
    /// it such a file is refused, with what changed.
    #[arg(long)]
    pub accept_plan: bool,
    /// The run's events on stdout, one JSON envelope a line as the event
    /// log records them, instead of the progress lines.
    #[arg(long)]
    pub json: bool,
    /// The container image agents and the gate run in: an image, or the run
    /// id of an env build (default: the repository's latest successful env
    /// build, else belay-base:bookworm).
    #[arg(long)]
    pub image: Option<String>,
    #[command(flatten)]
    pub model: EndpointArgs,
    #[command(flatten)]
    pub roles: RoleEndpointArgs,
}

/// A role's own endpoint, over the shared one (`--openai-base-url`,
/// `--llm-api`, `--llm-key-env`), field by field: a codex developer and a
/// Claude Code reviewer each talk to their own dialect. A role whose agent
/// cannot speak its endpoint's dialect is refused before any work (exit 2).
#[derive(Debug, Clone, Args)]
pub struct RoleEndpointArgs {
    /// The developer's model endpoint (default: the shared one).
    #[arg(long)]
    pub developer_base_url: Option<String>,
    /// The developer's wire dialect (default: --llm-api).
    #[arg(long, value_enum)]
    pub developer_llm_api: Option<super::LlmApi>,
    /// The variable that holds the developer's key (default: --llm-key-env,
    /// or ANTHROPIC_API_KEY for the anthropic dialect).
    #[arg(long)]
    pub developer_llm_key_env: Option<String>,
    /// The reviewer's model endpoint (default: the shared one).
    #[arg(long)]
    pub reviewer_base_url: Option<String>,
    /// The reviewer's wire dialect (default: --llm-api).
    #[arg(long, value_enum)]
    pub reviewer_llm_api: Option<super::LlmApi>,
    /// The variable that holds the reviewer's key.
    #[arg(long)]
    pub reviewer_llm_key_env: Option<String>,
}

impl RoleEndpointArgs {
    /// The developer's and the reviewer's endpoint arguments.
    pub fn resolve(&self, shared: &EndpointArgs) -> (EndpointArgs, EndpointArgs) {
        let over = |base: &Option<String>, api: Option<super::LlmApi>, key: &Option<String>| {
            let mut e = shared.clone();
            if base.is_some() {
                e.openai_base_url = base.clone();
            }
            if let Some(a) = api {
                e.llm_api = Some(a);
            }
            if let Some(k) = key {
                e.llm_key_env = k.clone();
            }
            e
        };
        (
            over(
                &self.developer_base_url,
                self.developer_llm_api,
                &self.developer_llm_key_env,
            ),
            over(
                &self.reviewer_base_url,
                self.reviewer_llm_api,
                &self.reviewer_llm_key_env,
            ),
        )
    }
}
