//! [`Supervisor`]: one open project. It holds the run (the log dir as a
//! belay run: its lock, `events.jsonl` in the shared envelope, the registry
//! entry), the repository, the container engine, the model endpoint, and the
//! lifeline that ties every round's container to this process.

use std::path::PathBuf;
use std::sync::Arc;

use belay_agent::cli::Endpoint;
use belay_model::PriceTable;
use belay_record::{Mode, Observer, OpenRun, Redactor, Registry, RunHandle};
use belay_sandbox::ContainerRuntime;
use sha2::Digest;

use crate::config::{Config, PlacementKind};
use crate::events::RoundEvent;
use crate::RoundsError;

pub use belay_agent::lifeline::Lifeline;

pub struct Supervisor {
    pub cfg: Config,
    /// belay's trusted copies of the config and prompt files in the work
    /// tree: what a round's guard puts back.
    pub trust: crate::trusted::Trust,
    pub run: RunHandle,
    pub git: belay_vcs::Git,
    /// The repository's common git dir (the lock's key).
    pub git_common: PathBuf,
    pub rt: Option<Arc<dyn ContainerRuntime>>,
    pub endpoint: Option<Endpoint>,
    pub prices: PriceTable,
    /// The values of `pass_env`, passed to the agent by name.
    pub passed_env: Vec<(String, String)>,
    pub lifeline: Option<Lifeline>,
    /// Told every event as it is recorded (the terminal's lines).
    pub observer: Arc<dyn Observer<RoundEvent>>,
    /// What this invocation's rounds used, as their agents reported it (for
    /// the registry's end record).
    pub used: std::sync::Mutex<crate::events::Usage>,
    /// The agent images' environments over the work tree (an env build's
    /// image), by image, found on first use. The volumes are named by the
    /// run and the image's id; they carry over from round to round of one
    /// invocation and go at its end ([`Supervisor::close_env`]).
    pub env:
        tokio::sync::Mutex<std::collections::BTreeMap<String, belay_sandbox::envimage::RunEnv>>,
}

/// The run id of a project's rounds: stable per config and log dir.
pub fn run_id(cfg: &Config) -> String {
    let key =
        hex::encode(&sha2::Sha256::digest(cfg.runtime.log_dir.as_os_str().as_encoded_bytes())[..4]);
    format!(
        "rounds-{}-{key}",
        belay_record::run_id::sanitize(&cfg.project)
    )
}

/// Record `ev` in `run` and tell `obs`; a log that cannot be written is told
/// as a warning (not recorded: it could not be).
pub(crate) fn emit_to(
    run: &RunHandle,
    obs: &dyn Observer<RoundEvent>,
    step: Option<&str>,
    ev: &RoundEvent,
) {
    if let Err(e) = run.emit_to("rounds", step, ev, obs) {
        obs.event(
            None,
            &RoundEvent::Warning {
                message: format!("cannot record {}: {e}", ev.kind()),
            },
        );
    }
}

/// A warning for the agent runner's cleanup (`Runner::warn`, `after_stop`).
pub(crate) fn warn_to(run: &RunHandle, obs: &dyn Observer<RoundEvent>, message: &str) {
    emit_to(
        run,
        obs,
        None,
        &RoundEvent::Warning {
            message: message.to_string(),
        },
    );
}

impl Supervisor {
    /// Open the project: take the log dir's lock (a second supervisor of the
    /// same log dir is refused, exit 76), open the repository and the event
    /// log. `cfg` and `trust` come from [`crate::trusted::open`] (recovery
    /// done, the config checked against its trusted copy). `rt` is needed
    /// when any agent runs in a container; `redactor` holds the host's
    /// secrets (the config's are added).
    pub async fn open(
        cfg: Config,
        trust: crate::trusted::Trust,
        rt: Option<Arc<dyn ContainerRuntime>>,
        mut redactor: Redactor,
        observer: Arc<dyn Observer<RoundEvent>>,
    ) -> Result<Supervisor, RoundsError> {
        let mut passed_env = Vec::new();
        let agents =
            std::iter::once(&cfg.agent).chain(cfg.phases.iter().filter_map(|p| p.agent.as_ref()));
        for a in agents.clone() {
            for name in &a.pass_env {
                match std::env::var(name) {
                    Ok(v) => {
                        redactor.add(name.clone(), v.clone());
                        if !passed_env.iter().any(|(k, _)| k == name) {
                            passed_env.push((name.clone(), v));
                        }
                    }
                    Err(_) => {
                        return Err(RoundsError::Config(format!(
                            "{}: pass_env names {name}, which is not set in belay's environment: export it (or remove it from pass_env)",
                            cfg.path.display()
                        )))
                    }
                }
            }
            for (k, v) in &a.env {
                if belay_model::keys::looks_secret(k) {
                    redactor.add(k.clone(), v.clone());
                }
            }
        }
        let endpoint = match &cfg.agent.model_url {
            None => None,
            Some(url) => {
                let wanted = belay_model::resolve::EndpointWanted {
                    base_url: url,
                    api: cfg.agent.model_api,
                    key_env: cfg.agent.model_key_env.as_deref(),
                };
                let e = belay_model::resolve::agent_endpoint(
                    &wanted,
                    &belay_model::keys::Settings::for_cwd(),
                )
                .map_err(|e| match e {
                    belay_model::ModelError::NoKey { var } => RoundsError::Config(format!(
                        "{}: model_key_env names {var}, which is not set: export it",
                        cfg.path.display()
                    )),
                    other => RoundsError::Config(other.to_string()),
                })?;
                e.add_secrets(&mut redactor);
                Some(Endpoint::from(e))
            }
        };
        let log_dir = cfg.runtime.log_dir.clone();
        fs_err::create_dir_all(&log_dir).map_err(|e| {
            RoundsError::Environment(format!(
                "cannot create the log dir {}: {e}",
                log_dir.display()
            ))
        })?;
        let id = run_id(&cfg);
        let title = format!("rounds of {}", cfg.project);
        let run = RunHandle::open(OpenRun {
            dir: log_dir.clone(),
            id: &id,
            mode: Mode::Rounds,
            title: Some(&title),
            repo: None,
            redactor,
            registry: Registry::default_location(),
        })
        .map_err(|e| match e {
            belay_record::RecordError::Locked { .. } => RoundsError::Environment(format!(
                "another belay rounds holds the log dir {} (a serve or a round of this config is running): `belay rounds status` shows it",
                log_dir.display()
            )),
            e => e.into(),
        })?;
        let git = belay_vcs::Git::open(&cfg.runtime.work_dir, &belay_record::no_hooks_dir())
            .await
            .map_err(|e| {
                RoundsError::Config(format!("work_dir {}: {e}", cfg.runtime.work_dir.display()))
            })?;
        let common = git.run(&["rev-parse", "--git-common-dir"]).await?;
        let common = PathBuf::from(common.trim());
        let git_common = if common.is_absolute() {
            common
        } else {
            cfg.runtime.work_dir.join(common)
        };
        let needs_box = std::iter::once(&cfg.agent)
            .chain(cfg.phases.iter().filter_map(|p| p.agent.as_ref()))
            .any(|a| a.placement == PlacementKind::Container);
        let lifeline = if needs_box {
            Some(Lifeline::hold()?)
        } else {
            None
        };
        if needs_box && rt.is_none() {
            return Err(RoundsError::Environment(
                "the agent runs in a container and Docker is not reachable: start it (./scripts/setup-host.sh), or set placement = \"host\" in [agent]".into(),
            ));
        }
        Ok(Supervisor {
            cfg,
            trust,
            run,
            git,
            git_common,
            rt,
            endpoint,
            prices: PriceTable::builtin(),
            passed_env,
            lifeline,
            observer,
            used: Default::default(),
            env: Default::default(),
        })
    }

    /// Record an event and tell the observer; a log that cannot be written
    /// is reported, not fatal.
    pub fn emit(&self, step: Option<&str>, ev: &RoundEvent) {
        if let RoundEvent::AgentUsageRecorded { usage, .. } = ev {
            let mut u = self.used.lock().unwrap_or_else(|p| p.into_inner());
            u.input_tokens += usage.input_tokens;
            u.output_tokens += usage.output_tokens;
            u.cached_tokens += usage.cached_tokens;
            u.cost_usd += usage.cost_usd;
            u.turns += usage.turns;
        }
        emit_to(&self.run, &*self.observer, step, ev);
    }

    /// A warning, recorded and told.
    pub fn warn(&self, message: String) {
        self.emit(None, &RoundEvent::Warning { message });
    }

    /// The registry's end of this invocation (a serve or a lone round):
    /// `ok` unless it ended on an error or a breaker, with the tokens and
    /// cost its agents reported. A serve stopped on request ends `ok`: it did
    /// what was asked.
    /// A round killed on request ends `interrupted`.
    /// Remove the agent images' environment volumes and the mount points
    /// the engine made for them in the work tree: what an agent wrote there
    /// does not outlive this invocation.
    pub async fn close_env(&self) {
        let envs: Vec<_> = std::mem::take(&mut *self.env.lock().await)
            .into_values()
            .collect();
        if let Some(rt) = &self.rt {
            for e in &envs {
                e.remove(rt.as_ref()).await;
                e.tidy(self.git.root());
            }
        }
    }

    pub fn end_run(&self, status: belay_record::RunStatus, summary: &str) {
        let u = self.used.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let end = belay_record::RunEnd {
            ok: status == belay_record::RunStatus::Ok,
            duration_s: self.run.elapsed_s(),
            tokens: u.input_tokens + u.output_tokens,
            cost_usd: u.cost_usd,
            summary: Some(self.run.redactor().redact(summary).into_owned()),
        };
        if status == belay_record::RunStatus::Interrupted {
            self.run.interrupted(end);
        } else {
            self.run.finish(end);
        }
    }

    /// What every record of the project is scrubbed of now: the host's and
    /// the config's secrets, and those added since ([`Supervisor::add_secrets`]).
    pub fn redactor(&self) -> Redactor {
        self.run.live_redactor()
    }

    /// Secrets learnt while the supervisor runs (the login tokens copied in
    /// for an agent): every record written from now on scrubs them.
    pub fn add_secrets(&self, secrets: &Redactor) {
        if !secrets.is_empty() {
            self.run.add_secrets(secrets);
        }
    }

    pub fn log_dir(&self) -> &std::path::Path {
        &self.cfg.runtime.log_dir
    }
}
