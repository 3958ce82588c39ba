//! `belay env build-projects --executor swarm`: the batch as a Docker Swarm
//! `replicated-job`, one completion per project, `--jobs` at a time, each task
//! `belay env worker` from the worker image (`belay image worker`).
//!
//! The submitting command prepares the checkouts as a local batch does, writes
//! the work ([`spec`]) to a directory of the projects dir, creates the job,
//! and reports each project as its result lands, with the same summary,
//! `failed-projects.log` and exit code as a local batch. Tasks share
//! checkpoints and the cache through `--registry`. The projects dir, the
//! state dir and the machine's caches are bind-mounted into every task at
//! their own paths, so this runs on a single-node swarm, or on nodes that
//! share those paths (NFS); results carried by the registry instead are in
//! docs/distributed.md and not built.
//!
//! The same submitter serves a cluster that runs the batch as an indexed job
//! ([`cluster`]: `--executor kubernetes`, from the belay-kube crate).

pub mod cluster;
pub mod image;
pub mod spec;
pub mod worker;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use belay_sandbox::swarm::{JobSpec, TaskView};
use belay_sandbox::ContainerRuntime;

use crate::batch::{
    bad, default_state_dir, prepare_project, select_projects, BatchObserver, BatchOptions,
    BatchSummary, Collector, ProjectSpec,
};
use crate::EnvError;
pub use cluster::{IndexedBatch, IndexedJobExecutor, IndexedJobRun};
use spec::{PortableOptions, WorkDir, WorkItem, WorkSpec};

/// The label of a batch's task containers.
pub const BATCH_LABEL: &str = "belay.batch";
/// How long the job may show no live task, with projects unreported,
/// before those projects count as failed.
const DEAD_JOB_GRACE: Duration = Duration::from_secs(15);

/// The worker image for this belay binary in `registry`: its version and a
/// hash of the binary, so that tasks run exactly the belay that submitted.
pub fn default_worker_image(registry: &str) -> Result<String, EnvError> {
    Ok(format!("{registry}/belay-worker:{}", worker_tag()?))
}

/// `<version>-<first 12 hex of the binary's sha256>`.
pub fn worker_tag() -> Result<String, EnvError> {
    use sha2::Digest;
    let exe =
        std::env::current_exe().map_err(|e| EnvError::io("cannot find", "the belay binary", e))?;
    let mut h = sha2::Sha256::new();
    crate::cache::hash_file(&mut h, &exe, &mut vec![0u8; 1 << 20])?;
    Ok(format!(
        "{}-{}",
        env!("CARGO_PKG_VERSION"),
        &hex::encode(h.finalize())[..12]
    ))
}

fn absolute(p: &Path) -> Result<PathBuf, EnvError> {
    fs_err::create_dir_all(p).map_err(|e| EnvError::io("cannot create", p, e))?;
    fs_err::canonicalize(p).map_err(|e| EnvError::io("cannot resolve", p, e))
}

/// A bind mount: host path, path in the task, read-only.
type Bind = (PathBuf, String, bool);
/// A task's binds and environment variables.
type TaskEnv = (Vec<Bind>, Vec<(String, String)>);

/// The task containers' binds and environment: the engine, the batch's
/// directories and the machine's caches, each at its own path.
fn task_mounts(
    opts: &BatchOptions,
    projects_dir: &Path,
    state_dir: &Path,
) -> Result<TaskEnv, EnvError> {
    let sock = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"));
    let mut binds = vec![(sock, "/var/run/docker.sock".to_string(), false)];
    let mut env = vec![];
    let bind_dir = |p: &Path, ro: bool, binds: &mut Vec<Bind>| {
        if !binds.iter().any(|(h, _, _)| p.starts_with(h)) {
            binds.push((p.to_path_buf(), p.display().to_string(), ro));
        }
    };
    bind_dir(projects_dir, false, &mut binds);
    bind_dir(state_dir, false, &mut binds);
    let cache = absolute(&crate::rundir::machine_cache_dir(state_dir))?;
    bind_dir(&cache, false, &mut binds);
    env.push(("BELAY_CACHE_DIR".to_string(), cache.display().to_string()));
    let home = absolute(&belay_record::state_home())?;
    bind_dir(&home, false, &mut binds);
    env.push(("BELAY_STATE_HOME".to_string(), home.display().to_string()));
    if let Some(o) = &opts.oracles_dir {
        bind_dir(&absolute(o)?, true, &mut binds);
    }
    // The registry's `docker login` credentials, for the tasks' pushes and
    // pulls (read-only; the tasks are root on the engine anyway).
    if let Some(reg) = &opts.build.registry {
        let host = reg.split('/').next().unwrap_or(reg);
        if belay_sandbox::registry::credentials_for(host).is_some() {
            let cfg = std::env::var_os("DOCKER_CONFIG")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))
                .map(|d| d.join("config.json"));
            if let Some(cfg) = cfg {
                binds.push((cfg, "/run/belay-docker-config/config.json".into(), true));
                env.push(("DOCKER_CONFIG".into(), "/run/belay-docker-config".into()));
            }
        }
    }
    if opts.build.host_trust {
        let trust = belay_sandbox::trust::HostTrust::detect();
        if let Some(ca) = trust
            .ca_source
            .as_ref()
            .and_then(|c| fs_err::canonicalize(c).ok())
        {
            binds.push((ca.clone(), ca.display().to_string(), true));
            env.push(("SSL_CERT_FILE".to_string(), ca.display().to_string()));
        }
        env.extend(trust.proxy_env.iter().cloned());
    }
    Ok((binds, env))
}

/// Forwards everything but `project_started`.
struct Unstarted<'a>(&'a dyn BatchObserver);

impl BatchObserver for Unstarted<'_> {
    fn project_started(&self, _name: &str) {}
    fn project_event(&self, name: &str, event: &crate::progress::BuildEvent) {
        self.0.project_event(name, event);
    }
    fn project_finished(&self, result: &crate::batch::ProjectResult) {
        self.0.project_finished(result);
    }
}

fn task_errors(tasks: &[TaskView]) -> String {
    let errs: Vec<String> = tasks
        .iter()
        .filter(|t| t.state == "failed" || t.state == "rejected")
        .map(|t| {
            format!(
                "task {} {}{}",
                t.id.get(..12).unwrap_or(&t.id),
                t.exit_code
                    .map(|c| format!("exited {c}"))
                    .unwrap_or_else(|| t.state.clone()),
                t.error
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if errs.is_empty() {
        "no task finished it".into()
    } else {
        errs.join("; ")
    }
}

/// The cluster a distributed batch runs on.
pub enum Cluster {
    Swarm,
    /// An indexed job on a cluster another crate drives (Kubernetes).
    Indexed(std::sync::Arc<dyn IndexedJobExecutor>),
}

impl Cluster {
    fn flag(&self) -> &'static str {
        match self {
            Cluster::Swarm => "--executor swarm",
            Cluster::Indexed(x) => x.flag(),
        }
    }
}

/// The submitted job, as the watch loop sees it.
enum Running {
    Swarm {
        jobs: std::sync::Arc<dyn belay_sandbox::swarm::SwarmJobs>,
        service: String,
    },
    Indexed(Box<dyn IndexedJobRun>),
}

/// Run the batch as a swarm job or a Kubernetes Indexed Job. `stop` is set
/// on Ctrl-C: the job is removed (its tasks stopped) and the batch ends as
/// interrupted.
pub async fn build_projects(
    rt: &dyn ContainerRuntime,
    opts: &BatchOptions,
    worker_image: &str,
    obs: &dyn BatchObserver,
    mut stop: tokio::sync::watch::Receiver<Option<String>>,
    cluster: Cluster,
) -> Result<BatchSummary, EnvError> {
    let flag = cluster.flag();
    let swarm = swarm_jobs(rt, &cluster).await?;
    let registry = distributed_registry(opts, flag)?;
    let pinned = pinned_worker_image(rt, worker_image, &registry).await?;
    let selected = select_projects(opts)?;
    if let Some(p) = selected.iter().find(|p| p.has_url_credentials()) {
        return Err(bad(
            &opts.projects_file,
            p.line,
            format!("{flag}: this project's URL carries credentials, which would have to reach every task; give the machines a credential helper or an SSH key instead, or use --executor local"),
        ));
    }
    let opts_abs = absolute_options(opts)?;
    let opts = &opts_abs;
    let projects_dir = opts.projects_dir.clone();
    let state_dir = absolute(&default_state_dir(opts))?;
    let mut collector = Collector::open(opts)?;

    // Checkouts here, as a local batch makes them; the builds in the tasks.
    // A project is reported started when a task claims it.
    let items = prepare_items(opts, &selected, obs, &mut collector).await?;
    if items.is_empty() {
        return collector.finish();
    }
    let batch = format!(
        "{}-{}",
        belay_record::run_id::sanitize(&opts.run_id_prefix),
        belay_record::unix_millis()
    );
    let work = WorkDir::new(projects_dir.join(".belay-swarm").join(&batch));
    work.create(&WorkSpec {
        batch: batch.clone(),
        items: items.clone(),
    })?;
    let submission = Submission {
        name: job_name(&batch),
        image: pinned,
        batch: &batch,
        work: &work,
        projects_dir: &projects_dir,
        state_dir: &state_dir,
        completions: items.len(),
    };
    let mut running = submit_job(cluster, swarm, opts, submission).await?;
    let watched = watch_job(&mut running, &work, &items, obs, &mut collector, &mut stop).await;
    let removed = end_job(rt, &running, watched.is_err(), &items).await;
    watched?;
    removed?;
    collector.finish()
}

/// The engine's swarm jobs API when the cluster is a swarm (`None` for an
/// indexed job), or why this engine cannot run the batch.
async fn swarm_jobs(
    rt: &dyn ContainerRuntime,
    cluster: &Cluster,
) -> Result<Option<std::sync::Arc<dyn belay_sandbox::swarm::SwarmJobs>>, EnvError> {
    match cluster {
        Cluster::Swarm => {
            let jobs = rt.swarm_jobs().ok_or_else(|| {
                EnvError::Usage("--executor swarm needs the Docker Engine API".into())
            })?;
            if !jobs.swarm_active().await? {
                return Err(EnvError::Usage(
                    "--executor swarm: this engine is not a swarm manager. Run `docker swarm init` (a single-node swarm is enough), or use --executor local".into(),
                ));
            }
            Ok(Some(jobs))
        }
        Cluster::Indexed(_) => Ok(None),
    }
}

/// The registry the tasks share, or why `opts` cannot run as a distributed
/// batch (`flag` names the executor in the messages).
fn distributed_registry(opts: &BatchOptions, flag: &str) -> Result<String, EnvError> {
    let Some(registry) = opts.build.registry.clone() else {
        return Err(EnvError::Usage(format!(
            "{flag} needs --registry: the tasks share checkpoints and the cache through it"
        )));
    };
    if opts.build.llm.is_some() {
        return Err(EnvError::Usage(format!(
            "{flag} plans with the rules only (a model key would have to reach every task); pass --planner rules"
        )));
    }
    if opts.stop_on_failure {
        return Err(EnvError::Usage(format!(
            "--stop-on-failure is not supported with {flag}: the job's tasks run independently"
        )));
    }
    Ok(registry)
}

/// The worker image pinned by its digest in the registry (`image@digest`).
async fn pinned_worker_image(
    rt: &dyn ContainerRuntime,
    worker_image: &str,
    registry: &str,
) -> Result<String, EnvError> {
    let images = rt
        .image_registry()
        .ok_or_else(|| EnvError::Usage("--registry needs the Docker Engine API".into()))?;
    // The tasks run the image by digest, so that a tag moved in the
    // registry cannot change what runs.
    let Some(digest) = images.remote_digest(worker_image).await? else {
        return Err(EnvError::Usage(format!(
            "the worker image {worker_image} is not in the registry: run `belay image worker --registry {registry}` with this belay"
        )));
    };
    Ok(format!("{worker_image}@{digest}"))
}

/// `opts` with its projects, state and oracles directories absolute (and created).
fn absolute_options(opts: &BatchOptions) -> Result<BatchOptions, EnvError> {
    let projects_dir = absolute(&opts.projects_dir)?;
    let mut opts_abs = opts.clone();
    opts_abs.projects_dir = projects_dir;
    if let Some(s) = &opts.state_dir {
        opts_abs.state_dir = Some(absolute(s)?);
    }
    if let Some(o) = &opts.oracles_dir {
        opts_abs.oracles_dir = Some(absolute(o)?);
    }
    Ok(opts_abs)
}

/// Make the `selected` projects' checkouts: a work item for each ready one;
/// those that failed are reported and recorded in `collector`.
async fn prepare_items(
    opts: &BatchOptions,
    selected: &[ProjectSpec],
    obs: &dyn BatchObserver,
    collector: &mut Collector<'_>,
) -> Result<Vec<WorkItem>, EnvError> {
    let mut items: Vec<WorkItem> = Vec::new();
    for p in selected {
        match prepare_project(opts, p, &Unstarted(obs)).await {
            Err(done) => {
                obs.project_finished(&done);
                collector.record(done)?;
            }
            Ok((b, result)) => items.push(WorkItem {
                index: items.len(),
                result,
                options: PortableOptions::from_build(&b)?,
            }),
        }
    }
    Ok(items)
}

/// The job's name: `belay-<batch>` as a DNS label (at most 63 characters).
fn job_name(batch: &str) -> String {
    let name: String = format!("belay-{batch}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    name.trim_end_matches('-').to_string()
}

/// What the batch's job is made of.
struct Submission<'a> {
    name: String,
    /// The worker image, pinned by digest.
    image: String,
    batch: &'a str,
    work: &'a WorkDir,
    projects_dir: &'a Path,
    state_dir: &'a Path,
    /// How many work items the job completes.
    completions: usize,
}

/// Create the batch's job on `cluster` (through `swarm`, a swarm's jobs API).
async fn submit_job(
    cluster: Cluster,
    swarm: Option<std::sync::Arc<dyn belay_sandbox::swarm::SwarmJobs>>,
    opts: &BatchOptions,
    s: Submission<'_>,
) -> Result<Running, EnvError> {
    Ok(match (cluster, swarm) {
        (Cluster::Swarm, Some(jobs)) => {
            let (binds, env) = task_mounts(opts, s.projects_dir, s.state_dir)?;
            let spec = JobSpec {
                name: s.name,
                image: s.image,
                args: vec![
                    "env".into(),
                    "worker".into(),
                    "--spec".into(),
                    s.work.spec().display().to_string(),
                ],
                env,
                binds,
                labels: batch_labels(s.batch),
                completions: s.completions as u64,
                max_concurrent: opts.jobs.max(1) as u64,
                max_attempts: 3,
            };
            let service = jobs.create_job(&spec).await?;
            Running::Swarm { jobs, service }
        }
        (Cluster::Indexed(k), _) => Running::Indexed(
            k.submit(IndexedBatch {
                name: &s.name,
                image: &s.image,
                spec_path: &s.work.spec(),
                projects_dir: s.projects_dir,
                state_dir: s.state_dir,
                labels: batch_labels(s.batch),
                batch: s.batch,
                completions: s.completions,
                parallelism: opts.jobs.max(1),
            })
            .await?,
        ),
        (Cluster::Swarm, None) => {
            return Err(EnvError::Usage(
                "--executor swarm needs the Docker Engine API".into(),
            ))
        }
    })
}

/// Remove the watched job (`failed`: the watch failed) and, for a failed
/// swarm job, the build containers its tasks started: the removal's outcome.
async fn end_job(
    rt: &dyn ContainerRuntime,
    running: &Running,
    failed: bool,
    items: &[WorkItem],
) -> Result<(), EnvError> {
    let removed = match running {
        Running::Swarm { jobs, service } => jobs.remove_job(service).await.map_err(EnvError::from),
        // A finished Job stays for its TTL (its pods' logs with it); one
        // that did not finish is deleted, and its pods with it.
        Running::Indexed(k) if failed => k.cancel().await,
        Running::Indexed(_) => Ok(()),
    };
    if failed && matches!(running, Running::Swarm { .. }) {
        // Removing the job stops its tasks, not the build containers they
        // started: those are removed here.
        for it in items {
            let run = format!("{}={}", belay_sandbox::labels::RUN, it.result.run_id);
            if let Ok(cs) = rt.list_containers(&[run]).await {
                for c in cs {
                    let _ = rt.remove(&c.id).await;
                }
            }
        }
    }
    removed
}

fn batch_labels(batch: &str) -> std::collections::BTreeMap<String, String> {
    [
        (belay_sandbox::labels::BELAY.to_string(), "true".to_string()),
        (BATCH_LABEL.to_string(), batch.to_string()),
        (
            belay_sandbox::labels::KIND.to_string(),
            "worker".to_string(),
        ),
    ]
    .into_iter()
    .collect()
}

async fn watch_job(
    running: &mut Running,
    work: &WorkDir,
    items: &[WorkItem],
    obs: &dyn BatchObserver,
    collector: &mut Collector<'_>,
    stop: &mut tokio::sync::watch::Receiver<Option<String>>,
) -> Result<(), EnvError> {
    let mut started = vec![false; items.len()];
    let mut reported = vec![false; items.len()];
    let mut last_alive = Instant::now();
    let mut api_errors = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            changed = stop.changed() => {
                if changed.is_ok() {
                    let why = stop.borrow().clone().unwrap_or_default();
                    return Err(EnvError::Interrupted(format!("{why}: the job was removed; rerun the same command to resume its projects")));
                }
            }
        }
        for it in items {
            if !started[it.index] && work.has_claim(it.index) {
                started[it.index] = true;
                obs.project_started(&it.result.name);
            }
            if !reported[it.index] {
                if let Some(r) = work.read_result(it.index) {
                    reported[it.index] = true;
                    obs.project_finished(&r);
                    collector.record(r)?;
                }
            }
        }
        if reported.iter().all(|r| *r) {
            return Ok(());
        }
        let (jobs, service) = match running {
            Running::Swarm { jobs, service } => (jobs, service),
            Running::Indexed(k) => {
                // Results are written before a pod exits, so once the Job
                // has ended, one more look finds every result there is.
                if let Some(why) = k.ended().await? {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    for it in items.iter().filter(|it| !reported[it.index]) {
                        if let Some(r) = work.read_result(it.index) {
                            obs.project_finished(&r);
                            collector.record(r)?;
                            continue;
                        }
                        let mut r = it.result.clone();
                        r.stage = Some("build_failed".into());
                        r.error = Some(format!(
                            "its Kubernetes index did not finish it: {}",
                            why.get(&it.index)
                                .map(String::as_str)
                                .unwrap_or("the Job ended")
                        ));
                        obs.project_finished(&r);
                        collector.record(r)?;
                    }
                    return Ok(());
                }
                continue;
            }
        };
        // A transient API error is retried; a run of them ends the batch.
        let tasks = match jobs.job_tasks(service).await {
            Ok(t) => {
                api_errors = 0;
                t
            }
            Err(e) if api_errors < 10 => {
                api_errors += 1;
                tracing::warn!("cannot list the job's tasks ({api_errors}/10): {e}");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // No task at all for the grace period (the service was removed from
        // outside) counts as a dead job too.
        if tasks.iter().any(|t| !t.is_done()) {
            last_alive = Instant::now();
        } else if last_alive.elapsed() > DEAD_JOB_GRACE {
            let why = task_errors(&tasks);
            for it in items.iter().filter(|it| !reported[it.index]) {
                let mut r = it.result.clone();
                r.stage = Some("build_failed".into());
                r.error = Some(format!("its swarm task did not finish it: {why}"));
                obs.project_finished(&r);
                collector.record(r)?;
            }
            return Ok(());
        }
    }
}
