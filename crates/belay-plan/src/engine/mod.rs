//! The loop: for each checkpoint, the developer builds it, belay runs the
//! project's commands on it, the reviewer approves it or sends it back; every
//! step is a commit on the feature branch, made by belay on the host with
//! hooks off. The run state is saved after every transition, and a rerun of
//! the same command after a `kill -9` goes on where it stopped.
//!
//! * [`setup`]: the checks before anything changes, the lock, the resume;
//! * [`call`]: one agent call, in its own container, and the judging of the
//!   plan file after it;
//! * [`check`]: belay's own run of the build, test and lint commands;
//! * [`review`]: the reviewer's call and its verdict (its answer, never a
//!   file), the approval or the send-back;
//! * [`commit`]: the commit point and its crash recovery;
//! * [`finish`]: the outcome, the audit commit, the registry.

mod call;
mod check;
mod commit;
mod finish;
mod review;
mod setup;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use belay_agent::cli::Endpoint;
use belay_agent::AgentSpec;
use belay_model::{ModelClient, PriceTable};
use belay_record::{Observer, Redactor, Registry, RunHandle, RunLock};
use belay_sandbox::ContainerRuntime;
use belay_vcs::Git;

use crate::audit::AuditLevel;
use crate::events::PlanEvent;
use crate::gate::Role;
use crate::schema::Plan;
use crate::state::{Outcome, Phase, RunState, Stage};
use crate::PlanError;

pub use setup::{current_run, plan_key, reset, trust_plan, RunLocation, ACCEPT_PLAN};

/// belay's copy of the plan file as it last wrote it, in the run directory.
pub const BASELINE: &str = "plan.json";

/// The plan file as the reviewer's box sees it (read-only, over the tree's),
/// in the run directory.
pub const PLAN_VIEW: &str = "plan-view.json";

/// What `belay plan run` was asked to do.
pub struct RunOptions {
    /// The plan file, as given.
    pub plan: PathBuf,
    pub developer: AgentSpec,
    pub reviewer: AgentSpec,
    pub developer_model: Option<String>,
    pub reviewer_model: Option<String>,
    pub max_review_attempts: u32,
    /// Per agent call: wall time, silence, actions.
    pub timeout: Duration,
    pub idle: Option<Duration>,
    pub max_turns: Option<u32>,
    /// For the whole run.
    pub max_cost_usd: Option<f64>,
    pub audit: AuditLevel,
    /// Agents on the host instead of in containers (the documented opt-out).
    pub on_host: bool,
    /// Let CLIs act without asking (their auto-approval flags): an explicit
    /// opt-in, in a container as on the host.
    pub auto_approve: bool,
    /// Take a plan file that changed since belay last trusted it (a human's
    /// edit between runs) instead of refusing it.
    pub accept_plan: bool,
    pub image: String,
    /// Where the developer's model is, as the host reaches it.
    pub developer_endpoint: Option<Endpoint>,
    /// Where the reviewer's model is (its own address, key and dialect).
    pub reviewer_endpoint: Option<Endpoint>,
    /// The built-in agent's client.
    pub client: Option<ModelClient>,
    pub prices: PriceTable,
    /// The mechanical gate's limit per command.
    pub gate_timeout: Duration,
    pub redactor: Redactor,
    pub registry: Registry,
    /// The container engine (needed for containers and for the gate).
    pub rt: Option<Arc<dyn ContainerRuntime>>,
    /// Told every event as it is recorded (the terminal's lines).
    pub observer: Arc<dyn Observer<PlanEvent>>,
    /// The one cancellation token (SIGINT/SIGTERM): the run stops cleanly
    /// and resumes with the same command.
    pub stop: belay_record::Stop,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct Report {
    pub run_id: String,
    pub run_dir: PathBuf,
    pub branch: String,
    pub outcome: Outcome,
    pub reason: Option<String>,
    pub commits: Vec<String>,
    pub cost_usd: f64,
    pub agent_calls: u64,
}

/// The loop is over for now: why.
enum Stop {
    Halted(String),
    Failed(String),
}

pub(crate) struct Engine<'a> {
    o: &'a RunOptions,
    plan: Plan,
    plan_rel: String,
    git: Git,
    run: RunHandle,
    state: RunState,
    submodules: Vec<String>,
    commits: Vec<String>,
    index: PathBuf,
    /// The image's environment over the work tree (an env build's image):
    /// the agents' writable set, the gate's read-only one.
    env: belay_sandbox::envimage::RunEnv,
    /// Each role's container, kept for its next call.
    warm: std::sync::Arc<belay_agent::runner::WarmBoxes>,
    /// The reviewer's next box, opening while belay commits and gates.
    prepared_reviewer: Option<call::PreparedBox>,
    /// The developer's first box, opening during the setup.
    prepared_developer: Option<call::PreparedBox>,
    /// A gate ran in this process: its environment volumes are filled.
    gated: bool,
    _lock: RunLock,
}

/// A warning event, recorded in `run` and told to `obs`.
fn warn_to(run: &RunHandle, obs: &dyn Observer<PlanEvent>, message: String) {
    let _ = run.emit_to("engine", None, &PlanEvent::Warning { message }, obs);
}

/// Run (or resume) the loop of the plan in `o.plan`.
pub async fn run(o: &RunOptions) -> Result<Report, PlanError> {
    let mut e = setup::open(o).await?;
    let (env, root) = (e.env.clone(), e.git.root().to_path_buf());
    let warm = e.warm.clone();
    let report = match o.stop.race(e.drive()).await {
        Ok(stop) => {
            e.close_prepared().await;
            // The kept boxes are idle (their processes ended after each
            // call): they go while belay writes the audit commit.
            let boxes = warm.clone();
            let closing = tokio::spawn(async move { boxes.close_all().await });
            let report = e.end(stop).await;
            let _ = closing.await;
            report
        }
        Err(why) => {
            e.close_prepared().await;
            warm.close_all().await;
            e.interrupted(why.0).await
        }
    };
    if let Some(rt) = &o.rt {
        env.remove(rt.as_ref()).await;
    }
    // (After a stop, too: the box was dropped before it could.)
    env.tidy(&root);
    report
}

impl Engine<'_> {
    /// Record an event and tell the observer.
    fn emit(&self, step: Option<&str>, e: &PlanEvent) -> Result<(), PlanError> {
        self.run.emit_to("engine", step, e, &*self.o.observer)?;
        Ok(())
    }

    /// A warning, recorded and told (a log that cannot be written does not
    /// stop the run for it).
    fn warn(&self, message: String) {
        warn_to(&self.run, &*self.o.observer, message);
    }

    fn save(&self) -> Result<(), PlanError> {
        self.run.save_state(&self.state)?;
        Ok(())
    }

    fn cp_mut(&mut self, id: &str) -> Result<&mut crate::state::CheckpointState, PlanError> {
        self.state
            .get_mut(id)
            .ok_or_else(|| PlanError::Usage(format!("checkpoint `{id}` is not in the run state")))
    }

    /// The plan file as belay's state says it is. Whatever an agent put in
    /// its place (a link, a directory, a fifo) is removed first; a parent
    /// that is no longer a directory is an error. What is written is belay's
    /// trusted copy of the file (the control store): a change found at the
    /// next start that belay did not write is refused until accepted.
    fn write_plan(&self) -> Result<serde_json::Value, PlanError> {
        let text = self.plan.render(&self.state.view());
        let root = self.git.root();
        let path = root.join(&self.plan_rel);
        if !belay_sandbox::hostfs::parents_are_dirs(root, &self.plan_rel) {
            return Err(PlanError::Refused(format!(
                "a directory above the plan file {} was replaced (by a link or a file): restore it by hand",
                path.display()
            )));
        }
        if let Ok(m) = fs_err::symlink_metadata(&path) {
            if !m.file_type().is_file() {
                if m.file_type().is_dir() {
                    fs_err::remove_dir_all(&path).map_err(|e| PlanError::io("remove", &path, e))?;
                } else {
                    fs_err::remove_file(&path).map_err(|e| PlanError::io("remove", &path, e))?;
                }
            }
        }
        // In place: the reviewer's box has a read-only view mounted over
        // this name, which a rename would detach.
        belay_sandbox::hostfs::write_in_place(root, &self.plan_rel, text.as_bytes())?;
        belay_record::atomic_write(&self.run.path(BASELINE), text.as_bytes())?;
        setup::control_store().trust(&setup::control_key(root, &self.plan_rel), text.as_bytes())?;
        Ok(serde_json::from_str(&text).unwrap_or_default())
    }

    /// What the ignore rules hide now (a directory once, as `dir/`, when
    /// there are more than 50,000 files), for telling what a call added
    /// there; `None` when git cannot say (then nothing is removed).
    pub(super) async fn ignored_now(&self) -> Option<Vec<String>> {
        let all = self.git.ignored_entries(false).await.ok()?;
        if all.len() > 50_000 {
            return self.git.ignored_entries(true).await.ok();
        }
        Some(all)
    }

    /// Remove the directories above `rel` that its removal left empty.
    fn remove_empty_parents(&self, rel: &str) {
        let root = self.git.root();
        let mut p = std::path::Path::new(rel.trim_end_matches('/')).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            if fs_err::remove_dir(root.join(d)).is_err() {
                break;
            }
            p = d.parent();
        }
    }

    /// Put `rel` back as HEAD has it, or remove it when HEAD has none.
    async fn drop_from_tree(&self, rel: &str) -> Result<(), PlanError> {
        let rel_file = rel.trim_end_matches('/');
        if self.git.in_head(rel_file).await? {
            let spec = format!(":(literal){rel_file}");
            self.git.restore_from_head(&[&spec]).await?;
            return Ok(());
        }
        self.remove_in_tree(rel)
    }

    /// Remove `rel` (a file, a link or a whole directory) from the work tree,
    /// not through links.
    fn remove_in_tree(&self, rel: &str) -> Result<(), PlanError> {
        let rel = rel.trim_end_matches('/');
        let root = self.git.root();
        if rel.is_empty() || !belay_sandbox::hostfs::parents_are_dirs(root, rel) {
            return Ok(());
        }
        let path = root.join(rel);
        match fs_err::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_dir() => {
                fs_err::remove_dir_all(&path).map_err(|e| PlanError::io("remove", &path, e))
            }
            Ok(_) => fs_err::remove_file(&path).map_err(|e| PlanError::io("remove", &path, e)),
            Err(_) => Ok(()),
        }
    }

    async fn drive(&mut self) -> Result<(), Stop> {
        let ids: Vec<String> = self.plan.checkpoints.iter().map(|c| c.id.clone()).collect();
        for id in ids {
            self.checkpoint(&id).await?;
        }
        Ok(())
    }

    fn failed(e: PlanError) -> Stop {
        Stop::Failed(e.to_string())
    }

    async fn checkpoint(&mut self, id: &str) -> Result<(), Stop> {
        let max = self.o.max_review_attempts;
        loop {
            let cp = self.state.get(id).cloned().ok_or_else(|| {
                Stop::Failed(format!("checkpoint `{id}` is not in the run state"))
            })?;
            match cp.stage {
                Stage::Approved => {
                    // Approved in this run: its approval is recorded already.
                    if cp
                        .decided
                        .as_ref()
                        .is_some_and(|d| d.by == "reviewer" && d.run_id == self.state.run_id)
                    {
                        return Ok(());
                    }
                    self.emit(
                        Some(id),
                        &PlanEvent::ApprovalComment {
                            approval_status: "approved",
                            checkpoint: id.into(),
                            comment: self.o.audit.prepare(&cp.notes),
                            review_attempt: cp.decided.as_ref().and_then(|d| d.review_attempt),
                            source: "existing_checkpoint",
                        },
                    )
                    .map_err(Self::failed)?;
                    return Ok(());
                }
                Stage::Pending | Stage::Revising => {
                    if cp.stage == Stage::Revising && cp.attempts >= max {
                        return Err(Stop::Halted(format!(
                            "{id} not approved after {} review attempt(s): halting for human review. Read the notes, then raise --max-review-attempts or run `belay plan reset {id}`",
                            cp.attempts
                        )));
                    }
                    if cp.failed_builds >= max {
                        return Err(Stop::Halted(format!(
                            "{id}: {} developer run(s) failed (agent errors, limits or a red gate): halting for human review. Read the events, then run `belay plan reset {id}`",
                            cp.failed_builds
                        )));
                    }
                    self.build(id, cp.stage == Stage::Revising).await?;
                }
                Stage::Built => {
                    if cp.attempts >= max {
                        return Err(Stop::Halted(format!(
                            "{id}: its {} review attempt(s) are used: raise --max-review-attempts or run `belay plan reset {id}`",
                            cp.attempts
                        )));
                    }
                    self.review(id).await?;
                }
            }
        }
    }

    /// One developer run: the call, belay's gate, the commit.
    async fn build(&mut self, id: &str, revision: bool) -> Result<(), Stop> {
        let run_kind = if revision { "revision" } else { "build" };
        let cp_plan = self
            .plan
            .get(id)
            .cloned()
            .ok_or_else(|| Stop::Failed(format!("checkpoint `{id}` is not in the plan")))?;
        let st =
            self.state.get(id).cloned().ok_or_else(|| {
                Stop::Failed(format!("checkpoint `{id}` is not in the run state"))
            })?;
        if !revision && st.base.is_none() {
            let head = self.git.head().await.map_err(|e| Self::failed(e.into()))?;
            self.cp_mut(id).map_err(Self::failed)?.base = Some(head);
        }
        self.emit(
            Some(id),
            &PlanEvent::CheckpointStarted {
                checkpoint: id.into(),
                name: cp_plan.name.clone(),
                run_kind,
            },
        )
        .map_err(Self::failed)?;
        let prompt = if revision {
            crate::prompts::revision(&self.plan_rel, &cp_plan, &st.notes, &st.feedback)
        } else {
            crate::prompts::developer(&self.plan, &self.plan_rel, &cp_plan, &st.feedback)
        };
        self.state.phase = Phase::Developing {
            checkpoint: id.into(),
        };
        self.save().map_err(Self::failed)?;
        let ignored_before: std::collections::HashSet<String> = self
            .git
            .ignored_entries(true)
            .await
            .unwrap_or_default()
            .into_iter()
            .collect();
        let out = self
            .call(Role::Developer, id, run_kind, &prompt)
            .await
            .map_err(Self::failed)?;
        // The review's fresh box starts while belay commits and gates.
        self.prepare_reviewer().await.map_err(Self::failed)?;
        let mut feedback = out.feedback;
        // The gate must see what a commit holds: files no commit takes
        // (.env files, agent tooling) that the developer made go first.
        let excluded: Vec<String> = self
            .git
            .dirty(&[])
            .await
            .map_err(|e| Self::failed(e.into()))?
            .into_iter()
            .filter(|p| commit::is_excluded(p))
            .collect();
        if !excluded.is_empty() {
            for p in &excluded {
                self.drop_from_tree(p).await.map_err(Self::failed)?;
                self.remove_empty_parents(p);
            }
            feedback.push(format!(
                "belay removed files that are never committed ({}): the work must not depend on them",
                excluded.join(", ")
            ));
            self.emit(
                Some(id),
                &PlanEvent::ExcludedRemoved {
                    checkpoint: id.into(),
                    paths: excluded,
                },
            )
            .map_err(Self::failed)?;
        }
        let not_committed: Vec<String> = self
            .git
            .ignored_entries(true)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !ignored_before.contains(p))
            .collect();
        if let Some(n) = out.judgement.notes.clone() {
            self.cp_mut(id).map_err(Self::failed)?.notes = n;
        }
        if let Some(fail) = out.failure {
            return self.build_failed(id, fail, feedback).await;
        }
        if !revision && out.judgement.status != Some(crate::schema::Status::Built) {
            feedback.push(format!(
                "you did not set checkpoint '{id}' to 'built' in {}; belay judged your run by its exit and its gate",
                self.plan_rel
            ));
        }
        // belay's own gate: the project's commands, in a sandbox.
        let gate = self.check(id, &not_committed).await.map_err(Self::failed)?;
        if let Some(g) = &gate {
            if !g.passed {
                feedback.push(format!(
                    "belay ran the project's commands and they failed; fix this before anything else:\n{}",
                    g.summary
                ));
                return self
                    .build_failed(id, "the project's commands failed".into(), feedback)
                    .await;
            }
        }
        {
            let cp = self.cp_mut(id).map_err(Self::failed)?;
            cp.feedback = feedback;
            cp.stage = Stage::Built;
        }
        self.state.phase = Phase::Idle;
        self.write_plan().map_err(Self::failed)?;
        let message = if revision {
            let n = st.revisions + 1;
            self.cp_mut(id).map_err(Self::failed)?.revisions = n;
            format!("{id}: revision {n}")
        } else {
            format!("{id}: built")
        };
        match self
            .commit(message, Some(id), Some(Stage::Built), false, vec![])
            .await
            .map_err(Self::failed)?
        {
            commit::Committed::Yes | commit::Committed::Nothing => Ok(()),
            commit::Committed::Refused(why) => {
                let fb = vec![format!("belay refused to commit your change: {why}")];
                let cp = self.cp_mut(id).map_err(Self::failed)?;
                cp.stage = st.stage;
                cp.revisions = st.revisions;
                self.build_failed(id, format!("the commit was refused: {why}"), fb)
                    .await
            }
        }
    }

    async fn build_failed(
        &mut self,
        id: &str,
        reason: String,
        feedback: Vec<String>,
    ) -> Result<(), Stop> {
        let n = {
            let cp = self.cp_mut(id).map_err(Self::failed)?;
            cp.failed_builds += 1;
            cp.feedback = feedback;
            cp.failed_builds
        };
        self.state.phase = Phase::Idle;
        self.emit(
            Some(id),
            &PlanEvent::BuildFailed {
                checkpoint: id.into(),
                reason,
                failed_builds: n,
            },
        )
        .map_err(Self::failed)?;
        self.write_plan().map_err(Self::failed)?;
        self.save().map_err(Self::failed)
    }
}
