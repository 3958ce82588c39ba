//! `belay run PIPELINE.yaml`.

use std::sync::Arc;

use belay_pipeline::engine::{state_dir_for, Engine, Observer, RunOptions};
use belay_pipeline::events::Kind;
use belay_pipeline::state::Status;
use belay_sandbox::ContainerRuntime;

use crate::cli::RunArgs;
use crate::context::connect;
use crate::exit::{io, Failure, EXIT_FAILED};
use crate::output::pipeline::Console;
use crate::output::Printer;

pub async fn run(out: &Printer, a: RunArgs) -> Result<u8, Failure> {
    if a.explain_compat {
        let text = fs_err::read_to_string(&a.pipeline)?;
        let report = belay_pipeline::compat::explain(&text, &a.pipeline)?;
        out.out(report.trim_end_matches('\n'));
        return Ok(0);
    }
    let p = belay_pipeline::load(&a.pipeline)?;
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
    // The console: each event's line, printed here as it comes.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<(bool, String)>();
    let console = std::sync::Mutex::new(Console::default());
    let observer = Observer(Arc::new(move |kind, step, data| {
        if kind == Kind::UntrackedAtStart {
            let files: Vec<&str> = data
                .get("files")
                .and_then(|f| f.as_array())
                .map(|v| v.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            let total = data
                .get("files_total")
                .and_then(|t| t.as_u64())
                .unwrap_or(0);
            // File names are anyone's: one line, printable.
            let names = files.iter().take(8).copied().collect::<Vec<_>>().join(", ");
            let _ = lines_tx.send((true, format!(
                "the worktree has {total} uncommitted or untracked file(s) ({}{}): the commit point will refuse to mix them into its commit. Commit or stash them, .gitignore build output, or list it in sync_excludes",
                belay_record::printable_line(&names),
                if total > 8 { ", …" } else { "" }
            )));
            return;
        }
        if let Some(l) = console
            .lock()
            .ok()
            .and_then(|mut c| c.line(kind, step, data))
        {
            let _ = lines_tx.send((false, l));
        }
    }));
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
    let printing = async {
        while let Some((warn, l)) = lines.recv().await {
            if warn {
                out.warn(&l);
            } else {
                out.note(&l);
            }
        }
    };
    // The engine holds the only sender: its end closes the console.
    let (res, ()) = tokio::join!(engine.run(), printing);
    let res = res?;
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
