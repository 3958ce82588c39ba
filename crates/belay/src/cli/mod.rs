//! The command-line surface (clap types only; behaviour lives in the commands).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod jobs;
mod plan;
mod rounds;
mod ui;
pub use jobs::*;
pub use plan::*;
pub use rounds::*;
pub use ui::*;

#[derive(Debug, Parser)]
#[command(
    name = "belay",
    version,
    about = "Run AI coding agents safely and unattended: plan, sandbox, gate, checkpoint.",
    long_about = "belay plans work, runs it in a sandbox, checks every step with a gate, and \
                  checkpoints progress so that a run can roll back, resume after a crash, and be \
                  audited afterwards.\n\nExit codes: 0 success, 1 the run failed, 2 bad input or \
                  configuration, 3 the machine failed (the container engine, the disk, a \
                  service belay runs such as the egress proxy)."
)]
pub struct Cli {
    /// More log output (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// No progress or notes on stderr: only results, warnings and errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check that this machine can run belay: Docker, base image, git, disk.
    Doctor(DoctorArgs),
    /// Base images.
    #[command(subcommand)]
    Image(ImageCommand),
    /// The environment builder: plan and build a validated image for a repository.
    #[command(subcommand)]
    Env(EnvCommand),
    /// Models: the scripted model server.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Agents: run one task with the built-in agent or an agent CLI.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Run a pipeline: sandboxed steps, gated routing, crash-safe state, one commit.
    ///
    /// Agent, command and action steps run in containers with their own
    /// policy; gates and verdicts route the run; state is written after every
    /// transition; one commit ends it. Exit codes: 0 success, 1 the pipeline
    /// failed, 2 configuration error, 3 the machine failed (engine, disk, proxy).
    Run(RunArgs),
    /// The checkpoint plan loop: a developer agent builds each checkpoint,
    /// belay gates it, a reviewer approves it or sends it back; a commit per
    /// step on a feature branch, never merged.
    #[command(subcommand)]
    Plan(PlanCommand),
    /// The round supervisor: an agent CLI round after round (phases, a round
    /// context, stashes by SHA, a startup battery, a monitor, systemd units),
    /// reading cli-agent-runner's agent-runner.toml. Exit codes are the
    /// peer's: 0 ok, 1 the agent failed, 75 a breaker tripped, 76 not ready,
    /// 78 bad config, 130 interrupted.
    Rounds(RoundsArgs),
    /// The job queue builder: requests by chat (XMPP), a drop directory,
    /// HTTP or the command line, each job in its own worktree under an
    /// iteration limit, with start and commit approval; belay commits and
    /// pushes, the agent never does.
    Jobs(JobsArgs),
    /// Every run of every mode: list, show, events (live with --follow), gc.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// A live web dashboard of every run of every mode: the step graph, env
    /// build timelines, agents' turns, commits' diffs, logs, and approvals.
    ///
    /// It reads the registry and the runs' own records (what `belay runs`
    /// reads), tails them, and prints a loopback URL with a random access
    /// token; every request without it is refused.
    Ui(UiArgs),
    /// belay's network relay, run inside a relay container (not for people).
    #[command(hide = true)]
    Relay(RelayArgs),
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    /// Where to listen, e.g. 0.0.0.0:3128.
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// Where to carry each connection: host:port, or unix:PATH.
    #[arg(long)]
    pub to: String,
    /// End once this file's lock is free (belay, which holds it, is gone).
    #[arg(long)]
    pub lifeline: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Mode, id, status (running, ok, failed, interrupted), start, duration,
    /// tokens, cost and where each run lives; newest first.
    List(RunsListArgs),
    /// One run's summary and the paths of its records.
    Show(RunsShowArgs),
    /// A run's event log; `--follow` keeps printing a running run's events
    /// (from any process: the file is tailed).
    Events(RunsEventsArgs),
    /// Remove ended and interrupted runs older than --older-than: their
    /// records, images, containers, volumes and networks.
    Gc(RunsGcArgs),
}

#[derive(Debug, Args)]
pub struct RunsListArgs {
    /// Only this mode (env, pipeline, agent, plan, rounds, jobs).
    #[arg(long)]
    pub mode: Option<belay_record::Mode>,
    /// Only this status (running, ok, failed, interrupted).
    #[arg(long)]
    pub status: Option<belay_record::RunStatus>,
    /// One JSON object per run.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunsShowArgs {
    /// The run id (or a unique prefix of one).
    pub id: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunsEventsArgs {
    /// The run id (or a unique prefix of one).
    pub id: String,
    /// Keep printing new events until the run ends.
    #[arg(long)]
    pub follow: bool,
    /// The envelopes as JSON lines, as recorded.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunsGcArgs {
    /// Only runs that started at least this long ago (30m, 12h, 7d).
    #[arg(long, default_value = "7d", value_parser = parse_age)]
    pub older_than: std::time::Duration,
    /// Say what would be removed, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The pipeline file.
    pub pipeline: PathBuf,
    /// Print the resolved plan (steps, routing, sandbox policy, secret refs,
    /// every limit) and exit: no Docker, no model, no state.
    #[arg(long)]
    pub dry_run: bool,
    /// Print how each key of an agentic-dev-loop pipeline file maps onto
    /// belay (same, mapped, or refused with what to write), and exit. Works
    /// on a file that does not load.
    #[arg(long)]
    pub explain_compat: bool,
    /// Continue this run: an interrupted one at the step it stopped at, or
    /// one that used all its attempts (with a larger --max-attempts).
    #[arg(long)]
    pub resume: Option<String>,
    /// Override the pipeline's max_attempts (with --resume: the new budget).
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Re-run every step's `setup:` (ignore the provision stamps).
    #[arg(long)]
    pub refresh: bool,
    /// Delete the provision stamps and exit.
    #[arg(long)]
    pub clean_stamps: bool,
    /// Where runs are kept (default: the file's state_dir, else
    /// ~/.local/state/belay/pipelines/<name>-<hash>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub viz: VizArgs,
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Run one task. The built-in agent works in a container made from --image,
    /// with a copy of --repo; its trajectory goes to <out>/events.jsonl.
    Run(Box<AgentRunArgs>),
}

#[derive(Debug, Args)]
pub struct AgentRunArgs {
    /// The task.
    #[arg(long)]
    pub prompt: String,
    /// The agent: builtin, codex, claude, gemini, or cmd:PROGRAM ARG… (an
    /// argument `{prompt}` receives the prompt, else stdin does), each
    /// optionally @MODEL (`codex@gpt-5-codex`).
    #[arg(long, default_value = "builtin")]
    pub agent: belay_agent::AgentSpec,
    /// The project the agent works on, mounted read-write in the container
    /// (its `.git` read-only: the agent cannot commit).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Image of the agent's container (an image from `belay env build` works).
    #[arg(long, default_value = belay_sandbox::bootstrap::DEFAULT_BASE_IMAGE)]
    pub image: String,
    /// Give the built-in agent's container a network (default: none; a CLI's
    /// network only reaches the model endpoint).
    #[arg(long)]
    pub network: bool,
    /// Where events.jsonl and report.json go, outside the repository
    /// (default: ~/.local/state/belay/agent/<run-id>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Built-in agent: model round trips; CLIs: agent actions (tool calls, commands, edits).
    #[arg(long, default_value_t = 30)]
    pub max_turns: u32,
    /// Stop when the cost (computed from tokens, or as the CLI reports it) passes this.
    #[arg(long)]
    pub max_cost: Option<f64>,
    /// Stop after this long (e.g. 30m).
    #[arg(long, value_parser = parse_secs)]
    pub wall_time: Option<std::time::Duration>,
    /// CLIs: after the final result, kill the CLI if it has not exited within this.
    #[arg(long, default_value = "10s", value_parser = parse_secs)]
    pub final_grace: std::time::Duration,
    /// CLIs on the host: let the agent run tools without asking (explicit
    /// opt-in; in a container the container is the sandbox and this is on).
    #[arg(long)]
    pub auto_approve: bool,
    /// Run a CLI on this machine, in --repo: an explicit opt-out of the sandbox.
    #[arg(long)]
    pub on_host: bool,
    /// Keep the agent's container afterwards.
    #[arg(long)]
    pub keep_container: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Serve OpenAI Responses, Chat Completions and Anthropic Messages from a
    /// script of turns, and log every request (rehearse without spending tokens).
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The script (YAML or JSON; see docs/models-and-agents.md).
    #[arg(long)]
    pub script: PathBuf,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// Append every request received to this JSONL file (default: <script>.requests.jsonl).
    #[arg(long)]
    pub log: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The base image to look for.
    #[arg(long, default_value = belay_sandbox::bootstrap::DEFAULT_BASE_IMAGE)]
    pub base_image: String,
    /// Where state will be written (its free disk is checked).
    #[arg(long, default_value = ".")]
    pub state_dir: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build a Debian base image offline from the host's apt mirror (debootstrap + import).
    Bootstrap(BootstrapArgs),
    /// Build the worker image of distributed batches (this belay on the base
    /// image, offline) and push it to the registry.
    Worker(WorkerImageArgs),
}

#[derive(Debug, Args)]
pub struct WorkerImageArgs {
    /// Push it here, as `<registry>/belay-worker:<version>-<hash>` (the name
    /// `build-projects --executor swarm` looks for).
    #[arg(long, value_name = "REG")]
    pub registry: Option<String>,
    /// The image to put belay on.
    #[arg(long, default_value = "belay-base:bookworm")]
    pub base: String,
    /// Another name for it (instead of the default).
    #[arg(long)]
    pub tag: Option<String>,
}

#[derive(Debug, Args)]
pub struct BootstrapArgs {
    /// Debian suite.
    #[arg(long, default_value = belay_sandbox::bootstrap::DEFAULT_SUITE)]
    pub suite: String,
    /// Image tag to create (default: belay-base:<suite>).
    #[arg(long)]
    pub tag: Option<String>,
    /// Mirror URL (default: read from the host's apt sources).
    #[arg(long)]
    pub mirror: Option<String>,
    /// Rebuild even if the tag already exists.
    #[arg(long)]
    pub force: bool,
    /// Debian packages to add (comma-separated), e.g. `git` for the image
    /// round agents work and commit in (belay-agent:<suite>).
    #[arg(long, value_delimiter = ',')]
    pub include: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum EnvCommand {
    /// Analyse a repository and write the planned setup blocks, without Docker.
    Plan(PlanArgs),
    /// Build a validated environment image for a repository, block by block.
    Build(Box<BuildArgs>),
    /// Open a shell (or run a command) in a run's final image.
    Shell(ShellArgs),
    /// Build many projects from a projects file, each in its own run.
    BuildProjects(Box<BuildProjectsArgs>),
    /// Remove the checkpoint images and containers of old runs.
    Gc(GcArgs),
    /// One task of a distributed batch (`build-projects --executor swarm`
    /// runs it in the worker image): claim one project, build it, report.
    Worker(WorkerArgs),
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The batch's work spec (written by the submitting build-projects).
    #[arg(long)]
    pub spec: PathBuf,
    /// Build only this item (a Kubernetes Indexed Job's completion index);
    /// then a failed build exits 1, which fails only this index.
    #[arg(long)]
    pub index: Option<usize>,
}

/// Where the projects of a batch are built.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Default)]
pub enum Executor {
    /// On this machine's engine, `--jobs` at a time.
    #[default]
    Local,
    /// As a Docker Swarm replicated-job: one task per project, `--jobs` at
    /// a time across the swarm (needs --registry and `belay image worker`).
    Swarm,
    /// As a Kubernetes Indexed Job: one index per project, `--jobs` pods at
    /// a time (needs --registry, `belay image worker` and --k8s-work-claim).
    /// Not run on a real cluster yet: see docs/distributed.md.
    Kubernetes,
}

/// Where a Kubernetes pod's container engine comes from.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Default)]
pub enum K8sEngine {
    /// A privileged Docker-in-Docker sidecar with its own image store.
    #[default]
    Dind,
    /// The node's /var/run/docker.sock (every pod is root on the node).
    NodeSocket,
}

#[derive(Debug, Args)]
pub struct BuildProjectsArgs {
    /// One project per line: `owner/repo [ref]`, a git URL `[ref]`, or a local path.
    #[arg(long)]
    pub projects_file: PathBuf,
    /// Where projects are checked out (and failed-projects.log and the summary go).
    #[arg(long)]
    pub projects_dir: PathBuf,
    /// Where `.github` of each project is quarantined; `<name>.oracle.json` here is its oracle.
    #[arg(long)]
    pub oracles_dir: Option<PathBuf>,
    /// Base URL that `owner/repo` lines are cloned from (`<url>/<owner>/<repo>.git`).
    #[arg(long, env = "BELAY_GIT_BASE_URL")]
    pub git_base_url: Option<String>,
    /// Projects built at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub jobs: u64,
    /// Build at most N projects.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Skip the first N projects.
    #[arg(long, default_value_t = 0)]
    pub start: usize,
    /// Only these projects (by name or source; repeatable).
    #[arg(long)]
    pub only: Vec<String>,
    /// Stop starting new projects after the first failure.
    #[arg(long)]
    pub stop_on_failure: bool,
    /// Skip projects whose last run succeeded in the same ablation mode.
    #[arg(long)]
    pub skip_existing_success: bool,
    /// Prefix of each project's run id.
    #[arg(long, default_value = "batch")]
    pub run_id_prefix: String,
    /// State directory for all runs (default: <projects-dir>/state).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Where the projects are built.
    #[arg(long, value_enum, default_value = "local")]
    pub executor: Executor,
    /// The image the swarm's tasks run (default:
    /// `<registry>/belay-worker:<version>-<hash of this binary>`, as `belay
    /// image worker --registry` pushes it).
    #[arg(long, value_name = "IMAGE")]
    pub worker_image: Option<String>,
    /// Kubernetes: the namespace (default: the kubeconfig context's).
    #[arg(long, value_name = "NS")]
    pub k8s_namespace: Option<String>,
    /// Kubernetes: the ReadWriteMany PersistentVolumeClaim that holds the
    /// projects dir; it is mounted in every pod at the projects dir's path.
    #[arg(long, value_name = "CLAIM")]
    pub k8s_work_claim: Option<String>,
    /// Kubernetes: where each pod's container engine comes from.
    #[arg(long, value_enum, default_value = "dind")]
    pub k8s_engine: K8sEngine,
    /// Kubernetes: the Docker-in-Docker image of `--k8s-engine dind`.
    #[arg(long, value_name = "IMAGE", default_value = "docker:27-dind")]
    pub k8s_dind_image: String,
    /// Kubernetes: a dockerconfigjson secret to pull the worker image.
    #[arg(long, value_name = "SECRET")]
    pub k8s_pull_secret: Option<String>,
    /// Kubernetes: retries of one project's pod after an infrastructure
    /// failure (backoffLimitPerIndex).
    #[arg(long, default_value_t = 2)]
    pub k8s_retries: u32,
    #[command(flatten)]
    pub common: CommonBuildArgs,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Only runs whose images are at least this old (30m, 12h, 7d).
    #[arg(long, default_value = "0", value_parser = parse_age)]
    pub older_than: std::time::Duration,
    /// Only this run (repeatable).
    #[arg(long = "run")]
    pub runs: Vec<String>,
    /// Remove final images too.
    #[arg(long)]
    pub include_final: bool,
    /// Show what would be removed.
    #[arg(long)]
    pub dry_run: bool,
    /// Also clear the machine's package download caches (pip, uv, npm, yarn, apt).
    #[arg(long)]
    pub package_caches: bool,
    /// Also remove the same runs' checkpoints from this registry (its
    /// manifests, and their cache-key tags); the registry's own
    /// `garbage-collect` then frees the blobs.
    #[arg(long, value_name = "REG")]
    pub registry: Option<String>,
}

// clap value parser: the error is `belay_env::gc::parse_duration`'s text.
fn parse_age(s: &str) -> Result<std::time::Duration, String> {
    belay_env::gc::parse_duration(s)
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Planner {
    /// The model when a key or a base URL is configured, else the rules.
    Auto,
    /// A model (the rules answer when it fails, and the reason is logged).
    Llm,
    /// Deterministic, file-based rules.
    Rules,
}

/// Where a model is: its endpoint, its dialect, its key and its prices.
#[derive(Debug, Clone, Args)]
pub struct EndpointArgs {
    /// Model endpoint, e.g. http://127.0.0.1:8081/v1 (default: $OPENAI_BASE_URL, else the vendor's).
    #[arg(long)]
    pub openai_base_url: Option<String>,
    /// Wire dialect of the endpoint (default: an agent CLI gets its own, so
    /// that claude gets anthropic and codex responses; else responses).
    #[arg(long, value_enum)]
    pub llm_api: Option<LlmApi>,
    /// The environment variable that holds the API key.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub llm_key_env: String,
    /// Price table (TOML, USD per million tokens) for the cost in llm-usage.json.
    #[arg(long)]
    pub llm_prices: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LlmApi {
    Responses,
    ChatCompletions,
    Anthropic,
    /// Google's Gemini API (the gemini CLI's).
    Gemini,
}

impl From<LlmApi> for belay_model::Api {
    fn from(a: LlmApi) -> Self {
        match a {
            LlmApi::Responses => belay_model::Api::Responses,
            LlmApi::ChatCompletions => belay_model::Api::ChatCompletions,
            LlmApi::Anthropic => belay_model::Api::Anthropic,
            LlmApi::Gemini => belay_model::Api::Gemini,
        }
    }
}

// clap value parser: the error is `belay_env::gc::parse_duration`'s text.
pub(crate) fn parse_secs(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    if let Some(ms) = s.strip_suffix("ms") {
        return ms
            .parse::<u64>()
            .map(std::time::Duration::from_millis)
            .map_err(|_| format!("{s:?} is not a duration like 500ms, 2s or 5m"));
    }
    if let Ok(f) = s.parse::<f64>() {
        if f.is_finite() && f >= 0.0 {
            return Ok(std::time::Duration::from_secs_f64(f));
        }
    }
    belay_env::gc::parse_duration(s)
}

/// Model settings. Keys come only from the environment (or ./.env, which never
/// overrides the environment): never from a flag, never written anywhere.
#[derive(Debug, Clone, Args)]
pub struct LlmArgs {
    #[arg(long, value_enum, default_value = "auto")]
    pub planner: Planner,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Where the model is and how to call it.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Model name (default: $BELAY_MODEL).
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub endpoint: EndpointArgs,
    /// Retries on 429, 5xx, connection errors and dropped streams.
    #[arg(long, default_value_t = 3)]
    pub llm_retries: u32,
    /// First retry delay (doubled per retry, with jitter; Retry-After wins).
    #[arg(long, default_value = "1s", value_parser = parse_secs)]
    pub llm_retry_delay: std::time::Duration,
    /// Limit for a whole model call, retries included (default: none).
    #[arg(long, value_parser = parse_secs)]
    pub llm_timeout: Option<std::time::Duration>,
    /// Give up on a model stream that sends nothing for this long.
    #[arg(long, default_value = "120s", value_parser = parse_secs)]
    pub llm_idle_timeout: std::time::Duration,
    /// Ask for whole replies instead of SSE streams.
    #[arg(long)]
    pub llm_no_stream: bool,
    /// A cap on output tokens per model call.
    #[arg(long)]
    pub llm_max_output_tokens: Option<u32>,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum NetworkArg {
    None,
    Bridge,
}

impl From<NetworkArg> for belay_sandbox::Network {
    fn from(n: NetworkArg) -> Self {
        match n {
            NetworkArg::None => belay_sandbox::Network::None,
            NetworkArg::Bridge => belay_sandbox::Network::Bridge,
        }
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The repository to analyse.
    #[arg(long)]
    pub repo: PathBuf,
    #[command(flatten)]
    pub llm: LlmArgs,
    /// Where to write context.json, blocks/ and scripts/ (default: <repo>/.belay/plan).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the plan as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Resolve Python dependencies (and node's without a lockfile) as of
    /// this date (see `env build`).
    #[arg(long, value_name = "DATE", default_value = "source")]
    pub resolve_as_of: String,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The repository to build an environment for.
    #[arg(long)]
    pub repo: PathBuf,
    /// State directory (default: <repo>/.belay).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Run id; reusing one resumes that run.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Keep the build container afterwards.
    #[arg(long)]
    pub keep_container: bool,
    #[command(flatten)]
    pub viz: VizArgs,
    /// Show command output live.
    #[arg(long)]
    pub stream_logs: bool,
    /// Oracle file: commands that must pass on the final image.
    #[arg(long)]
    pub oracle_file: Option<PathBuf>,
    /// Resume from this checkpoint image.
    #[arg(long)]
    pub resume_from: Option<String>,
    /// Block to start at when resuming (inferred from the image tag when omitted).
    #[arg(long, requires = "resume_from")]
    pub start_at_block: Option<String>,
    /// Print the manifest path and result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: CommonBuildArgs,
}

/// Build settings shared by `build` and `build-projects`.
#[derive(Debug, Clone, Args)]
pub struct CommonBuildArgs {
    #[command(flatten)]
    pub llm: LlmArgs,
    /// Repository name for checkpoint images (build-projects: `<prefix>-<project>`).
    #[arg(long, default_value = "belay")]
    pub image_prefix: String,
    /// Keep checkpoints in this OCI registry too (`host[:port][/prefix]`):
    /// each is pushed in the background as it is made, cache keys become tags
    /// there, and a cache hit is read there and pulled only when a block must
    /// run on it (or the result is wanted here). Two machines given the same
    /// registry share one cache.
    #[arg(long, value_name = "REG")]
    pub registry: Option<String>,
    /// With --registry: when every block is a cache hit in the registry,
    /// leave the final image there (`<registry>/<prefix>:<run>-final`)
    /// instead of pulling it onto this engine. Nothing is downloaded.
    #[arg(long, requires = "registry")]
    pub no_pull_final: bool,
    /// Resolve Python dependencies (and a node project's without a lockfile)
    /// as of this date (YYYY-MM-DD or RFC 3339):
    /// `source` (the default) takes the committer date of HEAD, or an
    /// sdist's build time; `latest` takes the newest versions.
    #[arg(long, value_name = "DATE", default_value = "source")]
    pub resolve_as_of: String,
    /// Dockerfile of the base image, built through the Engine API.
    #[arg(long, conflicts_with = "base_image")]
    pub base_dockerfile: Option<PathBuf>,
    /// Base image (default: belay-base:bookworm, made by `belay image bootstrap`).
    #[arg(long)]
    pub base_image: Option<String>,
    /// Seconds each block or validation command may run.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..))]
    pub command_timeout: u64,
    /// Seconds the base image build may take.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    pub docker_build_timeout: u64,
    /// Seconds each oracle command may run.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    pub oracle_timeout: u64,
    /// Network of the build container.
    #[arg(long, value_enum, default_value = "bridge")]
    pub network: NetworkArg,
    /// Do not inherit the host's CA bundle and proxy settings into the container.
    #[arg(long)]
    pub no_host_trust: bool,
    #[command(flatten)]
    pub control: ControlArgs,
}

/// Repair, cache and ablation settings, shared by `build` and `build-projects`.
#[derive(Debug, Clone, Args)]
pub struct ControlArgs {
    /// Progress-control ablation: full, without-local-repair,
    /// without-checkpoint-rollback, without-final-clean-replay,
    /// single-command-forward, single-command-recovery, whole-script-forward,
    /// whole-script-recovery.
    #[arg(long, default_value = "full", value_parser = parse_ablation)]
    pub ablation: belay_env::ablation::Ablation,
    /// Repair rounds per failed block.
    #[arg(long, default_value_t = 3)]
    pub max_repair_attempts: u32,
    /// Read-only probes that may fail during repair before probing stops.
    #[arg(long, default_value_t = 5)]
    pub max_probe_failures: u32,
    /// Do not reuse checkpoints of earlier builds.
    #[arg(long)]
    pub no_cache: bool,
    /// Do not mount the machine's package download caches (pip, uv, npm,
    /// yarn, apt) into build containers.
    #[arg(long)]
    pub no_package_cache: bool,
    /// Replay the final scripts from the base image even when no repair changed them.
    #[arg(long)]
    pub force_clean_replay: bool,
    /// Rewrite pytest oracle commands to --collect-only (exit 5 passes).
    #[arg(long)]
    pub oracle_collect_only: bool,
}

// clap value parser: the error is `belay_env::ablation::Ablation`'s `FromStr` text.
fn parse_ablation(s: &str) -> Result<belay_env::ablation::Ablation, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub struct ShellArgs {
    /// The run whose final image to use.
    pub run_id: String,
    /// Network of the shell container.
    #[arg(long, value_enum, default_value = "none")]
    pub network: NetworkArg,
    /// Command to run instead of an interactive shell.
    #[arg(last = true)]
    pub command: Vec<String>,
}
