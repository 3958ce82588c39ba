//! What waits for a person, and acting on it from the page: a job's start
//! approval (`pending/`) and commit approval (`held/`), through
//! `belay_jobs::gates` as `belay jobs accept|decline|approve|discard` does,
//! and a halted plan loop, through `belay_plan::engine::reset` as
//! `belay plan reset` does. The page is the owner: it holds the token.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use axum::Json;
use belay_jobs::config::LOCAL_SENDER;
use belay_jobs::queue::{Dir, Queue};
use belay_record::{Id, Mode, RunEntry};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::api::{bad, internal, redacted_json};
use crate::state::App;

/// One thing the page can do about a waiting item.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Action {
    /// `job` or `plan`.
    pub target: String,
    /// `accept`, `decline`, `approve`, `discard` (a job), `reset` (a plan).
    pub verb: String,
    pub label: String,
    /// The job's queue, or the plan file.
    pub place: String,
    /// The job's id, or the plan run's.
    pub id: String,
    /// The checkpoints a reset clears.
    #[serde(default)]
    pub checkpoints: Vec<String>,
}

/// A run (or a job without a run yet) that waits for a person.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Waiting {
    pub kind: &'static str,
    pub id: String,
    pub reason: String,
    pub detail: String,
    pub actions: Vec<Action>,
}

/// The queues the page knows: those it was given and those of the jobs runs
/// in the registry (`<queue>/runs/<id>`).
fn queues(app: &App, runs: &[RunEntry]) -> Vec<PathBuf> {
    let mut set: BTreeSet<PathBuf> = app.queues.iter().cloned().collect();
    for c in &app.jobs_configs {
        if let Ok(cfg) = belay_jobs::config::locate(Some(c), None) {
            set.insert(cfg.queue);
        }
    }
    for e in runs.iter().filter(|e| e.mode == Mode::Jobs) {
        if let Some(q) = e
            .dir
            .parent()
            .filter(|p| p.file_name().is_some_and(|n| n == "runs"))
            .and_then(Path::parent)
        {
            set.insert(q.to_path_buf());
        }
    }
    set.into_iter()
        .filter(|q| q.join("inbox").is_dir())
        .collect()
}

fn jobs_in(q: &Path, d: Dir) -> Vec<belay_jobs::Job> {
    let dir = q.join(d.as_str());
    // host-owned: a directory of a job queue (0700, belay's own).
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return vec![];
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v.iter().filter_map(|p| Queue::read(p).ok()).collect()
}

fn job_action(verb: &str, label: &str, q: &Path, id: &Id) -> Action {
    Action {
        target: "job".into(),
        verb: verb.into(),
        label: label.into(),
        place: q.display().to_string(),
        id: id.to_string(),
        checkpoints: vec![],
    }
}

/// The held change's summary, every path of it.
fn held_detail(q: &Path, id: &Id) -> String {
    let p = q.join("held").join(format!("{id}.held"));
    // host-owned: the queue's held/<id>.held (0700), named by a parsed id.
    let Ok(t) = std::fs::read_to_string(&p) else {
        return String::new();
    };
    let v: Value = serde_json::from_str(&t).unwrap_or_default();
    let mut out = String::new();
    for r in v["repos"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{}:\n{}\n",
            r["name"].as_str().unwrap_or("?"),
            r["diffstat"].as_str().unwrap_or("")
        ));
    }
    out
}

/// What the page keeps of a held change's patch.
const HELD_PATCH_SHOWN: u64 = 512 << 10;

/// The whole patch a commit approval approves (`<queue>/runs/<id>/held.diff`,
/// written by belay when it held the change), cut for the page with a note.
pub(crate) fn held_patch(w: &Waiting) -> Option<String> {
    if w.kind != "job_commit" {
        return None;
    }
    let q = PathBuf::from(&w.actions.first()?.place);
    let dir = q.join("runs").join(&w.id);
    let f = crate::files::inside(&dir, belay_jobs::exec::HELD_PATCH)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(f, HELD_PATCH_SHOWN + 1),
        &mut bytes,
    )
    .ok()?;
    let cut = bytes.len() as u64 > HELD_PATCH_SHOWN;
    bytes.truncate(HELD_PATCH_SHOWN as usize);
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if cut {
        text.push_str(&format!(
            "\n[belay: the page shows the first {} KiB; `git stash show -p --include-untracked` of the held stash has the rest]\n",
            HELD_PATCH_SHOWN >> 10
        ));
    }
    Some(text)
}

fn halted_plan(e: &RunEntry) -> Option<Waiting> {
    let text = crate::files::read_record(&e.dir, "state.json", 4 << 20)?;
    // The plan loop's own state type: a field it renames is a compile error here.
    let st: belay_plan::state::RunState = serde_json::from_str(&text).ok()?;
    if st.outcome != Some(belay_plan::state::Outcome::Halted) {
        return None;
    }
    // The plan file, from the run's first start event (`repo` + `plan`),
    // which is at the head of its log: only the head is read.
    let started = crate::files::first_event(&e.dir, "run_started", 256 << 10)?;
    let plan = Path::new(started["data"]["repo"].as_str()?).join(&st.plan);
    let open: Vec<String> = st
        .checkpoints
        .iter()
        .filter(|c| c.stage != belay_plan::state::Stage::Approved)
        .map(|c| c.id.clone())
        .collect();
    Some(Waiting {
        kind: "plan_halted",
        id: e.run_id.clone(),
        reason: format!(
            "halted for a human: {}",
            st.reason.as_deref().unwrap_or("the loop stopped")
        ),
        detail: format!(
            "checkpoints not approved: {}\nplan file: {}",
            open.join(", "),
            plan.display()
        ),
        actions: vec![Action {
            target: "plan".into(),
            verb: "reset".into(),
            label: "Reset their attempts".into(),
            place: plan.display().to_string(),
            id: e.run_id.clone(),
            checkpoints: open,
        }],
    })
}

/// Everything that waits, jobs without a run included.
pub(crate) fn waiting_all(app: &App, runs: &[RunEntry]) -> Vec<Waiting> {
    let mut out = Vec::new();
    for q in queues(app, runs) {
        for j in jobs_in(&q, Dir::Pending) {
            out.push(Waiting {
                kind: "job_start",
                id: j.id.to_string(),
                reason: format!("waiting for the start approval ({})", j.requester()),
                detail: j.preview(400),
                actions: vec![
                    job_action("accept", "Accept", &q, &j.id),
                    job_action("decline", "Decline", &q, &j.id),
                ],
            });
        }
        for j in jobs_in(&q, Dir::Held) {
            out.push(Waiting {
                kind: "job_commit",
                id: j.id.to_string(),
                reason: "waiting for the commit approval".into(),
                detail: format!("{}\n{}", j.preview(200), held_detail(&q, &j.id)),
                actions: vec![
                    job_action("approve", "Approve", &q, &j.id),
                    job_action("discard", "Discard", &q, &j.id),
                ],
            });
        }
    }
    // A halted loop ended not ok: the others' states are not read.
    for e in runs
        .iter()
        .filter(|e| e.mode == Mode::Plan && e.status == belay_record::RunStatus::Failed)
    {
        out.extend(halted_plan(e));
    }
    out
}

/// The runs among `runs` that wait, by id.
pub(crate) fn waiting_runs(app: &App, runs: &[RunEntry]) -> HashMap<String, Waiting> {
    waiting_all(app, runs)
        .into_iter()
        .map(|w| (w.id.clone(), w))
        .collect()
}

/// `GET /api/attention[?diff=1]`: with `diff`, each held change's patch
/// (read from disk: only the attention page asks, not every list refresh).
#[derive(Deserialize)]
pub(crate) struct AttentionQuery {
    diff: Option<String>,
}

pub(crate) async fn attention(
    State(app): State<Arc<App>>,
    axum::extract::Query(q): axum::extract::Query<AttentionQuery>,
) -> Response {
    let diffs = q.diff.as_deref().is_some_and(|v| v == "1" || v == "true");
    let runs = app.registry.list().unwrap_or_default();
    let mut items: Vec<Value> = waiting_all(&app, &runs)
        .into_iter()
        .map(|w| {
            let mut v = serde_json::to_value(&w).unwrap_or_default();
            // A job's card links to its run once it has one.
            if runs.iter().any(|e| e.run_id == w.id) {
                v["run"] = json!(w.id);
            }
            if let Some(d) = diffs.then(|| held_patch(&w)).flatten() {
                v["diff"] = json!(d);
            }
            v
        })
        .collect();
    for e in runs
        .iter()
        .filter(|e| e.status == belay_record::RunStatus::Interrupted)
    {
        items.push(json!({
            "kind": "interrupted", "id": e.run_id, "actions": [],
            "reason": "interrupted: its process is gone",
            "detail": format!("{} run in {}; resume it with its mode's --resume", e.mode.as_str(), e.dir.display()),
        }));
    }
    redacted_json(&app, json!({"items": items}))
}

fn known(app: &App, a: &Action) -> bool {
    let runs = app.registry.list().unwrap_or_default();
    waiting_all(app, &runs)
        .iter()
        .flat_map(|w| &w.actions)
        .any(|k| {
            k.target == a.target
                && k.verb == a.verb
                && k.id == a.id
                && k.place == a.place
                && k.checkpoints == a.checkpoints
        })
}

fn services(app: &App, queue: &Path) -> Result<belay_jobs::Services, belay_jobs::JobsError> {
    let configured = app.jobs_configs.iter().find_map(|c| {
        belay_jobs::config::locate(Some(c), None)
            .ok()
            .filter(|cfg| cfg.queue == queue)
    });
    let cfg = match configured {
        Some(c) => c,
        None => belay_jobs::config::locate(None, Some(queue))?,
    };
    // What an approval does is recorded in the job's run (the page reads it
    // there); nothing is shown here.
    belay_jobs::Services::open(cfg, None, std::sync::Arc::new(belay_record::NoObserver))
}

/// Why an action from the page failed, as the page is told it: a job's
/// error as chat and HTTP show it (ids and a reason, no host path).
#[derive(Debug, thiserror::Error)]
enum ActError {
    #[error("{}", .0.reply())]
    Jobs(belay_jobs::JobsError),
    #[error(transparent)]
    Plan(belay_plan::PlanError),
}

/// `POST /api/act` with one of the actions the page was given.
pub(crate) async fn act(State(app): State<Arc<App>>, body: Option<Json<Action>>) -> Response {
    let Some(Json(a)) = body else {
        return bad("an action is a JSON object: target, verb, place, id");
    };
    // The id is parsed by the one validator before anything else.
    let kind = if a.target == "plan" { "run" } else { "job" };
    let id = match Id::parse(kind, &a.id) {
        Ok(id) => id,
        Err(e) => return bad(e.to_string()),
    };
    // Only what waits can be acted on: the page cannot be made to reach a
    // queue or a plan file it was not shown.
    if !known(&app, &a) {
        return bad(format!(
            "{} {id} is not waiting for `{}` (any more)",
            a.target, a.verb
        ));
    }
    let r: Result<String, ActError> = match (a.target.as_str(), a.verb.as_str()) {
        ("job", verb) => {
            let q = PathBuf::from(&a.place);
            let needs_engine = verb == "approve";
            match services(&app, &q) {
                Err(e) => Err(ActError::Jobs(e)),
                Ok(mut svc) => {
                    if needs_engine {
                        svc.ensure_engine().await;
                    }
                    let r = match verb {
                        "accept" => belay_jobs::gates::accept(&svc, &id, LOCAL_SENDER),
                        "decline" => belay_jobs::gates::decline(&svc, &id, LOCAL_SENDER),
                        "approve" => belay_jobs::gates::approve(&svc, &id, LOCAL_SENDER).await,
                        "discard" => belay_jobs::gates::discard(&svc, &id, LOCAL_SENDER).await,
                        _ => return bad(format!("a job has no `{verb}`")),
                    };
                    r.map_err(ActError::Jobs)
                }
            }
        }
        ("plan", "reset") => belay_plan::engine::reset(Path::new(&a.place), &a.checkpoints)
            .await
            .map(|done| {
                format!(
                    "reset the attempts of {}: the next `belay plan run` goes on with them",
                    done.join(", ")
                )
            })
            .map_err(ActError::Plan),
        _ => return bad(format!("no action {} {}", a.target, a.verb)),
    };
    match r {
        Ok(msg) => redacted_json(&app, json!({"ok": true, "message": msg})),
        Err(e) => {
            let mut resp = internal(e);
            *resp.status_mut() = axum::http::StatusCode::CONFLICT;
            resp
        }
    }
}
