//! `belay env build-projects`: glue and the live view (a line per running
//! project on a terminal, plain lines otherwise), then a summary table.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use belay_env::batch::{BatchObserver, BatchOptions, ProjectResult};
use belay_env::progress::BuildEvent;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::BuildProjectsArgs;
use crate::commands::{build_options, connect, usage};
use crate::{Failure, EXIT_FAILED};

struct LiveView {
    mp: Option<MultiProgress>,
    bars: Mutex<HashMap<String, ProgressBar>>,
}

impl LiveView {
    fn new() -> Self {
        Self {
            mp: std::io::stderr()
                .is_terminal()
                .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8))),
            bars: Mutex::new(HashMap::new()),
        }
    }

    fn line(&self, text: &str) {
        match &self.mp {
            Some(mp) => {
                let _ = mp.println(text);
            }
            None => eprintln!("[belay] {text}"),
        }
    }
}

impl BatchObserver for LiveView {
    fn project_started(&self, name: &str) {
        match &self.mp {
            Some(mp) => {
                let pb = mp.add(ProgressBar::new_spinner());
                pb.set_style(
                    ProgressStyle::with_template("{spinner} {prefix:<30} {elapsed:>5} {wide_msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                pb.set_prefix(name.to_string());
                pb.set_message("preparing");
                pb.enable_steady_tick(Duration::from_millis(150));
                if let Ok(mut b) = self.bars.lock() {
                    b.insert(name.to_string(), pb);
                }
            }
            None => self.line(&format!("{name}: started")),
        }
    }

    fn project_event(&self, name: &str, event: &BuildEvent) {
        let msg = match event {
            BuildEvent::BlockStarted {
                id, index, total, ..
            } => format!("[{}/{}] {id}", index + 1, total),
            BuildEvent::BlockFinished {
                id,
                ok: false,
                detail,
                ..
            } => format!("{id} failed: {detail}"),
            BuildEvent::BlockFinished {
                id, cached: true, ..
            } => format!("{id} cached"),
            BuildEvent::Phase { name, detail } if name != "plan" => format!("{name}: {detail}"),
            _ => return,
        };
        match &self.mp {
            Some(_) => {
                if let Some(pb) = self.bars.lock().ok().and_then(|b| b.get(name).cloned()) {
                    pb.set_message(msg);
                }
            }
            None => self.line(&format!("{name}: {msg}")),
        }
    }

    fn project_finished(&self, r: &ProjectResult) {
        let text = match r.status.as_str() {
            "ok" => format!("ok in {:.1}s", r.duration_s),
            "skipped" => "skipped (already built)".to_string(),
            _ => format!(
                "{} after {:.1}s: {}",
                r.stage.as_deref().unwrap_or("failed"),
                r.duration_s,
                r.error.as_deref().unwrap_or("")
            ),
        };
        match &self.mp {
            Some(_) => {
                if let Some(pb) = self.bars.lock().ok().and_then(|mut b| b.remove(&r.name)) {
                    pb.set_style(
                        ProgressStyle::with_template("  {prefix:<30} {wide_msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                    pb.finish_with_message(text);
                } else {
                    self.line(&format!("{}: {text}", r.name));
                }
            }
            None => self.line(&format!("{}: {text}", r.name)),
        }
    }
}

pub async fn build_projects(a: BuildProjectsArgs) -> Result<u8, Failure> {
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
    let view = LiveView::new();
    let summary = belay_env::batch::build_projects(&rt, &opts, &view).await?;
    println!(
        "{:<32} {:<8} {:>8} {:>7} {:>6}  detail",
        "project", "status", "time", "repairs", "cached"
    );
    for p in &summary.projects {
        let detail = match p.status.as_str() {
            "ok" | "skipped" => p.final_image.clone().unwrap_or_default(),
            _ => format!(
                "{}: {}",
                p.stage.as_deref().unwrap_or(""),
                p.error
                    .as_deref()
                    .unwrap_or("")
                    .chars()
                    .take(100)
                    .collect::<String>()
            ),
        };
        println!(
            "{:<32} {:<8} {:>7.1}s {:>7} {:>6}  {}",
            p.name, p.status, p.duration_s, p.repairs, p.cache_hits, detail
        );
    }
    println!(
        "{} ok, {} failed, {} skipped of {} in {:.1}s; summary: {}",
        summary.ok,
        summary.failed,
        summary.skipped,
        summary.total,
        summary.duration_s,
        a.projects_dir
            .join(belay_env::batch::SUMMARY_FILE)
            .display()
    );
    Ok(if summary.failed == 0 { 0 } else { EXIT_FAILED })
}
