//! `belay run PIPELINE.yaml`.

use std::sync::Arc;

use belay_pipeline::engine::{state_dir_for, Engine, RunOptions};
use belay_pipeline::events::PipelineEvent;
use belay_pipeline::state::Status;
use belay_sandbox::ContainerRuntime;

use crate::cli::RunArgs;
use crate::context::connect;
use crate::exit::{io, Failure, EXIT_FAILED};
use crate::output::pipeline::Console;
use crate::output::{EventView, Printer};

pub async fn run(out: &Printer, a: RunArgs) -> Result<u8, Failure> {
    if a.explain_compat {
        let text = fs_err::read_to_string(&a.pipeline)?;
        let report = belay_pipeline::compat::explain(&text, &a.pipeline)?;
        out.out(report.trim_end_matches('\n'));
        return Ok(0);
    }
    let mut p = belay_pipeline::load(&a.pipeline)?;
    if a.dry_run {
        let plan = belay_pipeline::dryrun::plan(&p, a.state_dir.as_deref());
        out.out(plan.trim_end_matches('\n'));
        return Ok(0);
    }
    if a.clean_stamps {
        let dir = state_dir_for(&p, a.state_dir.as_deref()).join("stamps");
        if dir.exists() {
            fs_err::remove_dir_all(&dir)
                .map_err(|e| io(format_args!("delete {}", dir.display()), e))?;
        }
        out.out(format!("deleted the provision stamps in {}", dir.display()));
        return Ok(0);
    }
    let rt: Arc<dyn ContainerRuntime> = Arc::new(connect().await?);
    // isolation.image (an image, or an env build's run id), else the
    // repository's latest env build, else the default.
    let image = crate::context::sandbox_image(
        out,
        Some(rt.as_ref()),
        Some(&p.dir),
        p.isolation.image.as_deref(),
        belay_pipeline::engine::DEFAULT_IMAGE,
        &[],
    )
    .await?;
    p.isolation.image = Some(image);
    // The console: each event's line as it is recorded.
    let observer: Arc<dyn belay_record::Observer<PipelineEvent>> =
        Arc::new(EventView::new(out, Console::default(), false));
    let stop = crate::context::stop_on_signals()?;
    let opts = RunOptions {
        resume: a.resume.clone(),
        max_attempts: a.max_attempts,
        refresh: a.refresh,
        state_dir: a.state_dir.clone(),
        registry: None,
        stop: Some(stop),
        observer: Some(observer),
    };
    let started = Engine::start(&p, rt, &opts).await;
    drop(opts);
    let engine = started?;
    out.note(&format!(
        "run {} of {}: state and events in {}",
        engine.run_id(),
        p.name,
        engine.run_dir().display()
    ));
    let _viz = crate::commands::ui::viz(out, &a.viz, engine.run_id()).await;
    let res = engine.run().await?;
    out.out(format!(
        "{} {}: {} after {} step run(s), attempt {}{}{}; records in {}",
        p.name,
        res.run_id,
        match res.status {
            Status::Succeeded => "succeeded",
            Status::Failed => "FAILED",
            Status::Running => "interrupted",
        },
        res.step_runs,
        res.attempts,
        res.commit
            .as_ref()
            .map(|c| format!(", committed {}", &c[..c.len().min(12)]))
            .unwrap_or_default(),
        res.failure
            .as_ref()
            .map(|f| format!(" ({f})"))
            .unwrap_or_default(),
        res.run_dir.display()
    ));
    Ok(if res.status == Status::Succeeded {
        0
    } else {
        EXIT_FAILED
    })
}
