//! One agent run on the work tree, in a container of its own (through
//! [`crate::AgentBox`]) or on the host (the opt-out): what every call of the
//! plan loop and every round of the round supervisor share.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cli::{Endpoint, ProcessOptions};
use crate::sandbox::BoxExtras;
use crate::session::EventTarget;
use crate::{
    AgentBox, AgentError, AgentReport, AgentSession, AgentSpec, BoxSpec, Limits, Placement,
};
use belay_model::{ModelClient, PriceTable};
use belay_record::Redactor;
use belay_sandbox::hostfs::WorkspaceSweep;
use belay_sandbox::ContainerRuntime;

/// The boxes of one run. Kept between calls, one per role: the role's next
/// call reuses its container (readied by [`AgentBox::recycle`]), so a run
/// starts one container per role and not one per call. Retired: a box no
/// call reuses, whose processes are ended and whose tree is swept before its
/// call returns, removed in the background ([`AgentBox::retire`]). The
/// owner closes and awaits them all at the run's end
/// ([`WarmBoxes::close_all`]).
#[derive(Default)]
pub struct WarmBoxes {
    boxes: tokio::sync::Mutex<std::collections::HashMap<String, AgentBox>>,
    retiring: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl WarmBoxes {
    async fn take(&self, key: &str) -> Option<AgentBox> {
        self.boxes.lock().await.remove(key)
    }

    async fn put(&self, key: String, b: AgentBox) {
        if let Some(old) = self.boxes.lock().await.insert(key, b) {
            let _ = old.close().await;
        }
    }

    /// A box no call reuses: ended and swept now, removed in the background.
    async fn retire(&self, b: AgentBox) -> Result<WorkspaceSweep, AgentError> {
        let (sweep, removal) = b.retire().await;
        if let Some(h) = removal {
            let mut r = self.retiring.lock().unwrap_or_else(|p| p.into_inner());
            r.retain(|h| !h.is_finished());
            r.push(h);
        }
        sweep
    }

    /// Remove every kept container (and its route), sweeping the tree, and
    /// wait for the retired ones' removal.
    pub async fn close_all(&self) {
        let all: Vec<AgentBox> = self.boxes.lock().await.drain().map(|(_, b)| b).collect();
        for b in all {
            let _ = b.close().await;
        }
        let retiring =
            std::mem::take(&mut *self.retiring.lock().unwrap_or_else(|p| p.into_inner()));
        for h in retiring {
            let _ = h.await;
        }
    }
}

/// Where and how agents run.
pub struct Runner<'a> {
    pub rt: Option<Arc<dyn ContainerRuntime>>,
    pub image: &'a str,
    pub on_host: bool,
    /// Pass the CLIs' auto-approval flags (`--dangerously-skip-permissions`
    /// and the like) on the host too: the user's opt-in (`--auto-approve`).
    /// In a container they are always passed: the container is the sandbox,
    /// and a headless CLI's own approval layer only refuses there (codex's
    /// bubblewrap cannot make namespaces in it; Claude Code and gemini deny
    /// every write), while the model reports the work as done.
    pub auto_approve: bool,
    pub endpoint: Option<&'a Endpoint>,
    pub client: Option<&'a ModelClient>,
    pub prices: &'a PriceTable,
    pub redactor: &'a Redactor,
    pub run_id: &'a str,
    /// The work tree the agent works in.
    pub workdir: &'a std::path::Path,
    /// Its repository, when it is one (its git dir is mounted read-only).
    pub git: Option<&'a belay_vcs::Git>,
    /// belay's own directory for the box's files (outside the work tree).
    pub records: PathBuf,
    /// Progress lines.
    pub warn: &'a (dyn Fn(&str) + Send + Sync),
    /// What the box adds to the default (a writable git dir, login
    /// directories, the lifeline).
    pub extras: BoxExtras,
    /// The environment the agent gets beyond the scrubbed one (and, in a
    /// container, the route's), on either placement.
    pub agent_env: Vec<(String, String)>,
    /// The run's boxes (the plan loop): a box no call reuses is removed in
    /// the background, awaited by [`WarmBoxes::close_all`]. Without, each
    /// call's box is removed before the call returns.
    pub boxes: Option<&'a WarmBoxes>,
    /// Keep this call's container in `boxes` for the role's next call.
    pub warm: bool,
}

/// One call.
pub struct Call<'a> {
    pub spec: &'a AgentSpec,
    /// The container's `belay.kind` label.
    pub kind: String,
    pub prompt: &'a str,
    pub limits: Limits,
    pub events: Option<EventTarget>,
    pub logs: PathBuf,
    pub pid_file: Option<PathBuf>,
    pub process: ProcessOptions,
    /// A box opened for this call ahead of time (made as this runner would
    /// make it; while the call before ran), used instead of a new one and
    /// closed after the call.
    pub prepared: Option<AgentBox>,
}

/// What a call gave.
pub struct Output {
    pub report: AgentReport,
    /// Processes a host agent left outside its group, killed after it.
    pub leftovers: usize,
    /// The nested `.git` entries the sweep of a container's work tree found
    /// (relative to the work tree; none on the host, where nothing sweeps).
    pub nested_git: Vec<String>,
    /// The container kept after the call (`BoxExtras::keep`).
    pub kept: Option<String>,
}

impl Runner<'_> {
    pub async fn run(&self, c: Call<'_>) -> Result<Output, AgentError> {
        let prices = c.spec.model.as_deref().and_then(|m| self.prices.lookup(m));
        // Where: the host (the opt-out), a warm box of the role's last call,
        // or a box of the call's own.
        let warm = self
            .boxes
            .filter(|_| self.warm && !self.on_host && !self.extras.keep);
        let key = self.box_key(&c);
        let reused = match (c.prepared, warm) {
            (Some(b), _) if !self.on_host => Some(b),
            (_, Some(w)) => w.take(&key).await,
            _ => None,
        };
        let agent_box = if self.on_host {
            None
        } else if reused.is_some() {
            reused
        } else {
            let Some(rt) = self.rt.clone() else {
                return Err(AgentError::Config(
                    "agents run in containers: start Docker (./scripts/setup-host.sh), or pass --on-host".into(),
                ));
            };
            Some(
                AgentBox::open(BoxSpec {
                    rt,
                    image: self.image.to_string(),
                    run_id: self.run_id.to_string(),
                    kind: c.kind,
                    repo: self.workdir.to_path_buf(),
                    git: self.git,
                    records: self.records.clone(),
                    agent: c.spec,
                    model_url: self.endpoint.map(|e| e.base_url.clone()),
                    network: self.extras.network,
                    keep: self.extras.keep,
                    extras: self.extras.clone(),
                })
                .await?,
            )
        };
        let (placement, endpoint, client) = match &agent_box {
            None => (
                Placement::Host {
                    cwd: self.workdir.to_path_buf(),
                    env: self.agent_env.clone(),
                },
                self.endpoint.cloned(),
                None,
            ),
            Some(b) => (
                {
                    let mut p = b.placement();
                    if let Placement::Container { env, .. } = &mut p {
                        env.extend(self.agent_env.iter().cloned());
                    }
                    p
                },
                // The endpoint as the container reaches it.
                match (self.endpoint, b.endpoint_url()) {
                    (Some(e), Some(url)) => Some(Endpoint {
                        base_url: url.to_string(),
                        api: e.api,
                        key: e.key.clone(),
                    }),
                    _ => None,
                },
                self.client,
            ),
        };
        let session = AgentSession {
            spec: c.spec.clone(),
            placement,
            limits: c.limits,
            client,
            builtin: Default::default(),
            endpoint,
            prices,
            // In a container always (the container is the sandbox); on the
            // host only when the user asked.
            auto_approve: self.auto_approve || agent_box.is_some(),
            logs: c.logs,
            redactor: self.redactor.clone(),
            events: c.events,
            pid_file: c.pid_file,
            process: c.process,
        };
        let Some(agent_box) = agent_box else {
            // What leaves the agent's group (setsid, a double fork) is
            // re-parented to belay and killed after the call.
            crate::orphans::adopt_orphans();
            let report = session.run(c.prompt).await;
            let leftovers = tokio::task::spawn_blocking(crate::orphans::kill_adopted)
                .await
                .map(|k| k.len())
                .unwrap_or(0);
            if leftovers > 0 {
                (self.warn)(&format!(
                    "killed {leftovers} process(es) the agent left running outside its group"
                ));
            }
            return report.map(|report| Output {
                report,
                leftovers,
                nested_git: Vec::new(),
                kept: None,
            });
        };
        let report = session.run(c.prompt).await;
        let kept = self.extras.keep.then(|| agent_box.id().to_string());
        // Kept only where belay ends its processes from the host.
        let sweep = match warm.filter(|_| agent_box.sweeps_from_host()) {
            Some(w) => match agent_box.recycle().await {
                Ok(sweep) => {
                    w.put(key, agent_box).await;
                    sweep
                }
                Err(e) => {
                    let _ = agent_box.close().await;
                    return Err(e);
                }
            },
            None => match self.boxes {
                Some(store) => store.retire(agent_box).await?,
                None => agent_box.close().await?,
            },
        };
        if !sweep.setid_cleared.is_empty() {
            (self.warn)(&format!(
                "cleared set-id bits the agent left on {}",
                sweep.setid_cleared.join(", ")
            ));
        }
        if !sweep.nested_git.is_empty() {
            (self.warn)(&format!(
                "warning: the agent left repositories in the work tree ({}); belay will not commit them",
                sweep.nested_git.join(", ")
            ));
        }
        report.map(|report| Output {
            report,
            leftovers: 0,
            nested_git: sweep.nested_git,
            kept,
        })
    }
}

impl Runner<'_> {
    /// What a warm box is kept under: everything its container was made
    /// with (the role's label, agent, image, endpoint, mounts, environment).
    fn box_key(&self, c: &Call<'_>) -> String {
        format!(
            "{}|{}|{}|{:?}|{:?}|{:?}|{}|{}|{:?}",
            c.kind,
            c.spec,
            self.image,
            self.endpoint.map(|e| &e.base_url),
            self.extras.mounts,
            self.extras.env.volumes,
            self.extras.env_read_only,
            self.extras.git_writable,
            self.extras.lifeline,
        )
    }
}

/// After a stop dropped a call (its box was not closed): this process's
/// containers of the run and its route networks are removed, and the work
/// tree is swept as a finished call's would be, so that no set-id file the
/// stopped agent made stays behind. What could not be done is told to `warn`.
pub async fn after_stop(
    rt: Option<&dyn ContainerRuntime>,
    run_id: &str,
    workdir: &std::path::Path,
    warn: &(dyn Fn(&str) + Send + Sync),
) {
    if let Some(rt) = rt {
        if let Err(e) = belay_sandbox::reaper::remove_own(rt, run_id).await {
            warn(&format!("cannot remove this run's containers ({e})"));
        }
    }
    let root = workdir.to_path_buf();
    match tokio::task::spawn_blocking(move || belay_sandbox::hostfs::sweep_workspace(&root)).await {
        Ok(Ok(sweep)) if !sweep.setid_cleared.is_empty() => warn(&format!(
            "cleared set-id bits the stopped agent left on {}",
            belay_record::printable_line(&sweep.setid_cleared.join(", "))
        )),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => warn(&format!("cannot sweep the work tree after the stop ({e})")),
        Err(e) => warn(&format!("the sweep after the stop did not finish ({e})")),
    }
}
