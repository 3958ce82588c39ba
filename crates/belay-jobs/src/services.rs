//! What every worker, gate and front end of one `belay jobs` process
//! shares: the config, the queue, the engine, the model endpoint and the
//! secrets to scrub, the outbox, the lifeline.

use std::sync::Arc;

use belay_agent::cli::Endpoint;
use belay_agent::lifeline::Lifeline;
use belay_model::keys::Settings;
use belay_model::PriceTable;
use belay_record::{Observer, Redactor};
use belay_sandbox::ContainerRuntime;

use crate::config::{Config, Placement};
use crate::events::JobEvent;
use crate::notify::Outbox;
use crate::queue::Queue;
use crate::JobsError;

pub struct Services {
    pub cfg: Config,
    pub queue: Queue,
    pub rt: Option<Arc<dyn ContainerRuntime>>,
    pub endpoint: Option<Endpoint>,
    pub prices: PriceTable,
    pub redactor: Redactor,
    /// The values of `[agent] pass_env`, passed to the agent by name.
    pub passed_env: Vec<(String, String)>,
    pub lifeline: Option<Lifeline>,
    pub outbox: Outbox,
    /// Told every event of every job's run as it is recorded, and the
    /// queue's own ([`Services::tell`]).
    pub observer: Arc<dyn Observer<JobEvent>>,
    /// What the config names by reference and the environment lacks: fatal
    /// for `work` ([`Services::ready`]), not for the queue's other verbs.
    missing: Vec<JobsError>,
    /// The same for the front ends (`work` without `--once`).
    missing_front: Vec<JobsError>,
}

fn secret_env(name: &str, what: &str, cfg: &Config) -> Result<String, JobsError> {
    std::env::var(name).map_err(|_| not_set(name, what, cfg))
}

/// A variable the config names and the environment lacks.
fn not_set(name: &str, what: &str, cfg: &Config) -> JobsError {
    JobsError::Config(format!(
        "{}: {what} names the variable {name}, which is not set: export it",
        cfg.path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "jobs.toml".into())
    ))
}

/// A model key the config names and neither the environment nor `./.env`
/// holds, in the words of the other config variables.
fn model_key_missing(e: belay_model::ModelError, cfg: &Config) -> JobsError {
    match e {
        belay_model::ModelError::NoKey { var } => not_set(&var, "[agent] model_key_env", cfg),
        other => JobsError::Config(other.to_string()),
    }
}

impl Services {
    /// Connect the container engine if these services were opened without
    /// one (a commit approval from the dashboard, whose checks run in a
    /// fresh container as on the command line). Without an engine the
    /// approval says so itself.
    pub async fn ensure_engine(&mut self) {
        if self.rt.is_some() {
            return;
        }
        match belay_sandbox::DockerRuntime::connect().await {
            Ok(rt) => self.rt = Some(Arc::new(rt)),
            Err(e) => tracing::warn!("no container engine for the approval: {e}"),
        }
    }

    /// Open the queue and resolve what the config names by reference.
    /// `rt`: the engine, when agents or checks run in containers.
    pub fn open(
        cfg: Config,
        rt: Option<Arc<dyn ContainerRuntime>>,
        observer: Arc<dyn Observer<JobEvent>>,
    ) -> Result<Services, JobsError> {
        let queue = Queue::open(&cfg.queue)?;
        // The config's own secrets (their names label what is redacted),
        // then the one policy's host part (added below).
        let mut redactor = Redactor::default();
        let mut missing = Vec::new();
        let endpoint = match &cfg.agent.model_url {
            None => None,
            Some(url) => {
                let wanted = belay_model::resolve::EndpointWanted {
                    base_url: url,
                    api: cfg.agent.model_api,
                    key_env: cfg.agent.model_key_env.as_deref(),
                };
                match belay_model::resolve::agent_endpoint(&wanted, &Settings::for_cwd()) {
                    Ok(e) => {
                        e.add_secrets(&mut redactor);
                        Some(Endpoint::from(e))
                    }
                    Err(e) => {
                        missing.push(model_key_missing(e, &cfg));
                        None
                    }
                }
            }
        };
        let mut missing_front = Vec::new();
        if let Some(x) = &cfg.xmpp {
            match secret_env(&x.password_env, "[xmpp] password_env", &cfg) {
                Ok(v) => redactor.add(x.password_env.clone(), v),
                Err(e) => missing_front.push(e),
            }
        }
        if let Some(h) = &cfg.http {
            match secret_env(&h.token_env, "[http] token_env", &cfg) {
                Ok(v) => redactor.add(h.token_env.clone(), v),
                Err(e) => missing_front.push(e),
            }
        }
        let mut passed_env = Vec::new();
        for name in &cfg.agent.pass_env {
            let v = match secret_env(name, "[agent] pass_env", &cfg) {
                Ok(v) => v,
                Err(e) => {
                    missing.push(e);
                    continue;
                }
            };
            // A value passed to the agent is scrubbed from every record,
            // whatever its name: the agent can echo it anywhere.
            if v.len() >= 8 {
                redactor.add(name.clone(), v.clone());
            }
            passed_env.push((name.clone(), v));
        }
        redactor.extend_from(&belay_sandbox::trust::host_redactor());
        let lifeline = if cfg.agent.placement == Placement::Container && rt.is_some() {
            Some(Lifeline::hold()?)
        } else {
            None
        };
        let outbox = Outbox::new(&queue.sub("outbox"), redactor.clone(), cfg.xmpp.is_some());
        Ok(Services {
            cfg,
            queue,
            rt,
            endpoint,
            prices: PriceTable::builtin(),
            redactor,
            passed_env,
            lifeline,
            outbox,
            observer,
            missing,
            missing_front,
        })
    }

    /// Whether everything the front ends need is there.
    pub fn ready_front(&self) -> Result<(), JobsError> {
        match self.missing_front.first() {
            Some(e) => Err(JobsError::Config(e.to_string())),
            None => Ok(()),
        }
    }

    /// Whether everything a worker needs is there.
    pub fn ready(&self) -> Result<(), JobsError> {
        match self.missing.first() {
            Some(JobsError::Config(m)) => Err(JobsError::Config(m.clone())),
            Some(e) => Err(JobsError::Config(e.to_string())),
            None => Ok(()),
        }
    }

    /// Tell every owner (by chat where they have an address).
    pub fn tell_owners(&self, text: &str) {
        for o in &self.cfg.owners {
            if let Err(e) = self.outbox.send(o, text) {
                tracing::warn!("cannot queue a message for {o}: {e}");
            }
        }
        self.tell(&JobEvent::OwnersTold {
            text: text.to_string(),
        });
    }

    /// Tell the observer an event of the queue's own, which no job's run
    /// holds.
    pub fn tell(&self, e: &JobEvent) {
        self.observer.event(None, e);
    }
}
