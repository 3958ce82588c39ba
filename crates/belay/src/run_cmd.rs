//! `belay run PIPELINE.yaml`.

use std::sync::Arc;

use belay_pipeline::engine::{state_dir_for, Engine, RunOptions};
use belay_pipeline::state::Status;
use belay_sandbox::ContainerRuntime;

use crate::cli::RunArgs;
use crate::commands::{connect, usage};
use crate::{Failure, EXIT_FAILED};

pub async fn run(a: RunArgs) -> Result<u8, Failure> {
    let p = belay_pipeline::load(&a.pipeline).map_err(|e| usage(e.to_string()))?;
    if a.dry_run {
        print!(
            "{}",
            belay_pipeline::dryrun::plan(&p, a.state_dir.as_deref())
        );
        return Ok(0);
    }
    if a.clean_stamps {
        let dir = state_dir_for(&p, a.state_dir.as_deref()).join("stamps");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| usage(format!("cannot delete {}: {e}", dir.display())))?;
        }
        println!("deleted the provision stamps in {}", dir.display());
        return Ok(0);
    }
    let rt: Arc<dyn ContainerRuntime> = Arc::new(connect().await?);
    let opts = RunOptions {
        resume: a.resume.clone(),
        max_attempts: a.max_attempts,
        refresh: a.refresh,
        state_dir: a.state_dir.clone(),
    };
    let engine = Engine::start(&p, rt, &opts).await?;
    eprintln!(
        "[belay] run {} of {}: state and events in {}",
        engine.run_id(),
        p.name,
        engine.run_dir().display()
    );
    let out = engine.run().await?;
    println!(
        "{} {}: {} after {} step run(s), attempt {}{}{}; records in {}",
        p.name,
        out.run_id,
        match out.status {
            Status::Succeeded => "succeeded",
            Status::Failed => "FAILED",
            Status::Running => "interrupted",
        },
        out.step_runs,
        out.attempts,
        out.commit
            .as_ref()
            .map(|c| format!(", committed {}", &c[..c.len().min(12)]))
            .unwrap_or_default(),
        out.failure
            .as_ref()
            .map(|f| format!(" ({f})"))
            .unwrap_or_default(),
        out.run_dir.display()
    );
    Ok(if out.status == Status::Succeeded {
        0
    } else {
        EXIT_FAILED
    })
}
