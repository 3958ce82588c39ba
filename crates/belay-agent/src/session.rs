//! [`AgentSession`]: the one way any mode runs any agent.
//!
//! A session takes an [`AgentSpec`] (the built-in agent or a CLI), a
//! [`Placement`] (a container, the default; the host only as an explicit
//! opt-out), belay's limits, and where the model is. It streams every agent
//! event into the run's event log as it happens (`{"kind": "agent", "data":
//! {"event": …}}`), so a crash loses none and `belay runs events --follow`
//! shows a running agent's turns.
//!
//! In a container, a CLI runs through `docker exec` in its own session
//! (`setsid`), as the container's exec user, with the prompt as an argument
//! (or on stdin) and every value passed through the docker client's
//! environment, never its argv; when it ends or overruns, its whole process
//! group inside the container is killed. The pinned CLIs and a `cmd:`
//! program are mounted read-only at their own paths, the host's node at
//! [`AGENT_NODE`], on no `PATH`, which runs a node CLI ([`container_mounts`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use belay_model::{ModelClient, Prices};
use belay_record::{EventSink, Redactor};
use belay_sandbox::{ContainerRuntime, ExecSpec, Mount, NoopObserver};
use serde::Serialize;

use crate::builtin::{BuiltinAgent, BuiltinConfig};
use crate::cli::{self, CliAgent, CliKind, Endpoint, Launch};
use crate::spec::{AgentKind, AgentSpec};
use crate::workspace::ContainerWorkspace;
use crate::{AgentError, AgentEvent, AgentReport, Limits};

/// Where a CLI that takes its prompt only as an argument finds it in a container.
const CONTAINER_PROMPT_FILE: &str = "/tmp/.belay-prompt.md";

/// Where an agent runs.
pub enum Placement {
    /// In the running container `id`, in `workdir`, with `env` added.
    /// `host_root`: the host directory bound at `workdir` read-write, where
    /// the built-in agent writes files directly.
    Container {
        rt: Arc<dyn ContainerRuntime>,
        id: String,
        workdir: String,
        env: Vec<(String, String)>,
        host_root: Option<PathBuf>,
        /// Other host directories bound read-write into the container
        /// (container path, host path), where the built-in agent's writes go
        /// straight to the host too (a read-only root filesystem refuses the
        /// engine's archive upload on older engines even into a bind mount).
        host_dirs: Vec<(String, PathBuf)>,
        /// The box's owner ends every process of the container right after
        /// the agent (an [`crate::AgentBox`] removed, or recycled for the
        /// role's next call by [`crate::AgentBox::recycle`]): what the CLI
        /// left dies then, and no cleanup exec is made (Docker holds a new
        /// exec for seconds while an escaped process keeps the last one's
        /// output open; and an exec costs a call about 40 ms).
        ended_by_owner: bool,
    },
    /// On this machine, in `cwd`: the explicit opt-out of the sandbox. Only
    /// CLIs run here (the built-in agent's tools always run in a container).
    Host {
        cwd: PathBuf,
        env: Vec<(String, String)>,
    },
}

/// Where the pinned agent CLIs are installed (`scripts/setup-host.sh --agents`).
pub fn agents_dir() -> PathBuf {
    std::env::var_os("BELAY_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/belay-agents"))
}

/// The host's node binary (the pinned CLIs are node programs).
fn host_node() -> Option<PathBuf> {
    belay_sandbox::path::find_program("node")
}

/// Where the host's node is in an agent's container: a path of belay's own,
/// on no `PATH`, so that the project's `node` (the one its env image
/// installed, `.nvmrc`'s release) is the one its tests run on, and a pinned
/// node CLI still runs on the node it was installed for.
pub const AGENT_NODE: &str = "/opt/belay-agent-node/node";

/// [`AGENT_NODE`] where `program` (a pinned CLI's path, belay's own
/// install on the host) is a node script (`#!/usr/bin/env node`,
/// `#!/usr/bin/node`) and the host's node is mounted; a native CLI (Claude
/// Code's) runs as it is.
fn node_script_runner(program: &str) -> Option<String> {
    use std::io::Read;
    if !std::path::Path::new(program).is_file() || host_node().is_none() {
        return None;
    }
    let mut head = [0u8; 128];
    // host-owned: a pinned CLI of belay's agents dir, belay's own install.
    let n = fs_err::File::open(program)
        .and_then(|mut f| f.read(&mut head))
        .ok()?;
    let first = String::from_utf8_lossy(head[..n].split(|b| *b == b'\n').next()?).into_owned();
    let mut words = first.strip_prefix("#!")?.split_whitespace();
    let base = |w: &str| w.rsplit('/').next().unwrap_or(w).to_string();
    let mut interp = base(words.next()?);
    if interp == "env" {
        interp = base(words.find(|w| !w.starts_with('-'))?);
    }
    matches!(interp.as_str(), "node" | "nodejs").then(|| AGENT_NODE.to_string())
}

/// Whether `p` is under [`agents_dir`], as given or with its links resolved.
fn under_agents_dir(p: &std::path::Path) -> bool {
    let dir = agents_dir();
    p.starts_with(&dir) || fs_err::canonicalize(&dir).is_ok_and(|d| p.starts_with(d))
}

/// The program a CLI spec runs: the pinned CLI under [`agents_dir`] in a
/// container, the one on PATH on the host; a `cmd:` program as an absolute
/// path (so that it can be mounted where it is).
pub fn program_of(spec: &AgentSpec, in_container: bool) -> Result<String, AgentError> {
    let name = match &spec.kind {
        AgentKind::Builtin => {
            return Err(AgentError::Config(
                "the built-in agent runs no program".into(),
            ))
        }
        AgentKind::Command { program, .. } => {
            let p = PathBuf::from(program);
            // A peer config's bare `claude` (`codex`, `gemini`) in belay's
            // container is the pinned CLI, as the spec form is.
            if in_container && matches!(program.as_str(), "claude" | "codex" | "gemini") {
                let pinned = agents_dir().join("node_modules/.bin").join(program);
                if pinned.exists() {
                    return Ok(pinned.display().to_string());
                }
            }
            let found = if p.components().count() > 1 {
                fs_err::canonicalize(&p).ok()
            } else {
                belay_sandbox::path::find_program(program)
            };
            return found.map(|f| f.display().to_string()).ok_or_else(|| {
                AgentError::Config(format!(
                    "the agent program `{program}` does not exist (give a path, or a program on PATH)"
                ))
            });
        }
        AgentKind::Codex => "codex",
        AgentKind::Claude => "claude",
        AgentKind::Gemini => "gemini",
        AgentKind::Grok => "grok",
        AgentKind::Antigravity => "agy",
    };
    if !in_container {
        return Ok(name.to_string());
    }
    let pinned = agents_dir().join("node_modules/.bin").join(name);
    if !pinned.exists() {
        return Err(AgentError::Config(format!(
            "{name} is not installed at {}: run ./scripts/setup-host.sh --agents (or set BELAY_AGENTS_DIR)",
            pinned.display()
        )));
    }
    Ok(pinned.display().to_string())
}

/// In the container, before the CLI: gemini's settings home of belay's,
/// when the CLI was given [`cli::GEMINI_SETTINGS`].
const GEMINI_HOME_SETUP: &str = "[ -z \"$BELAY_GEMINI_SETTINGS\" ] || { export GEMINI_CLI_HOME=/tmp/.belay-gemini; mkdir -p \"$GEMINI_CLI_HOME/.gemini\" && printf '%s' \"$BELAY_GEMINI_SETTINGS\" > \"$GEMINI_CLI_HOME/.gemini/settings.json\"; }; ";

/// The read-only mounts a container needs to run `spec`: the pinned CLIs and
/// the host's node for codex, claude and gemini; a `cmd:` program at its own
/// path. Nothing for the built-in agent.
pub fn container_mounts(spec: &AgentSpec) -> Result<Vec<Mount>, AgentError> {
    let mut out = Vec::new();
    match &spec.kind {
        AgentKind::Builtin => {}
        AgentKind::Command { .. } if !under_agents_dir(&PathBuf::from(program_of(spec, true)?)) => {
            let p = program_of(spec, true)?;
            out.push(Mount {
                host: PathBuf::from(&p),
                container: p,
                read_only: true,
            });
        }
        // A pinned CLI (also as a `cmd:` program): the whole install and node.
        _ => {
            let dir = agents_dir();
            out.push(Mount {
                host: dir.clone(),
                container: dir.display().to_string(),
                read_only: true,
            });
            if let Some(node) = host_node() {
                out.push(Mount {
                    host: node,
                    container: AGENT_NODE.into(),
                    read_only: true,
                });
            }
        }
    }
    Ok(out)
}

/// Where the session's events go.
pub struct EventTarget {
    pub sink: EventSink,
    /// The step (or checkpoint, round, job) they belong to.
    pub step: Option<String>,
    /// The envelope's `source`.
    pub source: &'static str,
}

#[derive(Serialize)]
struct AgentLine<'a> {
    kind: &'static str,
    data: &'a serde_json::Value,
}

/// Writes each event as it comes; the first write error is kept.
struct Stream<'a> {
    target: Option<&'a EventTarget>,
    error: Option<belay_record::RecordError>,
}

impl Stream<'_> {
    fn push(&mut self, e: &AgentEvent) {
        let (Some(t), None) = (self.target, &self.error) else {
            return;
        };
        let data = serde_json::json!({ "event": e });
        if let Err(err) = t.sink.emit(
            t.source,
            t.step.as_deref(),
            &AgentLine {
                kind: "agent",
                data: &data,
            },
        ) {
            self.error = Some(err);
        }
    }
}

/// One agent run.
pub struct AgentSession<'a> {
    pub spec: AgentSpec,
    pub placement: Placement,
    pub limits: Limits,
    /// The built-in agent's model client.
    pub client: Option<&'a ModelClient>,
    /// The built-in agent's settings (its limits come from `limits`).
    pub builtin: BuiltinConfig,
    /// Where a CLI sends its model requests (reachable from the placement).
    pub endpoint: Option<Endpoint>,
    /// The prices of a CLI's model, for its cost (Claude Code reports its own).
    pub prices: Option<Prices>,
    /// Let a CLI run tools without asking: in a container, the container is
    /// the sandbox; on the host, an explicit opt-in.
    pub auto_approve: bool,
    /// Per-command logs (the built-in agent's tools, the cleanup).
    pub logs: PathBuf,
    pub redactor: Redactor,
    pub events: Option<EventTarget>,
    /// Where the running CLI's identity is kept (outside the agent's reach),
    /// for [`crate::cli::kill_recorded`] after a crash of belay.
    pub pid_file: Option<PathBuf>,
    /// The raw transcript, the terminal marker, the tie to belay's life.
    pub process: cli::ProcessOptions,
}

impl AgentSession<'_> {
    /// Run `prompt` to the agent's end or to one of the limits.
    pub async fn run(&self, prompt: &str) -> Result<AgentReport, AgentError> {
        let mut stream = Stream {
            target: self.events.as_ref(),
            error: None,
        };
        let report = if self.spec.is_builtin() {
            self.run_builtin(prompt, &mut stream).await
        } else {
            self.run_cli(prompt, &mut stream).await
        };
        if let Some(e) = stream.error {
            return Err(e.into());
        }
        report
    }

    async fn run_builtin(
        &self,
        prompt: &str,
        stream: &mut Stream<'_>,
    ) -> Result<AgentReport, AgentError> {
        let Placement::Container {
            rt,
            id,
            workdir,
            env,
            host_root,
            host_dirs,
            ..
        } = &self.placement
        else {
            return Err(AgentError::Config(
                "the built-in agent runs its tools in a container, never on the host".into(),
            ));
        };
        let Some(client) = self.client else {
            return Err(AgentError::Config(
                "the built-in agent needs a model (an `llm` block, or --model and a key)".into(),
            ));
        };
        let mut ws = ContainerWorkspace::new(
            rt.clone(),
            id,
            workdir,
            self.logs.join("tools"),
            self.redactor.clone(),
            env.clone(),
        );
        if let Some(h) = host_root {
            ws = ws.with_host_mount(h.clone());
        }
        for (dir, h) in host_dirs {
            ws = ws.with_host_dir(dir, h.clone());
        }
        let mut config = self.builtin.clone();
        if let Some(t) = self.limits.max_turns {
            config.max_iterations = t;
        }
        config.max_cost_usd = self.limits.max_cost_usd.or(config.max_cost_usd);
        config.wall_time = self.limits.wall_time.or(config.wall_time);
        BuiltinAgent::new(client, &ws, config)
            .run(prompt, &mut |e| stream.push(e))
            .await
    }

    fn cli_agent(&self, kind: CliKind, in_container: bool) -> Result<CliAgent, AgentError> {
        let mut agent = CliAgent::new(kind);
        agent.program = program_of(&self.spec, in_container)?;
        if in_container && under_agents_dir(std::path::Path::new(&agent.program)) {
            agent.interpreter = node_script_runner(&agent.program);
        }
        agent.model = self.spec.model.clone();
        // The prompt goes on stdin (or, for the CLIs that take it only as an
        // argument, in a file): never in argv, where `ps` shows it and the
        // kernel caps it at 128 KiB. Only a `cmd:` template that asks for
        // `{prompt}` gets it as an argument.
        agent.prompt_on_stdin = true;
        if let AgentKind::Command { program, args } = &self.spec.kind {
            agent.template = args.clone();
            agent.prompt_on_stdin = !args.iter().any(|a| a.contains("{prompt}"));
            agent.stream = cli::stream_of(program, args);
        }
        if matches!(kind, CliKind::Grok | CliKind::Antigravity) {
            agent.prompt_file = Some(if in_container {
                CONTAINER_PROMPT_FILE.to_string()
            } else {
                self.logs.join("prompt.md").display().to_string()
            });
        }
        agent.auto_approve = self.auto_approve;
        agent.endpoint = self.endpoint.clone();
        Ok(agent)
    }

    /// On the host, gemini with belay's endpoint reads its settings from a
    /// home of the run's own (the user's `~/.gemini` is left alone).
    fn gemini_home_on_host(
        &self,
        agent: &cli::CliAgent,
        env: &[(String, String)],
    ) -> Result<Vec<(String, String)>, AgentError> {
        let mut env = env.to_vec();
        if agent.kind == CliKind::Gemini && agent.endpoint.is_some() {
            let home = self.logs.join("gemini-home");
            let dir = home.join(".gemini");
            fs_err::create_dir_all(&dir)
                .map_err(|e| AgentError::Io(format!("cannot create {}: {e}", dir.display())))?;
            belay_record::atomic_write(&dir.join("settings.json"), cli::GEMINI_SETTINGS.as_bytes())
                .map_err(|e| AgentError::Io(e.to_string()))?;
            env.push(("GEMINI_CLI_HOME".into(), home.display().to_string()));
        }
        Ok(env)
    }

    async fn run_cli(
        &self,
        prompt: &str,
        stream: &mut Stream<'_>,
    ) -> Result<AgentReport, AgentError> {
        let Some(kind) = self.spec.cli_kind() else {
            return Err(AgentError::Config("not a CLI agent".into()));
        };
        match &self.placement {
            Placement::Host { cwd, env } => {
                let agent = self.cli_agent(kind, false)?;
                fs_err::create_dir_all(&self.logs).map_err(|e| {
                    AgentError::Io(format!("cannot create {}: {e}", self.logs.display()))
                })?;
                let env = &self.gemini_home_on_host(&agent, env)?;
                let mut launch = Launch::for_agent(&agent, prompt, cwd.clone(), env)?;
                launch.pid_file = self.pid_file.clone();
                launch.process = self.process.clone();
                let mut parser = agent.parser();
                let result = cli::run(
                    &launch,
                    parser.as_mut(),
                    &self.limits,
                    self.prices,
                    &mut |e| stream.push(e),
                )
                .await;
                // The prompt file of grok and agy is not a record to keep.
                if let Some(f) = &agent.prompt_file {
                    let _ = fs_err::remove_file(f);
                }
                result
            }
            Placement::Container {
                rt,
                id,
                workdir,
                env,
                ended_by_owner,
                ..
            } => {
                let agent = self.cli_agent(kind, true)?;
                fs_err::create_dir_all(&self.logs).map_err(|e| {
                    AgentError::Io(format!("cannot create {}: {e}", self.logs.display()))
                })?;
                let launch = self.docker_exec(rt.as_ref(), id, workdir, env, &agent, prompt)?;
                let mut parser = agent.parser();
                let result = cli::run(
                    &launch,
                    parser.as_mut(),
                    &self.limits,
                    self.prices,
                    &mut |e| stream.push(e),
                )
                .await;
                if *ended_by_owner {
                    return result;
                }
                // Whatever the CLI left running in the container goes with it.
                let kill = ExecSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), "[ -f /tmp/.belay-agent.pid ] && read g < /tmp/.belay-agent.pid && kill -KILL -\"$g\" 2>/dev/null; /bin/rm -f /tmp/.belay-agent.pid; true".into()],
                    working_dir: None,
                    env: vec![],
                    timeout: Some(Duration::from_secs(30)),
                    log_path: self.logs.join("agent-cleanup.log"),
                    log_limit: None,
                };
                let _ = rt.exec(id, &kill, &self.redactor, &NoopObserver).await;
                result
            }
        }
    }

    /// The `docker exec` that runs the CLI inside the container, in a
    /// session of its own whose leader's pid is kept for the cleanup.
    fn docker_exec(
        &self,
        rt: &dyn ContainerRuntime,
        id: &str,
        workdir: &str,
        env: &[(String, String)],
        agent: &CliAgent,
        prompt: &str,
    ) -> Result<Launch, AgentError> {
        let cmd = agent.command(prompt)?;
        // Values go through the docker client's environment (`-e NAME`),
        // never its argv; the container's own paths, which are no secret and
        // must not become the host client's HOME, go inline.
        let fixed = ["HOME=/tmp", "CODEX_HOME=/tmp/.codex"];
        let mut inner: Vec<(String, String)> = Vec::new();
        inner.extend(
            cmd.env
                .iter()
                .filter(|(k, _)| k != "HOME" && k != "CODEX_HOME")
                .cloned(),
        );
        inner.extend(
            env.iter()
                .filter(|(k, _)| k != "HOME" && k != "CODEX_HOME")
                .cloned(),
        );
        // A prompt file is written inside the container from stdin, first.
        let mut stdin_prompt = cmd
            .stdin
            .clone()
            .or_else(|| cmd.prompt_file.as_ref().map(|(_, text)| text.clone()));
        let to_file = cmd
            .prompt_file
            .as_ref()
            .map(|(path, _)| format!("umask 077; cat > '{path}'; "))
            .unwrap_or_default();
        let mut argv: Vec<String> = vec!["docker".into(), "exec".into()];
        if stdin_prompt.is_some() {
            argv.push("-i".into());
        }
        argv.extend(["-w".into(), workdir.to_string()]);
        for f in fixed {
            argv.extend(["-e".into(), f.to_string()]);
        }
        if let Some(u) = rt.exec_user(id) {
            argv.extend(["-u".into(), u]);
        }
        for (k, _) in &inner {
            argv.push("-e".into());
            argv.push(k.clone());
        }
        argv.push(id.to_string());
        let redirect = if cmd.stdin.is_some() {
            ""
        } else {
            " < /dev/null"
        };
        // The CLI runs in a session of its own (inner); when it exits, the
        // outer shell kills what it left in that session, so that a
        // background process holding its output does not keep `docker exec`
        // (and the round) waiting, and exits with the CLI's status.
        argv.extend(
            [
                "/bin/sh".to_string(),
                "-c".to_string(),
                "inner=$1; shift; s=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v setsid); \"$s\" -w /bin/sh -c \"$inner\" belay-agent \"$@\"; rc=$?; g=; read g < /tmp/.belay-agent.pid 2>/dev/null; [ -n \"$g\" ] && kill -KILL -\"$g\" 2>/dev/null; exit $rc".to_string(),
                "belay-wrap".to_string(),
                format!("{to_file}mkdir -p \"${{CODEX_HOME:-/tmp/.codex}}\"; {GEMINI_HOME_SETUP}echo $$ > /tmp/.belay-agent.pid; exec \"$@\"{redirect}"),
            ],
        );
        argv.extend(cmd.argv.iter().cloned());
        let mut host_env = cli::scrubbed_env();
        for k in [
            "DOCKER_HOST",
            "DOCKER_CONFIG",
            "DOCKER_CERT_PATH",
            "DOCKER_TLS_VERIFY",
        ] {
            if let Ok(v) = std::env::var(k) {
                host_env.push((k.to_string(), v));
            }
        }
        for (k, v) in &inner {
            host_env.retain(|(x, _)| x != k);
            host_env.push((k.clone(), v.clone()));
        }
        Ok(Launch {
            argv,
            stdin: stdin_prompt.take(),
            env: host_env,
            cwd: self.logs.clone(),
            pid_file: self.pid_file.clone(),
            process: self.process.clone(),
        })
    }
}
