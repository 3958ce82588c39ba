//! `belay env build-projects`: many projects, `--jobs` at a time, then a
//! summary table.

use std::time::Duration;

use belay_env::batch::BatchOptions;

use crate::cli::{BuildProjectsArgs, Executor, K8sEngine, WorkerArgs};
use crate::commands::env::build_options;
use crate::context::connect;
use crate::exit::{usage, Failure, EXIT_FAILED};
use crate::output::batch::BatchView;
use crate::output::Printer;

pub async fn build_projects(p: &Printer, a: BuildProjectsArgs) -> Result<u8, Failure> {
    if !a.projects_file.is_file() {
        return Err(usage(format!(
            "projects file {} does not exist. Pass --projects-file with one project per line",
            a.projects_file.display()
        )));
    }
    let rt = connect().await?;
    let b = build_options(std::path::Path::new("."), &a.common)?;
    let opts = BatchOptions {
        projects_file: a.projects_file.clone(),
        projects_dir: a.projects_dir.clone(),
        oracles_dir: a.oracles_dir.clone(),
        git_base_url: a.git_base_url.clone(),
        jobs: a.jobs as usize,
        limit: a.limit,
        start: a.start,
        only: a.only.clone(),
        stop_on_failure: a.stop_on_failure,
        skip_existing_success: a.skip_existing_success,
        run_id_prefix: a.run_id_prefix.clone(),
        state_dir: a.state_dir.clone(),
        build: b,
        git_timeout: Duration::from_secs(600),
    };
    let view = BatchView::new(p);
    let summary = match a.executor {
        Executor::Local => belay_env::batch::build_projects(&rt, &opts, &view).await?,
        Executor::Swarm | Executor::Kubernetes => {
            let flag = if a.executor == Executor::Swarm {
                "--executor swarm"
            } else {
                "--executor kubernetes"
            };
            let image = match (&a.worker_image, &opts.build.registry) {
                (Some(i), _) => i.clone(),
                (None, Some(reg)) => belay_env::swarm::default_worker_image(reg)?,
                (None, None) => {
                    return Err(usage(format!(
                    "{flag} needs --registry: the tasks share checkpoints and the cache through it"
                )))
                }
            };
            let cluster = if a.executor == Executor::Swarm {
                belay_env::swarm::Cluster::Swarm
            } else {
                let Some(work_claim) = a.k8s_work_claim.clone() else {
                    return Err(usage(
                        "--executor kubernetes needs --k8s-work-claim: a ReadWriteMany PersistentVolumeClaim that holds the projects dir, which this machine sees at the same path",
                    ));
                };
                belay_env::swarm::Cluster::Indexed(std::sync::Arc::new(belay_kube::KubeOptions {
                    namespace: a.k8s_namespace.clone(),
                    engine: match a.k8s_engine {
                        K8sEngine::Dind => belay_kube::PodEngine::Dind {
                            image: a.k8s_dind_image.clone(),
                        },
                        K8sEngine::NodeSocket => belay_kube::PodEngine::NodeSocket {
                            path: "/var/run/docker.sock".into(),
                        },
                    },
                    work_claim,
                    pull_secret: a.k8s_pull_secret.clone(),
                    service_account: None,
                    retries: a.k8s_retries,
                }))
            };
            let stop = opts.build.stop.subscribe();
            belay_env::swarm::build_projects(&rt, &opts, &image, &view, stop, cluster).await?
        }
    };
    p.out(format!(
        "{:<32} {:<8} {:>8} {:>7} {:>6}  detail",
        "project", "status", "time", "repairs", "cached"
    ));
    for r in &summary.projects {
        let detail = match r.status.as_str() {
            "ok" | "skipped" => r.final_image.clone().unwrap_or_default(),
            _ => format!(
                "{}: {}",
                r.stage.as_deref().unwrap_or(""),
                r.error
                    .as_deref()
                    .unwrap_or("")
                    .chars()
                    .take(100)
                    .collect::<String>()
            ),
        };
        p.out(format!(
            "{:<32} {:<8} {:>7.1}s {:>7} {:>6}  {}",
            r.name, r.status, r.duration_s, r.repairs, r.cache_hits, detail
        ));
    }
    p.out(format!(
        "{} ok, {} failed, {} skipped of {} in {:.1}s; summary: {}",
        summary.ok,
        summary.failed,
        summary.skipped,
        summary.total,
        summary.duration_s,
        a.projects_dir
            .join(belay_env::batch::SUMMARY_FILE)
            .display()
    ));
    Ok(if summary.failed == 0 { 0 } else { EXIT_FAILED })
}

/// `belay env worker`: one task of a swarm batch. Exit 0 when the project
/// has a result (built or failed), 3 when the engine or the registry stopped
/// the build (the orchestrator then runs the task again, which resumes it).
pub async fn worker(p: &Printer, a: WorkerArgs) -> Result<u8, Failure> {
    let rt = connect().await?;
    let mut code = 0;
    // The task's log: its claims and its build, as `env build` prints them.
    let view = crate::output::build::BuildView::new(p, false);
    match belay_env::swarm::worker::work(&rt, &a.spec, a.index, &view).await? {
        belay_env::swarm::worker::Worked::Built {
            index,
            took_over,
            ok,
        } => {
            // One index per project (Kubernetes): a failed build fails the
            // index, and the pod failure policy stops retrying it.
            if a.index.is_some() && !ok {
                code = EXIT_FAILED;
            }
            p.out(format!(
                "item {index}: {}{}",
                if ok { "built" } else { "failed" },
                if took_over {
                    " (taken over from a task that was gone)"
                } else {
                    ""
                }
            ))
        }
        belay_env::swarm::worker::Worked::NothingLeft => p.out("nothing left to claim"),
    }
    Ok(code)
}
