//! `belay env build-projects`: many repositories, each in its own run.
//!
//! Lines of the projects file are `owner/repo [ref]` (cloned from a git base
//! URL), a full git URL `[ref]`, or a local path. Each project is checked out
//! under the projects dir (hooks never run), its `.github` is quarantined into
//! the oracles dir, and it is built with its own run id and image prefix, up
//! to `--jobs` at a time. One project's failure never stops the others unless
//! asked. Failures go to `failed-projects.log`; the summary to
//! `build-projects-summary.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use belay_record::{JsonlAppender, Redactor};
use belay_sandbox::ContainerRuntime;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};

use crate::build::{build, BuildOptions};
use crate::manifest::Manifest;
use crate::progress::{BuildEvent, BuildObserver};
use crate::EnvError;

/// Where a project comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// `owner/repo`, cloned from the git base URL.
    Slug(String),
    GitUrl(String),
    Local(PathBuf),
}

/// One line of the projects file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectSpec {
    pub line: usize,
    pub name: String,
    pub source: Source,
    pub reference: Option<String>,
}

impl ProjectSpec {
    /// The first column of `failed-projects.log`: the source as written,
    /// without credentials in a git URL (they are for `git clone` alone).
    pub fn display_source(&self) -> String {
        match &self.source {
            Source::GitUrl(s) => belay_record::without_userinfo(s).unwrap_or_else(|| s.clone()),
            Source::Slug(s) => s.clone(),
            Source::Local(p) => p.display().to_string(),
        }
    }

    /// Whether its git URL carries credentials (which must then not leave
    /// this process).
    pub(crate) fn has_url_credentials(&self) -> bool {
        let mut r = Redactor::default();
        if let Source::GitUrl(u) = &self.source {
            r.add_url_credentials("PROJECT_URL", u);
        }
        !r.secrets().is_empty()
    }

    /// What must not appear in any output of the project's build: the one
    /// policy's host part and the credentials of the project's git URL.
    fn redactor(&self) -> Redactor {
        let mut r = belay_sandbox::trust::host_redactor();
        if let Source::GitUrl(u) = &self.source {
            r.add_url_credentials("PROJECT_URL", u);
        }
        r
    }
}

pub(crate) fn bad(path: &Path, line: usize, message: String) -> EnvError {
    EnvError::BadManifest {
        path: path.to_path_buf(),
        line,
        column: 1,
        message,
    }
}

fn is_git_url(s: &str) -> bool {
    s.contains("://") || (s.starts_with("git@") && s.contains(':'))
}

/// Project names double as run-id and image-name parts: at most 40
/// characters, starting and ending with a letter or digit, and between
/// those only what Docker's reference grammar allows there (a run of `-`
/// and `_`, which the image name writes as `-`, or one `.`): a source named
/// `pkg_1.2+dfsg-1.orig` must not make `belay-pkg-1.2-dfsg-1.-…`, which the
/// engine refuses ("invalid reference format").
fn project_name(raw: &str) -> String {
    let mut n = String::new();
    let mut gap = String::new();
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() {
            if !n.is_empty() && !gap.is_empty() {
                let dotted = gap.contains('.');
                n.push_str(if gap == "." || !dotted { &gap } else { "-" });
            }
            gap.clear();
            n.push(c.to_ascii_lowercase());
        } else {
            gap.push(if c == '-' || c == '.' { c } else { '_' });
        }
    }
    let mut n: String = n.chars().take(40).collect();
    while n.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        n.pop();
    }
    if n.is_empty() {
        n.push_str("project");
    }
    n
}

/// Parse a projects file. Relative local paths are relative to the file.
pub fn parse_projects(text: &str, path: &Path) -> Result<Vec<ProjectSpec>, EnvError> {
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut out: Vec<ProjectSpec> = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line = idx + 1;
        let content = raw.split(" #").next().unwrap_or(raw).trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = content.split_whitespace().collect();
        if words.len() > 2 {
            return Err(bad(path, line, format!("expected `owner/repo ref`, a git URL or a local path (with an optional ref), got {} fields: {content:?}", words.len())));
        }
        let (first, reference) = (words[0], words.get(1).map(|s| s.to_string()));
        if first.starts_with('-') {
            return Err(bad(
                path,
                line,
                format!("{first:?} looks like an option, not a project"),
            ));
        }
        if let Some(r) = &reference {
            if r.starts_with('-')
                || r.contains("..")
                || r.chars()
                    .any(|c| c.is_control() || c == ' ' || c == '~' || c == '^' || c == ':')
            {
                return Err(bad(
                    path,
                    line,
                    format!("{r:?} is not a valid git ref or commit"),
                ));
            }
        }
        let (source, name) = if is_git_url(first) {
            let tail = first
                .trim_end_matches('/')
                .rsplit(['/', ':'])
                .next()
                .unwrap_or(first);
            (
                Source::GitUrl(first.to_string()),
                project_name(tail.trim_end_matches(".git")),
            )
        } else if first.starts_with('/')
            || first.starts_with("./")
            || first.starts_with("../")
            || first.starts_with('~')
        {
            let p = if let Some(rest) = first.strip_prefix("~/") {
                std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_default()
                    .join(rest)
            } else if first.starts_with('/') {
                PathBuf::from(first)
            } else {
                base.join(first)
            };
            if !p.is_dir() {
                return Err(bad(
                    path,
                    line,
                    format!("local project {} is not a directory", p.display()),
                ));
            }
            let name = p
                .canonicalize()
                .ok()
                .and_then(|c| c.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| first.to_string());
            (Source::Local(p), project_name(&name))
        } else {
            let parts: Vec<&str> = first.split('/').collect();
            if parts.len() != 2
                || parts.iter().any(|p| {
                    p.is_empty()
                        || !p
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                })
            {
                return Err(bad(path, line, format!("{first:?} is neither owner/repo, a git URL nor a local path (local paths start with / or ./)")));
            }
            (
                Source::Slug(first.to_string()),
                project_name(&format!("{}__{}", parts[0], parts[1])),
            )
        };
        if let Some(prev) = out.iter().find(|p| p.name == name) {
            return Err(bad(
                path,
                line,
                format!("project name {name} is already used on line {}", prev.line),
            ));
        }
        out.push(ProjectSpec {
            line,
            name,
            source,
            reference,
        });
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub struct BatchOptions {
    pub projects_file: PathBuf,
    pub projects_dir: PathBuf,
    pub oracles_dir: Option<PathBuf>,
    /// Base URL for `owner/repo` lines (`<base>/<owner>/<repo>.git`).
    pub git_base_url: Option<String>,
    pub jobs: usize,
    pub limit: Option<usize>,
    pub start: usize,
    pub only: Vec<String>,
    pub stop_on_failure: bool,
    pub skip_existing_success: bool,
    pub run_id_prefix: String,
    pub state_dir: Option<PathBuf>,
    /// Settings every project build starts from (repo, run id, image prefix,
    /// state dir and oracle file are set per project).
    pub build: BuildOptions,
    pub git_timeout: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProjectResult {
    pub name: String,
    pub line: usize,
    pub source: String,
    pub reference: Option<String>,
    /// ok | failed | skipped
    pub status: String,
    /// prepare_failed | build_failed, for failures.
    pub stage: Option<String>,
    pub checkout_dir: PathBuf,
    pub run_id: String,
    pub image_prefix: String,
    pub duration_s: f64,
    pub repairs: u32,
    pub cache_hits: u32,
    pub cache_misses: u32,
    pub blocks: usize,
    pub final_image: Option<String>,
    pub manifest: Option<PathBuf>,
    pub error: Option<String>,
    /// The manifest's failure class (`needs network at collection: host …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BatchSummary {
    pub projects_file: PathBuf,
    pub ablation_mode: String,
    pub jobs: usize,
    pub started_at: String,
    pub finished_at: String,
    pub duration_s: f64,
    pub total: usize,
    pub ok: usize,
    pub failed: usize,
    pub skipped: usize,
    /// Failed projects per failure class (`needs network at collection`,
    /// or `unclassified`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failure_classes: BTreeMap<String, usize>,
    pub projects: Vec<ProjectResult>,
}

/// What the batch reports while it runs.
pub trait BatchObserver: Send + Sync {
    fn project_started(&self, name: &str);
    fn project_event(&self, name: &str, event: &BuildEvent);
    fn project_finished(&self, result: &ProjectResult);
    /// The engine failed under `held` projects (`why`): the batch takes no
    /// new project and waits for it to answer, at most `budget`.
    fn engine_lost(&self, _why: &str, _held: &[String], _budget: Duration) {}
    /// The engine answers again after `waited`: the held projects resume
    /// from their checkpoints.
    fn engine_back(&self, _waited: Duration) {}
}

/// How long a batch waits for an engine that stopped answering before it
/// gives up (exit 3; the same command resumes every project not finished).
pub const ENGINE_WAIT: Duration = Duration::from_secs(600);
/// How often one project is resumed after the engine failed under it
/// before it is failed for good.
const ENGINE_RETRIES: u32 = 3;

/// A project whose build the engine's failure stopped: resumed from its
/// checkpoints once the engine answers again.
struct Held {
    p: ProjectSpec,
    b: BuildOptions,
    result: ProjectResult,
    t0: Instant,
    error: EnvError,
    tries: u32,
}

/// How a project's turn in the batch ended.
enum Turn {
    Done(Box<ProjectResult>),
    EngineLost(Box<Held>),
}

struct ProjectObserver<'a> {
    name: &'a str,
    inner: &'a dyn BatchObserver,
}

impl BuildObserver for ProjectObserver<'_> {
    fn event(&self, event: &BuildEvent) {
        self.inner.project_event(self.name, event);
    }
    fn output(&self, _block: &str, _stream: belay_sandbox::StreamKind, _bytes: &[u8]) {}
}

/// Failed projects per class: a classified failure by its class (what
/// follows the first `: `, the host or the error, left out), the rest as
/// `unclassified`.
fn failure_classes(results: &[ProjectResult]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in results.iter().filter(|r| r.status == "failed") {
        let class = r
            .failure_class
            .as_deref()
            .map(|c| c.split(": ").next().unwrap_or(c).to_string())
            .unwrap_or_else(|| "unclassified".to_string());
        *out.entry(class).or_insert(0) += 1;
    }
    out
}

pub const SUMMARY_FILE: &str = "build-projects-summary.json";
pub const FAILED_LOG: &str = "failed-projects.log";

/// The projects of the batch: the file parsed, `--only`, `--start` and
/// `--limit` applied.
pub(crate) fn select_projects(opts: &BatchOptions) -> Result<Vec<ProjectSpec>, EnvError> {
    // host-owned: the projects file is the user's, named on the command line.
    let text = fs_err::read_to_string(&opts.projects_file).map_err(|e| {
        EnvError::Usage(format!(
            "cannot read the projects file {}: {e}. Pass --projects-file with one project per line",
            opts.projects_file.display()
        ))
    })?;
    let all = parse_projects(&text, &opts.projects_file)?;
    if all.iter().any(|p| matches!(p.source, Source::Slug(_))) && opts.git_base_url.is_none() {
        let line = all
            .iter()
            .find(|p| matches!(p.source, Source::Slug(_)))
            .map(|p| p.line)
            .unwrap_or(1);
        return Err(bad(
            &opts.projects_file,
            line,
            "owner/repo lines need a git base URL: pass --git-base-url URL (or set BELAY_GIT_BASE_URL); full git URLs and local paths need none".into(),
        ));
    }
    for o in &opts.only {
        if !all.iter().any(|p| &p.name == o || p.display_source() == *o) {
            return Err(EnvError::Usage(format!(
                "--only {o}: no such project in {}; names are: {}",
                opts.projects_file.display(),
                all.iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let selected: Vec<ProjectSpec> = all
        .into_iter()
        .filter(|p| {
            opts.only.is_empty()
                || opts
                    .only
                    .iter()
                    .any(|o| *o == p.name || *o == p.display_source())
        })
        .skip(opts.start)
        .take(opts.limit.unwrap_or(usize::MAX))
        .collect();
    fs_err::create_dir_all(&opts.projects_dir).map_err(|e| EnvError::StateDir {
        path: opts.projects_dir.clone(),
        reason: e.to_string(),
    })?;
    Ok(selected)
}

/// The batch's records as projects finish: `failed-projects.log` and the
/// usage log line by line, then the summary. Every executor reports through it.
pub(crate) struct Collector<'a> {
    opts: &'a BatchOptions,
    failed_out: LineLog,
    usage_log: JsonlAppender,
    results: Vec<ProjectResult>,
    started: Instant,
    started_at: String,
}

impl<'a> Collector<'a> {
    pub(crate) fn open(opts: &'a BatchOptions) -> Result<Self, EnvError> {
        let failed_log = opts.projects_dir.join(FAILED_LOG);
        belay_record::atomic_write(&failed_log, b"")?;
        Ok(Self {
            opts,
            failed_out: LineLog::open(&failed_log)?,
            usage_log: JsonlAppender::open(&opts.projects_dir.join("llm-usage-projects.jsonl"))?,
            results: Vec::new(),
            started: Instant::now(),
            started_at: belay_record::now_rfc3339(),
        })
    }

    /// Record a finished project; `true` when the batch should stop
    /// starting new ones (`--stop-on-failure`).
    pub(crate) fn record(&mut self, result: ProjectResult) -> Result<bool, EnvError> {
        let mut stop = false;
        if result.status == "failed" {
            self.failed_out.line(&format!(
                "{}\t{}\t{}\t{}\t{}",
                result.source,
                result.reference.clone().unwrap_or_default(),
                result.checkout_dir.display(),
                result.checkout_dir.display(),
                result.stage.clone().unwrap_or_default()
            ))?;
            stop = self.opts.stop_on_failure;
        }
        if let Some(m) = &result.manifest {
            // host-owned: the run's manifest, which belay wrote in its state dir.
            if let Ok(t) = fs_err::read_to_string(m) {
                if let Ok(man) = serde_json::from_str::<Manifest>(&t) {
                    self.usage_log.append(
                        &serde_json::json!({"project": result.name, "run_id": result.run_id, "ablation_mode": man.ablation_mode, "ok": man.ok, "llm_usage": man.llm_usage}),
                        &Redactor::default(),
                    )?;
                }
            }
        }
        self.results.push(result);
        Ok(stop)
    }

    pub(crate) fn finish(mut self) -> Result<BatchSummary, EnvError> {
        let opts = self.opts;
        self.results.sort_by_key(|r| r.line);
        let results = self.results;
        let summary = BatchSummary {
            projects_file: opts.projects_file.clone(),
            ablation_mode: opts.build.ablation.as_str().into(),
            jobs: opts.jobs,
            started_at: self.started_at,
            finished_at: belay_record::now_rfc3339(),
            duration_s: (self.started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
            total: results.len(),
            ok: results.iter().filter(|r| r.status == "ok").count(),
            failed: results.iter().filter(|r| r.status == "failed").count(),
            skipped: results.iter().filter(|r| r.status == "skipped").count(),
            failure_classes: failure_classes(&results),
            projects: results,
        };
        belay_record::write_json_atomic(&opts.projects_dir.join(SUMMARY_FILE), &summary)?;
        Ok(summary)
    }
}

/// Run the batch on this machine's engine.
pub async fn build_projects(
    rt: &dyn ContainerRuntime,
    opts: &BatchOptions,
    obs: &dyn BatchObserver,
) -> Result<BatchSummary, EnvError> {
    let selected = select_projects(opts)?;
    // The projects of this batch share their toolchain checkpoints, under
    // `--no-cache` too; nothing made by another batch counts as this one's.
    let mut scoped = opts.clone();
    if scoped.build.cache_scope.is_none() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        scoped.build.cache_scope = Some(format!(
            "batch-{}-{}-{nanos}",
            opts.run_id_prefix,
            std::process::id()
        ));
    }
    let opts = &scoped;
    let mut collector = Collector::open(opts)?;
    let mut queue = selected.into_iter();
    type TurnFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Turn> + Send + 'a>>;
    let mut running: FuturesUnordered<TurnFuture<'_>> = FuturesUnordered::new();
    let mut held: Vec<Box<Held>> = Vec::new();
    let mut stop = false;
    loop {
        // While the engine is lost, no project starts: the ones running end
        // (or are held too), then the batch waits for the engine.
        while held.is_empty()
            && !stop
            && !opts.build.stop.is_set()
            && running.len() < opts.jobs.max(1)
        {
            let Some(p) = queue.next() else { break };
            running.push(Box::pin(run_project(rt, opts, p, obs)));
        }
        let Some(turn) = running.next().await else {
            if held.is_empty() || opts.build.stop.is_set() {
                break;
            }
            let names: Vec<String> = held.iter().map(|h| h.p.name.clone()).collect();
            // An engine that answers with a failure (a full disk, a 5xx, a
            // container killed from outside) would fail every project the
            // same way: the batch stops, and the queue is left for the
            // same command once the machine is fixed.
            if let Some(h) = held.iter().find(|h| !engine_lost(&h.error)) {
                let why = h.error.to_string();
                let summary = collector.finish()?;
                return Err(EnvError::EngineLost(format!(
                    "{why}; the batch stopped with {} project(s) held ({}) and {} not started, none of them failed for it; {} ended (summary in {}). Fix the engine, then the same command resumes them",
                    names.len(),
                    names.join(", "),
                    queue.len(),
                    summary.ok + summary.failed + summary.skipped,
                    opts.projects_dir.join(SUMMARY_FILE).display()
                )));
            }
            obs.engine_lost(&held[0].error.to_string(), &names, ENGINE_WAIT);
            let t = Instant::now();
            let back = wait_for_engine(rt, &opts.build.stop).await;
            if opts.build.stop.is_set() {
                // Stopped while waiting: the held projects are not failed;
                // the same command resumes them.
                break;
            }
            if !back {
                let why = held[0].error.to_string();
                let summary = collector.finish()?;
                return Err(EnvError::EngineLost(format!(
                    "{why}; it did not answer for {} s, so the batch stopped with {} project(s) held ({}) and {} not started; {} ended (summary in {}). The same command resumes the held projects from their checkpoints and builds the rest",
                    ENGINE_WAIT.as_secs(),
                    names.len(),
                    names.join(", "),
                    queue.len(),
                    summary.ok + summary.failed + summary.skipped,
                    opts.projects_dir.join(SUMMARY_FILE).display()
                )));
            }
            rt.clear_infra();
            obs.engine_back(t.elapsed());
            for h in held.drain(..) {
                running.push(Box::pin(resume_project(rt, obs, *h)));
            }
            continue;
        };
        match turn {
            Turn::Done(result) => {
                obs.project_finished(&result);
                if collector.record(*result)? {
                    stop = true;
                }
            }
            Turn::EngineLost(h) => held.push(h),
        }
    }
    let summary = collector.finish()?;
    match opts.build.stop.reason() {
        Some(why) => Err(EnvError::Interrupted(format!(
            "{why}: the batch stopped after {} project(s) ended (summary in {}); the same command resumes the rest from their checkpoints",
            summary.ok + summary.failed + summary.skipped,
            opts.projects_dir.join(SUMMARY_FILE).display()
        ))),
        None => Ok(summary),
    }
}

/// Appends whole lines to a text log.
struct LineLog {
    path: PathBuf,
    file: std::fs::File,
}

impl LineLog {
    fn open(path: &Path) -> Result<Self, EnvError> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| EnvError::io("cannot open", path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }
    fn line(&mut self, text: &str) -> Result<(), EnvError> {
        use std::io::Write;
        self.file
            .write_all(format!("{text}\n").as_bytes())
            .map_err(|e| EnvError::io("cannot append to", &self.path, e))
    }
}

async fn run_project(
    rt: &dyn ContainerRuntime,
    opts: &BatchOptions,
    p: ProjectSpec,
    obs: &dyn BatchObserver,
) -> Turn {
    let t0 = Instant::now();
    let (b, result) = match prepare_project(opts, &p, obs).await {
        Ok(ready) => ready,
        Err(done) => return Turn::Done(Box::new(redacted(&p, done))),
    };
    build_turn(
        rt,
        obs,
        Box::new(Held {
            p,
            b,
            result,
            t0,
            error: EnvError::Usage(String::new()),
            tries: 0,
        }),
    )
    .await
}

/// Build a project again, from its checkpoints, after the engine failed
/// under it and answers again. Its containers of the lost attempt go first.
async fn resume_project(rt: &dyn ContainerRuntime, obs: &dyn BatchObserver, h: Held) -> Turn {
    if let Ok(cs) = rt
        .list_containers(&[format!(
            "{}={}",
            belay_sandbox::labels::RUN,
            h.result.run_id
        )])
        .await
    {
        for c in cs {
            let _ = rt.remove(&c.id).await;
        }
    }
    build_turn(rt, obs, Box::new(h)).await
}

/// Build a prepared project: its result, or, when the engine failed under
/// it (a failure of the machine, not the project), the project held for the
/// batch to resume once the engine answers again.
async fn build_turn(rt: &dyn ContainerRuntime, obs: &dyn BatchObserver, mut h: Box<Held>) -> Turn {
    let pobs = ProjectObserver {
        name: &h.p.name,
        inner: obs,
    };
    let mut result = h.result.clone();
    // A build that could not run is a failed project here; its result says why.
    match build_prepared(rt, &h.b, &pobs, &mut result).await {
        Err(e)
            if belay_record::Classify::exit_class(&e) == belay_record::ExitClass::Infra
                && !matches!(e, EnvError::Interrupted(_))
                && h.tries < ENGINE_RETRIES =>
        {
            h.tries += 1;
            h.error = e;
            Turn::EngineLost(h)
        }
        _ => {
            result.duration_s = secs(h.t0);
            Turn::Done(Box::new(redacted(&h.p, result)))
        }
    }
}

/// Whether `e` is the engine lost (no answer, or gone), which waiting can
/// cure, rather than an engine's answer that would be the same again (a
/// refused request, a registry's error).
fn engine_lost(e: &EnvError) -> bool {
    use belay_sandbox::InfraFailure as F;
    matches!(
        e,
        EnvError::Sandbox(belay_sandbox::SandboxError::Infra(
            F::EngineTimeout { .. } | F::DaemonGone { .. }
        ))
    )
}

/// Git's own messages may quote the URL it was given.
fn redacted(p: &ProjectSpec, mut r: ProjectResult) -> ProjectResult {
    let redactor = p.redactor();
    r.error = r.error.map(|e| redactor.redact(&e).into_owned());
    r
}

/// Wait for the engine to answer a ping, with back-off (2 s, doubling, at
/// most 60 s, with jitter), for at most [`ENGINE_WAIT`]; `false` when it did
/// not, or when the batch was stopped.
async fn wait_for_engine(rt: &dyn ContainerRuntime, stop: &belay_record::Stop) -> bool {
    let deadline = Instant::now() + ENGINE_WAIT;
    let mut pause = Duration::from_secs(2);
    loop {
        if stop.is_set() {
            return false;
        }
        tokio::select! {
            up = rt.engine_answers(Duration::from_secs(5)) => {
                if up {
                    return true;
                }
            }
            _ = stop.wait() => return false,
        }
        if Instant::now() >= deadline {
            return false;
        }
        let jitter = Duration::from_millis(fastrand::u64(0..=pause.as_millis() as u64 / 4));
        let nap = (pause + jitter).min(deadline.saturating_duration_since(Instant::now()));
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            _ = stop.wait() => return false,
        }
        pause = (pause * 2).min(Duration::from_secs(60));
    }
}

/// A project's result before it is built, and where its manifest will be.
pub(crate) fn new_result(opts: &BatchOptions, p: &ProjectSpec) -> ProjectResult {
    ProjectResult {
        name: p.name.clone(),
        line: p.line,
        source: p.display_source(),
        reference: p.reference.clone(),
        status: "failed".into(),
        stage: None,
        checkout_dir: opts.projects_dir.join(&p.name),
        run_id: run_id_for(&opts.run_id_prefix, &p.name),
        image_prefix: format!("{}-{}", opts.build.image_prefix, p.name)
            .to_ascii_lowercase()
            .replace('_', "-"),
        duration_s: 0.0,
        repairs: 0,
        cache_hits: 0,
        cache_misses: 0,
        blocks: 0,
        final_image: None,
        manifest: None,
        error: None,
        failure_class: None,
    }
}

/// Check a project out and make its build options. `Err`: the project is
/// finished already (skipped, or its preparation failed), with its result.
pub(crate) async fn prepare_project(
    opts: &BatchOptions,
    p: &ProjectSpec,
    obs: &dyn BatchObserver,
) -> Result<(BuildOptions, ProjectResult), ProjectResult> {
    let t0 = Instant::now();
    let mut result = new_result(opts, p);
    let checkout = result.checkout_dir.clone();
    let state_dir = default_state_dir(opts);
    let manifest_path = state_dir
        .join("runs")
        .join(&result.run_id)
        .join("manifest.json");
    if opts.skip_existing_success {
        // host-owned: a manifest belay wrote in its state dir (never mounted into a build).
        if let Ok(t) = fs_err::read_to_string(&manifest_path) {
            if let Ok(m) = serde_json::from_str::<Manifest>(&t) {
                // Only a success of the same ablation mode counts.
                if m.ok && m.ablation_mode == opts.build.ablation.as_str() {
                    result.status = "skipped".into();
                    result.final_image = m.final_image;
                    result.manifest = Some(manifest_path);
                    return Err(result);
                }
            }
        }
    }
    obs.project_started(&p.name);
    if let Err(e) = prepare(opts, p, &checkout).await {
        result.stage = Some("prepare_failed".into());
        result.error = Some(e.to_string());
        result.duration_s = secs(t0);
        return Err(result);
    }
    let mut b = opts.build.clone();
    b.repo = checkout;
    b.run_id = Some(result.run_id.clone());
    b.image_prefix = result.image_prefix.clone();
    b.state_dir = Some(state_dir);
    b.resume_from = None;
    b.start_at_block = None;
    if let Some(o) = &opts.oracles_dir {
        let f = o.join(format!("{}.oracle.json", p.name));
        if f.is_file() {
            b.oracle_file = Some(f);
        }
    }
    for (name, value) in p.redactor().secrets() {
        b.redactor.add(name.clone(), value.clone());
    }
    Ok((b, result))
}

/// Build a prepared project and fill its result from the manifest. `Err`:
/// the build could not run to its end (the result says so too), so that a
/// caller can tell an engine's failure from the project's.
pub(crate) async fn build_prepared(
    rt: &dyn ContainerRuntime,
    b: &BuildOptions,
    obs: &dyn BuildObserver,
    result: &mut ProjectResult,
) -> Result<(), EnvError> {
    let manifest_path = b
        .state_dir
        .clone()
        .unwrap_or_default()
        .join("runs")
        .join(&result.run_id)
        .join("manifest.json");
    match build(rt, b, obs).await {
        Ok(out) => {
            let m = out.manifest;
            result.status = if m.ok { "ok" } else { "failed" }.into();
            if !m.ok {
                result.stage = Some("build_failed".into());
            }
            result.repairs = m.repairs;
            result.cache_hits = m.cache.hits;
            result.cache_misses = m.cache.misses;
            result.blocks = m.blocks.len();
            result.final_image = m.final_image.clone();
            result.error = m.error.clone();
            result.failure_class = m.failure_class.clone();
            result.manifest = Some(m.manifest_path.clone());
        }
        Err(e) => {
            result.stage = Some(if matches!(e, EnvError::Interrupted(_)) {
                "interrupted".into()
            } else {
                "build_failed".into()
            });
            result.error = Some(e.to_string());
            if manifest_path.is_file() {
                result.manifest = Some(manifest_path);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// `<prefix>-<name>`, unique per project: names are unique, and an id too
/// long for a run id keeps a hash of the whole instead of being cut short.
pub fn run_id_for(prefix: &str, name: &str) -> String {
    let full = format!("{}-{name}", belay_record::run_id::sanitize(prefix));
    if full.len() <= belay_record::run_id::MAX_LEN {
        return full;
    }
    use sha2::Digest;
    let h = hex::encode(sha2::Sha256::digest(full.as_bytes()));
    let head = full[..belay_record::run_id::MAX_LEN - 9].trim_end_matches(['-', '_', '.']);
    format!("{head}-{}", &h[..8])
}

/// Runs' state defaults to a hidden directory of the projects dir, which no
/// project name can collide with (names never start with '.').
pub(crate) fn default_state_dir(opts: &BatchOptions) -> PathBuf {
    opts.state_dir
        .clone()
        .unwrap_or_else(|| opts.projects_dir.join(".belay-state"))
}

/// Marks a checkout belay made, so that only those are ever replaced.
fn marker(projects_dir: &Path, name: &str) -> PathBuf {
    projects_dir.join(".belay-checkouts").join(name)
}

/// Why a project of a batch could not be checked out.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckoutError {
    #[error("{} exists and was not checked out by belay; move it away or pick another --projects-dir", path.display())]
    NotOurs { path: PathBuf },
    #[error("the checkout dir {} overlaps the project itself ({}); pick a --projects-dir outside it", checkout.display(), project.display())]
    Overlaps { checkout: PathBuf, project: PathBuf },
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("copying {} to {} failed ({status})", from.display(), to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        status: std::process::ExitStatus,
    },
    #[error(transparent)]
    Git(#[from] belay_vcs::VcsError),
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CheckoutError {
    let path = path.to_path_buf();
    move |source| CheckoutError::Io { op, path, source }
}

/// Remove `dir` only if belay made it (its marker exists); refuse otherwise.
fn clear_checkout(projects_dir: &Path, name: &str, dir: &Path) -> Result<(), CheckoutError> {
    if !dir.exists() {
        return Ok(());
    }
    if !marker(projects_dir, name).exists() {
        return Err(CheckoutError::NotOurs {
            path: dir.to_path_buf(),
        });
    }
    std::fs::remove_dir_all(dir).map_err(io_err("clear", dir))
}

fn secs(t0: Instant) -> f64 {
    (t0.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
}

/// Check the project out under `dir`; quarantine `.github`.
async fn prepare(opts: &BatchOptions, p: &ProjectSpec, dir: &Path) -> Result<(), CheckoutError> {
    let pd = &opts.projects_dir;
    // Never copy a project onto itself or into itself, nor replace it.
    if let Source::Local(src) = &p.source {
        let s = src.canonicalize().map_err(io_err("resolve", src))?;
        let d = pd
            .canonicalize()
            .unwrap_or_else(|_| pd.clone())
            .join(&p.name);
        if s == d || d.starts_with(&s) || s.starts_with(&d) {
            return Err(CheckoutError::Overlaps {
                checkout: d,
                project: s,
            });
        }
    }
    clear_checkout(pd, &p.name, dir)?;
    let mark = marker(pd, &p.name);
    if let Some(parent) = mark.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    std::fs::write(&mark, p.display_source()).map_err(io_err("write", &mark))?;
    match &p.source {
        Source::Local(src) if p.reference.is_some() => {
            // A ref of a local repository: clone it (a copied .git would bring
            // its config, whose filters and fsmonitor could run programs).
            let url = format!(
                "file://{}",
                src.canonicalize().unwrap_or_else(|_| src.clone()).display()
            );
            checkout_git(dir, &url, p.reference.as_deref(), opts.git_timeout).await?;
        }
        Source::Local(src) => {
            let status = tokio::process::Command::new("cp")
                .arg("-a")
                .arg(src)
                .arg(dir)
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .stdin(std::process::Stdio::null())
                .status()
                .await
                .map_err(io_err("copy", src))?;
            if !status.success() {
                return Err(CheckoutError::Copy {
                    from: src.clone(),
                    to: dir.to_path_buf(),
                    status,
                });
            }
        }
        Source::Slug(slug) => {
            let base = opts.git_base_url.clone().unwrap_or_default();
            let url = format!("{}/{slug}.git", base.trim_end_matches('/'));
            checkout_git(dir, &url, p.reference.as_deref(), opts.git_timeout).await?;
        }
        Source::GitUrl(url) => {
            checkout_git(dir, url, p.reference.as_deref(), opts.git_timeout).await?
        }
    }
    quarantine_github(opts, p, dir)
}

/// The project's `.github` (its CI, an oracle's source) moved aside into
/// the oracles directory, so that the build never reads it.
fn quarantine_github(
    opts: &BatchOptions,
    p: &ProjectSpec,
    dir: &Path,
) -> Result<(), CheckoutError> {
    let github = dir.join(".github");
    let Some(o) = opts.oracles_dir.as_ref().filter(|_| github.exists()) else {
        return Ok(());
    };
    let target = o.join(&p.name).join(".github");
    if target.exists() {
        std::fs::remove_dir_all(&target).map_err(io_err("clear", &target))?;
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    std::fs::rename(&github, &target).map_err(io_err("quarantine", &github))
}

/// Check out `url` at `reference` into `dir`, through the hardened git of
/// belay-vcs (hooks off, a deadline, its own process group). Credentials in
/// the URL serve the fetch only: afterwards (and after a failure) the
/// checkout's remote is the URL without them, so no file of the batch keeps
/// them.
async fn checkout_git(
    dir: &Path,
    url: &str,
    reference: Option<&str>,
    timeout: Duration,
) -> Result<(), CheckoutError> {
    let hooks = dir.with_file_name(".belay-no-hooks");
    let proxy: Vec<(String, String)> = belay_sandbox::trust::PROXY_VARS
        .iter()
        .chain(["GIT_SSL_CAINFO", "SSL_CERT_FILE"].iter())
        .filter_map(|v| std::env::var(v).ok().map(|val| (v.to_string(), val)))
        .collect();
    belay_vcs::Git::checkout_remote(dir, &hooks, url, reference, timeout, proxy).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_line_form() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("local")).unwrap();
        let f = dir.path().join("projects.txt");
        let text = "# benchmark list\n\nowner/repo a1b2c3\nhttps://git.example.invalid/x/tool.git v1.2\n./local\n  owner/other   # trailing comment\n";
        let p = parse_projects(text, &f).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p[0].source, Source::Slug("owner/repo".into()));
        assert_eq!(p[0].reference.as_deref(), Some("a1b2c3"));
        assert_eq!(p[0].line, 3);
        assert_eq!(p[0].name, "owner__repo");
        assert_eq!(p[1].name, "tool");
        assert!(matches!(p[2].source, Source::Local(_)));
        assert_eq!(p[3].reference, None);
    }

    #[test]
    fn errors_name_the_line() {
        let f = Path::new("/tmp/projects.txt");
        for (text, line) in [
            ("owner/repo abc\nnot a valid line here\n", 2),
            ("a/b/c main\n", 1),
            ("ok/one x\nok/one y\n", 2),
            ("\n\n./does-not-exist-anywhere\n", 3),
            ("owner/repo --upload-pack=evil\n", 1),
            ("--upload-pack=evil://x main\n", 1),
        ] {
            let e = parse_projects(text, f).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("/tmp/projects.txt:{line}:")),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn run_ids_stay_unique_and_valid() {
        let a = run_id_for(
            "batch",
            "googlecloudplatform__python-storage-with-a-long-name",
        );
        let b = run_id_for(
            "batch",
            "googlecloudplatform__python-pubsub-with-a-long-name",
        );
        assert_ne!(a, b);
        for id in [&a, &b] {
            belay_record::run_id::validate(id).unwrap();
        }
        assert_eq!(run_id_for("batch", "six-1.16.0"), "batch-six-1.16.0");
    }

    /// Docker's grammar for a repository path component, which the image
    /// prefix `belay-<name>` is (its `_` written `-`).
    fn docker_component(name: &str) -> bool {
        regex::Regex::new(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
            .unwrap()
            .is_match(name)
    }

    #[test]
    fn a_project_name_makes_an_image_name_the_engine_takes() {
        for (raw, name) in [
            // A Debian source's version: `+` and `~` in it, and a cut at 40
            // that ended in `.` ("invalid reference format" from the engine).
            (
                "node-webassemblyjs-1.11.4+dfsg+~cs10.11.17-2",
                "node-webassemblyjs-1.11.4_dfsg__cs10.11",
            ),
            (
                "node-webassemblyjs-1.11.4-dfsg--cs10.11.17-2",
                "node-webassemblyjs-1.11.4-dfsg--cs10.11",
            ),
            ("node-chance-2.2.6+dfsg-6", "node-chance-2.2.6_dfsg-6"),
            ("pkg_1.2.-x", "pkg_1.2-x"),
            ("a..b", "a-b"),
            ("owner__repo", "owner__repo"),
            ("six-1.16.0", "six-1.16.0"),
            ("..", "project"),
        ] {
            let n = project_name(raw);
            assert_eq!(n, name, "{raw}");
            assert!(
                docker_component(&format!("belay-{}", n.replace('_', "-"))),
                "{n}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(text in "(.{0,40}\n){0,6}") {
            let _ = parse_projects(&text, Path::new("/tmp/p.txt"));
        }

        #[test]
        fn every_project_name_is_a_docker_name(raw in ".{0,80}") {
            let n = project_name(&raw);
            proptest::prop_assert!(n.len() <= 40);
            proptest::prop_assert!(docker_component(&format!("belay-{}", n.replace('_', "-"))), "{:?} -> {:?}", raw, n);
            proptest::prop_assert!(belay_record::run_id::validate(&run_id_for("batch", &n)).is_ok());
        }
    }
}
