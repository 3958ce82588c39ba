//! Before anything changes: the plan is valid, the branch is not protected,
//! the lock of the repository is held, the work tree is clean (or holds only
//! what a killed run of this plan left), and only then the branch.
//!
//! The lock is per repository and kernel-held (`flock`): a `kill -9` frees
//! it with the process, so it never goes stale. A run's records live under
//! belay's state home, `plan/runs/<run id>/`; `plan/<key>.current` names the
//! unfinished run of a plan file, which the same command resumes.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use belay_record::{Mode, OpenRun, RunHandle, RunLock};
use belay_vcs::Git;

use super::{Engine, RunOptions, BASELINE};
use crate::events::PlanEvent;
use crate::gate::{self, Role};
use crate::state::{Phase, RunState};
use crate::{schema, PlanError};

/// Where a plan's runs are kept.
#[derive(Debug, Clone)]
pub struct RunLocation {
    pub root: PathBuf,
    pub plan_rel: String,
    /// `plan/<key>.current`: the unfinished run's id.
    pub index: PathBuf,
    /// The repository's lock.
    pub lock: PathBuf,
}

impl RunLocation {
    pub fn run_dir(id: &str) -> PathBuf {
        belay_record::state_home().join("plan/runs").join(id)
    }
}

fn key(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// How to take a plan file that changed since belay last trusted it.
pub const ACCEPT_PLAN: &str =
    "rerun `belay plan run` with --accept-plan to take the file as it is now";

/// belay's trusted copies of plan files, in its own state home (never in a
/// tree an agent can write).
pub(super) fn control_store() -> belay_record::ControlStore {
    belay_record::ControlStore::new(belay_record::state_home().join("plan/trusted"))
}

/// The control store's key of the plan file `rel` of the work tree `root`.
pub(super) fn control_key(root: &Path, rel: &str) -> String {
    format!("plan\0{}\0{rel}", root.display())
}

/// Record the plan file as it is now as belay's trusted copy (`belay plan
/// init` wrote it).
pub async fn trust_plan(plan: &Path) -> Result<(), PlanError> {
    let (git, loc) = plan_key(plan).await?;
    let bytes = schema::read_in_tree(git.root(), &loc.plan_rel, plan)?;
    control_store().trust(&control_key(git.root(), &loc.plan_rel), &bytes)?;
    Ok(())
}

/// belay's state home must not be in the work tree: agents (and the code
/// they run) write the tree, and the state holds the truth (statuses,
/// attempts, who decided) and the trusted copies.
fn state_outside(root: &Path) -> Result<(), PlanError> {
    let home = belay_record::state_home();
    fs_err::create_dir_all(&home).map_err(|e| PlanError::io("create", &home, e))?;
    let home = fs_err::canonicalize(&home).map_err(|e| PlanError::io("resolve", &home, e))?;
    let tree = fs_err::canonicalize(root).map_err(|e| PlanError::io("resolve", root, e))?;
    if home.starts_with(&tree) {
        return Err(PlanError::Refused(format!(
            "belay's state home {} is inside the work tree {}, which the agents and the code they run can write: the run's state, its verdicts and belay's trusted copy of the plan would be theirs to change. Set BELAY_STATE_HOME to a directory outside the tree; nothing was changed",
            home.display(),
            tree.display()
        )));
    }
    Ok(())
}

/// The repository root, the plan's path in it, and where its runs are.
pub async fn plan_key(plan: &Path) -> Result<(Git, RunLocation), PlanError> {
    let abs = std::path::absolute(plan).map_err(|e| PlanError::io("resolve", plan, e))?;
    let dir = abs
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let git = Git::open(&dir, &belay_record::no_hooks_dir())
        .await
        .map_err(|e| {
            PlanError::Usage(format!(
                "the plan {} is not in a git work tree ({e}): the loop commits each step, so it needs one. Run `git init` there",
                plan.display()
            ))
        })?;
    let root = git.root().to_path_buf();
    let canon_dir = fs_err::canonicalize(&dir).map_err(|e| PlanError::io("resolve", &dir, e))?;
    let name = abs.file_name().map(PathBuf::from).unwrap_or_default();
    let rel = canon_dir
        .join(&name)
        .strip_prefix(&root)
        .map(|p| p.display().to_string())
        .map_err(|_| {
            PlanError::Usage(format!(
                "the plan {} is outside its repository {}",
                plan.display(),
                root.display()
            ))
        })?;
    let home = belay_record::state_home().join("plan");
    let repo_key = key(&git.git_dir().display().to_string());
    let loc = RunLocation {
        index: home.join(format!(
            "{}.current",
            key(&format!("{}\0{rel}", root.display()))
        )),
        lock: home.join("locks").join(format!("{repo_key}.lock")),
        root,
        plan_rel: rel,
    };
    Ok((git, loc))
}

fn lock(loc: &RunLocation) -> Result<RunLock, PlanError> {
    if let Some(d) = loc.lock.parent() {
        fs_err::create_dir_all(d).map_err(|e| PlanError::io("create", d, e))?;
    }
    RunLock::acquire(&loc.lock).map_err(|e| match e {
        belay_record::RecordError::Locked { .. } => PlanError::Refused(format!(
            "another belay plan command is working on {} (it holds {}): wait for it to end",
            loc.root.display(),
            loc.lock.display()
        )),
        o => o.into(),
    })
}

/// The unfinished run of this plan and its state, if there is one.
pub fn current_run(loc: &RunLocation) -> Result<Option<RunState>, PlanError> {
    // host-owned: the run index under belay's state home (refused inside the tree).
    let id = match fs_err::read_to_string(&loc.index) {
        Ok(s) => s.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(PlanError::io("read", &loc.index, e)),
    };
    if belay_record::run_id::validate(&id).is_err() {
        return Err(PlanError::Usage(format!(
            "{} does not name a run: remove it to start a new run",
            loc.index.display()
        )));
    }
    let dir = RunLocation::run_dir(&id);
    match RunHandle::load_state(&dir) {
        Ok(Some(s)) => Ok(Some(s)),
        Ok(None) => Err(PlanError::Usage(format!(
            "{} names run {id}, whose state is gone ({} has no state.json): remove {} to start a new run",
            loc.index.display(),
            dir.display(),
            loc.index.display()
        ))),
        Err(e) => Err(PlanError::Usage(format!(
            "{e}. Fix the file, or remove {} to start a new run (the old run's records stay in {})",
            loc.index.display(),
            dir.display()
        ))),
    }
}

/// `belay plan reset ID…`: clear checkpoints' attempts and failed builds in
/// the unfinished run (a checkpoint sent back stays due for its revision).
pub async fn reset(plan: &Path, ids: &[String]) -> Result<Vec<String>, PlanError> {
    let (_git, loc) = plan_key(plan).await?;
    let _lock = lock(&loc)?;
    let Some(mut state) = current_run(&loc)? else {
        return Err(PlanError::Usage(format!(
            "no unfinished run of {}: there is nothing to reset (a new run starts from the plan file)",
            plan.display()
        )));
    };
    let mut done: Vec<String> = Vec::new();
    for id in ids {
        if done.contains(id) {
            continue;
        }
        let known: Vec<String> = state.checkpoints.iter().map(|c| c.id.clone()).collect();
        let Some(cp) = state.get_mut(id) else {
            return Err(PlanError::Usage(format!(
                "checkpoint `{id}` is not in the run of {} (its checkpoints: {})",
                plan.display(),
                known.join(", ")
            )));
        };
        if cp.stage == crate::state::Stage::Approved {
            return Err(PlanError::Usage(format!(
                "checkpoint `{id}` is approved: reset clears the attempts of checkpoints still to be approved"
            )));
        }
        cp.attempts = 0;
        cp.failed_builds = 0;
        done.push(id.clone());
    }
    state.outcome = None;
    let dir = RunLocation::run_dir(&state.run_id);
    let text = serde_json::to_vec_pretty(&state).map_err(|e| PlanError::Usage(e.to_string()))?;
    belay_record::atomic_write(&dir.join(belay_record::STATE_FILE), &text)?;
    Ok(done)
}

/// The plan the run goes on with, and what to record about it.
///
/// * After a kill during an agent call the file is the agent's: the plan is
///   belay's own copy of what it last wrote, and what the agent changed is
///   judged and reverted like after any call (a reviewer's change is
///   tampering).
/// * Otherwise the file is read without following a link, and compared with
///   belay's trusted copy: a file that changed since belay last wrote it is
///   refused, with what changed, unless the user accepts it
///   (`--accept-plan`), which is recorded as `plan_changed`.
fn load_plan(
    o: &RunOptions,
    git: &Git,
    loc: &RunLocation,
    dir: &Path,
    interrupted: Option<&(Role, String)>,
) -> Result<(schema::Plan, Vec<PlanEvent>), PlanError> {
    let baseline_path = dir.join(BASELINE);
    // host-owned: the run dir under belay's state home (refused inside the tree).
    let baseline = fs_err::read_to_string(&baseline_path).ok();
    let mut notes: Vec<PlanEvent> = Vec::new();
    if let (Some((role, cid)), Some(text)) = (interrupted, &baseline) {
        let plan = schema::parse(&baseline_path, text)?;
        let disk =
            belay_sandbox::hostfs::read(git.root(), &loc.plan_rel, crate::schema::MAX_PLAN_BYTES)
                .ok()
                .flatten();
        let j = gate::judge(&plan.raw, disk.as_deref(), *role, cid);
        if !j.violations.is_empty() {
            notes.push(match role {
                Role::Developer => PlanEvent::ChangeReverted {
                    checkpoint: cid.clone(),
                    role: role.as_str(),
                    violations: j.violations,
                },
                Role::Reviewer => PlanEvent::PlanTampered {
                    checkpoint: cid.clone(),
                    role: role.as_str(),
                    violations: j.violations,
                },
            });
        }
        return Ok((plan, notes));
    }
    let bytes = schema::read_in_tree(git.root(), &loc.plan_rel, &o.plan)?;
    let key = control_key(git.root(), &loc.plan_rel);
    let accepted = match control_store().verify(&key, &o.plan, Some(&bytes), ACCEPT_PLAN) {
        Ok(()) => false,
        Err(_) if o.accept_plan => true,
        Err(changed) => return Err(changed.into()),
    };
    let plan = schema::parse_bytes(&o.plan, &bytes)?;
    let was = baseline
        .as_deref()
        .map(|t| serde_json::from_str::<serde_json::Value>(t).unwrap_or_default());
    if accepted || was.is_some_and(|w| w != plan.raw) {
        notes.push(PlanEvent::PlanChanged {
            plan: loc.plan_rel.clone(),
        });
    }
    Ok((plan, notes))
}

/// Everything before the loop.
/// Each role's agent speaks its endpoint's dialect: a mismatch would fail
/// at the role's first call, after work was done and an attempt spent.
fn check_endpoints(o: &RunOptions) -> Result<(), PlanError> {
    let roles = [
        ("developer", &o.developer, &o.developer_endpoint),
        ("reviewer", &o.reviewer, &o.reviewer_endpoint),
    ];
    for (role, spec, endpoint) in roles {
        let Some(e) = endpoint else { continue };
        spec.check_dialect(role, e.api, &e.base_url, |api| {
            format!(
                "give the {role} its own dialect with --{role}-llm-api {api} (and its address with --{role}-base-url URL, its key with --{role}-llm-key-env VAR)"
            )
        })
        .map_err(belay_agent::AgentError::from)?;
    }
    Ok(())
}

pub(super) async fn open(o: &RunOptions) -> Result<Engine<'_>, PlanError> {
    if o.max_review_attempts == 0 {
        return Err(PlanError::Usage(
            "--max-review-attempts must be 1 or more".into(),
        ));
    }
    check_endpoints(o)?;
    let (git, loc) = plan_key(&o.plan).await?;
    state_outside(git.root())?;
    if !o.on_host && loc.plan_rel.contains(':') {
        return Err(PlanError::Usage(format!(
            "the plan file's path `{}` holds a `:`, which a container mount cannot name (the reviewer sees the plan file read-only): rename it",
            loc.plan_rel
        )));
    }
    let lock = lock(&loc)?;
    let previous = current_run(&loc)?;
    let resumed = previous.is_some();
    let run_id = previous
        .as_ref()
        .map(|s| s.run_id.clone())
        .unwrap_or_else(|| belay_record::run_id::generate("plan"));
    let dir = RunLocation::run_dir(&run_id);
    // What a killed run left running goes first.
    let stale = belay_agent::cli::kill_recorded(&dir.join("agent.pid"));
    if let Some(rt) = &o.rt {
        let _ = belay_sandbox::reaper::reap_orphans(rt.as_ref()).await;
    }
    // A run cut short during an agent call: the plan file is the agent's, so
    // the plan is belay's copy of what it last wrote, and what the agent
    // changed is judged (and reverted) like after any call.
    let interrupted = previous.as_ref().and_then(|s| match &s.phase {
        Phase::Developing { checkpoint } => Some((Role::Developer, checkpoint.clone())),
        Phase::Reviewing { checkpoint, .. } => Some((Role::Reviewer, checkpoint.clone())),
        Phase::Idle => None,
    });
    let (plan, notes) = load_plan(o, &git, &loc, &dir, interrupted.as_ref())?;
    // The sandbox's image and what it brings, before anything changes: a
    // gate it cannot run is refused here.
    let env = match &o.rt {
        Some(rt) if !o.on_host || plan.has_commands() => {
            belay_sandbox::envimage::RunEnv::open(
                rt.as_ref(),
                &o.image,
                &run_id,
                belay_agent::sandbox::WORKDIR,
                &o.redactor,
                plan.has_commands(),
            )
            .await?
        }
        _ => Default::default(),
    };
    if o.rt.is_some() {
        refuse_gates_the_image_cannot_run(&plan, &env, git.root())?;
    }
    // The developer's first box opens while belay readies the branch.
    let prepared = prepare_developer(o, &plan, previous.as_ref(), &env, &git, &run_id, &dir);
    let rest: Result<Engine<'_>, PlanError> = async {
        let dirty = check_tree(&git, &loc, previous.as_ref(), interrupted.as_ref()).await?;
        let branch = enter_branch(&git, previous.as_ref(), &plan, &dirty).await?;
        let redactor = tree_redactor(o, &git).await?;
        let run = RunHandle::open(OpenRun {
            dir,
            id: &run_id,
            mode: Mode::Plan,
            title: Some(&format!("{} on {branch}", loc.plan_rel)),
            repo: None,
            redactor,
            registry: o.registry.clone(),
        })?;
        let mut state = match previous {
            Some(mut s) => {
                s.follow_plan(&plan);
                s.outcome = None;
                s.reason = None;
                s
            }
            None => RunState::new(&run_id, &loc.plan_rel, &plan),
        };
        state.branch = branch.clone();
        if let Some(d) = loc.index.parent() {
            fs_err::create_dir_all(d).map_err(|e| PlanError::io("create", d, e))?;
        }
        belay_record::atomic_write(&loc.index, run_id.as_bytes())?;
        let submodules = git.submodule_paths().await?;
        let mut e = Engine {
            o,
            plan,
            plan_rel: loc.plan_rel.clone(),
            git,
            run,
            state,
            submodules,
            commits: Vec::new(),
            index: loc.index.clone(),
            env,
            warm: Default::default(),
            prepared_reviewer: None,
            prepared_developer: None,
            gated: false,
            _lock: lock,
        };
        e.save()?;
        e.announce(&branch, resumed, &notes, stale)?;
        if resumed {
            e.recover().await?;
        }
        Ok(e)
    }
    .await;
    match rest {
        Ok(mut e) => {
            e.prepared_developer = prepared;
            Ok(e)
        }
        Err(err) => {
            super::call::close_opening(prepared).await;
            Err(err)
        }
    }
}

/// The developer's first box, opening in the background, when its call is
/// ahead (a checkpoint not yet approved) and agents run in containers.
fn prepare_developer(
    o: &RunOptions,
    plan: &schema::Plan,
    previous: Option<&RunState>,
    env: &belay_sandbox::envimage::RunEnv,
    git: &Git,
    run_id: &str,
    dir: &Path,
) -> Option<super::call::PreparedBox> {
    let rt = o.rt.clone().filter(|_| !o.on_host)?;
    let ahead = match previous {
        Some(s) => s
            .checkpoints
            .iter()
            .any(|c| c.stage != crate::state::Stage::Approved),
        None => plan
            .checkpoints
            .iter()
            .any(|c| c.status != schema::Status::Approved),
    };
    ahead.then(|| {
        super::call::open_in_background(
            o,
            Role::Developer,
            rt,
            super::call::role_spec(o, plan, Role::Developer),
            super::call::env_extras(env, Role::Developer),
            git.clone(),
            run_id.to_string(),
            dir.join("box"),
        )
    })
}

/// A gate command whose program the image lacks (`python3` in the base
/// image) would fail every attempt: refused before any agent runs, with the
/// way to an image that has the project's environment.
fn refuse_gates_the_image_cannot_run(
    plan: &crate::schema::Plan,
    env: &belay_sandbox::envimage::RunEnv,
    root: &std::path::Path,
) -> Result<(), PlanError> {
    for c in &plan.checkpoints {
        for (name, cmd) in plan.commands_for(&c.id).list() {
            if let Some(prog) = env.lacking(cmd) {
                return Err(PlanError::Usage(format!(
                    "checkpoint {}: its {name} command `{cmd}` runs `{prog}`, which the image {} does not have: build the project's environment with `belay env build --repo {}` (plan run then runs in it), or pass --image with one that has {prog}",
                    c.id,
                    env.image,
                    root.display()
                )));
            }
        }
    }
    Ok(())
}

/// The work tree's changes but the plan file, refused unless a resume's run left them.
async fn check_tree(
    git: &Git,
    loc: &RunLocation,
    previous: Option<&RunState>,
    interrupted: Option<&(Role, String)>,
) -> Result<Vec<String>, PlanError> {
    let resumed = previous.is_some();
    // The work tree: clean but for the plan file, unless this is a resume
    // (then the changes are what the run left: a killed agent's work, or a
    // build that failed its gate).
    let dirty: Vec<String> = git
        .dirty(&[])
        .await?
        .into_iter()
        .filter(|p| p != &loc.plan_rel)
        .collect();
    // A resume accepts what the run left: anything after a kill during an
    // agent call (the agent's partial work), else only the paths it recorded.
    let foreign: Vec<String> = match (previous, interrupted) {
        (Some(_), Some(_)) => vec![],
        (Some(s), None) if s.commit_pending.is_some() => vec![],
        (Some(s), None) => dirty
            .iter()
            .filter(|p| !s.left_dirty.contains(p))
            .cloned()
            .collect(),
        (None, _) => dirty.clone(),
    };
    if resumed && !foreign.is_empty() {
        return Err(PlanError::Refused(format!(
            "the work tree has changes the stopped run did not leave ({}{}): commit or stash them, then rerun to go on",
            foreign.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            if foreign.len() > 5 { ", …" } else { "" }
        )));
    }
    if !dirty.is_empty() && !resumed {
        return Err(PlanError::Refused(format!(
            "the work tree has uncommitted changes ({}{}): the loop commits every step and does not mix them in. Commit or stash them and rerun; nothing was changed",
            dirty.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            if dirty.len() > 5 { ", …" } else { "" }
        )));
    }
    Ok(dirty)
}

/// The run's branch (the resumed run's, else the plan's), checked, then checked out or made.
async fn enter_branch(
    git: &Git,
    previous: Option<&RunState>,
    plan: &schema::Plan,
    dirty: &[String],
) -> Result<String, PlanError> {
    let branch = previous
        .map(|s| s.branch.clone())
        .unwrap_or_else(|| plan.branch.clone());
    if let Some(why) = schema::branch_problem(&branch) {
        return Err(PlanError::Usage(why));
    }
    if !git.valid_branch(&branch).await? {
        return Err(PlanError::Usage(format!(
            "`{branch}` is not a branch name git accepts (git check-ref-format --branch)"
        )));
    }
    // Only now the branch: checked out, or made from HEAD.
    if git.current_branch().await?.as_deref() != Some(branch.as_str()) {
        if !dirty.is_empty() {
            return Err(PlanError::Refused(format!(
                "the work tree has changes of the killed run, but it is not on its branch {branch}: switch back to it (git switch {branch}) and rerun"
            )));
        }
        if !git.branch_exists(&branch).await? {
            let head = git.head().await.map_err(|e| {
                PlanError::Refused(format!(
                    "the repository has no commit to start {branch} from ({e}): make a first commit"
                ))
            })?;
            git.branch_create(&branch, &head).await?;
        }
        git.switch(&branch).await?;
    }
    Ok(branch)
}

/// The caller's redactor, with the values of the tree's tracked `.env` files added.
async fn tree_redactor(o: &RunOptions, git: &Git) -> Result<belay_record::Redactor, PlanError> {
    // The caller's redactor is the one policy's host part (secret-looking
    // variables included); the tree's `.env` values are added to it.
    let mut redactor = o.redactor.clone();
    // The agents can read the tree's .env files: their values are secrets too.
    let tracked_env: Vec<String> = git
        .run(&["ls-files", "-z", "--", ":(glob)**/.env", ":(glob)**/.env.*"])
        .await?
        .split('\0')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let root = git.root().to_path_buf();
    let found =
        tokio::task::spawn_blocking(move || crate::audit::dotenv_secrets(&root, &tracked_env))
            .await
            .unwrap_or_default();
    redactor.extend_from(&belay_record::Redactor::new(found));
    Ok(redactor)
}

impl Engine<'_> {
    /// Record the run's start, the notes about the plan, and a stale agent killed.
    fn announce(
        &self,
        branch: &str,
        resumed: bool,
        notes: &[PlanEvent],
        stale: bool,
    ) -> Result<(), PlanError> {
        self.emit(
            None,
            &PlanEvent::RunStarted {
                run_id: self.state.run_id.clone(),
                repo: self.git.root().to_path_buf(),
                plan: self.plan_rel.clone(),
                branch: branch.to_string(),
                resumed,
                audit_level: self.o.audit,
                max_review_attempts: self.o.max_review_attempts,
            },
        )?;
        for n in notes {
            self.emit(None, n)?;
        }
        if !self.env.dirs().is_empty() {
            self.emit(
                None,
                &PlanEvent::Sandbox {
                    image: self.o.image.clone(),
                    env_dirs: self.env.dirs(),
                },
            )?;
        }
        if stale {
            let checkpoint = match &self.state.phase {
                Phase::Developing { checkpoint } | Phase::Reviewing { checkpoint, .. } => {
                    Some(checkpoint.clone())
                }
                Phase::Idle => None,
            };
            self.emit(None, &PlanEvent::StaleAgentKilled { checkpoint })?;
        }
        Ok(())
    }
    /// After a crash: a commit that was being made is recognised (or made),
    /// and a review cut short has its reviewer's edits undone.
    async fn recover(&mut self) -> Result<(), PlanError> {
        if let Some(p) = self.state.commit_pending.clone() {
            if let Some(sha) = self.git.recognise_commit(&p.before, &p.message).await? {
                self.state.commit_pending = None;
                if let (Some(id), Some(then)) = (&p.checkpoint, p.then) {
                    if let Some(cp) = self.state.get_mut(id) {
                        cp.stage = then;
                    }
                }
                self.state.phase = Phase::Idle;
                self.commits.push(sha.clone());
                self.emit(
                    p.checkpoint.as_deref(),
                    &PlanEvent::CommitStatement {
                        commit_hash: Some(sha),
                        message: p.message.lines().next().unwrap_or_default().to_string(),
                        status: "committed",
                        reason: None,
                        recovered: true,
                    },
                )?;
                self.save()?;
            } else if let (Some(id), Some(then)) = (p.checkpoint.clone(), p.then) {
                // Not made: make it now (the tree still holds the work). The
                // plan file shows the stage the commit records.
                self.state.commit_pending = None;
                let was = self.state.get(&id).map(|c| c.stage);
                if let Some(cp) = self.state.get_mut(&id) {
                    cp.stage = then;
                }
                self.state.phase = Phase::Idle;
                self.write_plan()?;
                let approval = then == crate::state::Stage::Approved;
                let paths = if approval {
                    vec![self.plan_rel.clone()]
                } else {
                    vec![]
                };
                let made = self
                    .commit(p.message.clone(), Some(&id), Some(then), approval, paths)
                    .await?;
                if let super::commit::Committed::Refused(why) = made {
                    // Refused: not built (or not approved) after all.
                    if let Some(cp) = self.state.get_mut(&id) {
                        cp.stage = match (then, was) {
                            (crate::state::Stage::Approved, _) => crate::state::Stage::Built,
                            (_, Some(w)) if w != then => w,
                            _ if cp.revisions > 0 => crate::state::Stage::Revising,
                            _ => crate::state::Stage::Pending,
                        };
                        cp.feedback = vec![format!("belay refused to commit your change: {why}")];
                    }
                    self.write_plan()?;
                    self.save()?;
                }
            } else {
                self.state.commit_pending = None;
                self.save()?;
            }
        }
        if let Phase::Reviewing {
            checkpoint,
            ignored_before,
            ..
        } = self.state.phase.clone()
        {
            self.revert_reviewer_edits(&checkpoint, ignored_before.as_deref())
                .await?;
        }
        self.write_plan()?;
        Ok(())
    }
}
