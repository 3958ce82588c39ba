//! `belay agent run`: one task with any agent, through the one agent service
//! (`belay_agent::AgentSession`): in a container by default (the workspace
//! mounted, `.git` read-only, a CLI's network limited to the model endpoint,
//! the CLI mounted read-only), on the host only with `--on-host`.

use std::sync::Arc;

use belay_agent::session::EventTarget;
use belay_agent::{AgentBox, AgentReport, AgentSession, BoxSpec, Limits, Placement};
use belay_record::{Mode, OpenRun, Registry, RunHandle};
use belay_sandbox::ContainerRuntime;

use crate::cli::AgentRunArgs;
use crate::commands::model::resolve_model;
use crate::context::connect;
use crate::exit::{usage, Failure, EXIT_FAILED};
use crate::output::Printer;

/// Run `fut` unless the stop token trips first (then the future is dropped,
/// which kills an agent CLI's process group, and the caller cleans up).
async fn interruptible<T, E>(
    stop: &belay_record::Stop,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, Failure>
where
    E: belay_record::Classify + std::error::Error + Send + Sync + 'static,
{
    match stop.race(fut).await {
        Ok(r) => r.map_err(Failure::from),
        Err(why) => Err(belay_record::Stopped(format!("{why}: the agent was stopped")).into()),
    }
}

/// Record how a run that failed (or was stopped) ended, and pass the failure on.
fn ended(run: &RunHandle, f: Failure) -> Failure {
    let end = failed_end(run, &f.error);
    if f.code == belay_record::ExitClass::Interrupted.code() {
        run.interrupted(end);
    } else {
        run.finish(end);
    }
    f
}

pub async fn run(p: &Printer, a: AgentRunArgs) -> Result<u8, Failure> {
    let given = fs_err::canonicalize(&a.repo).map_err(|e| {
        usage(format!(
            "--repo {}: {e}. Pass an existing directory",
            a.repo.display()
        ))
    })?;
    // The workspace is the whole work tree (a subdirectory would leave its
    // `.git` unmounted, for the agent to plant one the next host git reads).
    // Hooks point at an empty directory belay owns (never a shared /tmp path
    // another user could fill).
    let git = belay_vcs::Git::open(&given, &belay_record::state_home().join("no-hooks"))
        .await
        .ok();
    let repo = git
        .as_ref()
        .map(|g| g.root().to_path_buf())
        .unwrap_or_else(|| given.clone());
    let mut spec = a.agent.clone();
    if spec.model.is_none() {
        spec.model = a.model.model.clone();
    }
    if spec.is_builtin() && a.on_host {
        return Err(usage(
            "the built-in agent runs its tools in a container; --on-host is for agent CLIs",
        ));
    }
    let run_id = belay_record::run_id::generate("agent");
    // The run's records live where the agent cannot write: never under the
    // mounted workspace.
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| belay_record::state_home().join("agent").join(&run_id));
    let inside = |o: &std::path::Path| -> Result<(), Failure> {
        if o.starts_with(&repo) {
            return Err(usage(format!(
                "--out {} is inside the repository, which the agent can write: its records would be the agent's to change. Pass --out outside {}",
                o.display(),
                repo.display()
            )));
        }
        Ok(())
    };
    inside(&std::path::absolute(&out).unwrap_or_else(|_| out.clone()))?;
    fs_err::create_dir_all(&out).map_err(|e| {
        usage(format!(
            "cannot create {}: {e}. Pass --out with a writable directory",
            out.display()
        ))
    })?;
    // Again through links, now that it exists.
    inside(&fs_err::canonicalize(&out)?)?;
    let model = resolve_model(&a.model, spec.is_builtin())?;
    let mut redactor = crate::context::build_redactor();
    if let Some((_, Some((name, key)))) = &model {
        redactor.add(name.clone(), key.expose());
    }
    let stop = crate::context::stop_on_signals()?;
    let run = RunHandle::open(OpenRun {
        dir: out.clone(),
        id: &run_id,
        mode: Mode::Agent,
        title: Some(&a.prompt.chars().take(80).collect::<String>()),
        redactor: redactor.clone(),
        registry: Registry::default_location(),
    })
    .map_err(|e| {
        usage(format!(
            "cannot open the run in {}: {e}. Pass --out with a writable directory",
            out.display()
        ))
    })?;
    // Cost is priced by the model the CLI runs; Claude Code reports its own.
    let table = match &a.model.endpoint.llm_prices {
        Some(f) => belay_model::PriceTable::load(f).map_err(|e| usage(e.to_string()))?,
        None => belay_model::PriceTable::builtin(),
    };
    let prices = spec.model.as_deref().and_then(|m| table.lookup(m));
    if !spec.is_builtin()
        && a.max_cost.is_some()
        && prices.is_none()
        && spec.cli_kind() != Some(belay_agent::cli::CliKind::Claude)
    {
        return Err(usage(
            "--max-cost needs a price for this CLI's model: give the agent a priced model (codex@MODEL or --model), or --llm-prices with its price",
        ));
    }
    let client = match (&model, spec.is_builtin()) {
        (Some((setup, _)), true) => Some(
            setup
                .client(Some(out.join("llm-usage.json")))
                .map_err(|e| usage(e.to_string()))?,
        ),
        (None, true) => return Err(usage("the built-in agent needs a model")),
        _ => None,
    };
    let limits = Limits {
        max_turns: Some(a.max_turns),
        max_cost_usd: a.max_cost,
        wall_time: a.wall_time,
        final_grace: a.final_grace,
        ..Limits::default()
    };
    let events = EventTarget {
        sink: run.sink().clone(),
        step: None,
        source: "agent",
    };
    let endpoint_of = |base: String| {
        model
            .as_ref()
            .map(|(setup, key)| belay_agent::cli::Endpoint {
                base_url: base,
                api: setup.config.api,
                key: key.as_ref().map(|(_, k)| k.clone()),
            })
    };
    let report: AgentReport = if a.on_host {
        let session = AgentSession {
            spec,
            placement: Placement::Host {
                cwd: repo.clone(),
                env: vec![],
            },
            limits,
            client: None,
            builtin: Default::default(),
            endpoint: model
                .as_ref()
                .and_then(|(s, _)| endpoint_of(s.config.base_url.clone())),
            prices,
            auto_approve: a.auto_approve,
            logs: out.clone(),
            redactor: redactor.clone(),
            events: Some(events),
            pid_file: None,
            process: Default::default(),
        };
        // Interrupted, the run is dropped and its process group killed.
        interruptible(&stop, session.run(&a.prompt))
            .await
            .map_err(|f| ended(&run, f))?
    } else {
        let rt: Arc<dyn ContainerRuntime> = Arc::new(connect().await?);
        let agent_box = AgentBox::open(BoxSpec {
            rt,
            image: a.image.clone(),
            run_id: run_id.clone(),
            kind: "agent".into(),
            repo: repo.clone(),
            git: git.as_ref(),
            records: out.clone(),
            agent: &spec,
            model_url: model.as_ref().map(|(s, _)| s.config.base_url.clone()),
            network: a.network,
            keep: a.keep_container,
            extras: Default::default(),
        })
        .await?;
        let session = AgentSession {
            endpoint: agent_box
                .endpoint_url()
                .and_then(|u| endpoint_of(u.to_string())),
            spec,
            placement: agent_box.placement(),
            limits,
            client: client.as_ref(),
            builtin: Default::default(),
            prices,
            // The container is the sandbox: the CLI's own approvals would only stall it.
            auto_approve: true,
            logs: out.join("tool-logs"),
            redactor: redactor.clone(),
            events: Some(events),
            pid_file: None,
            process: Default::default(),
        };
        let result = interruptible(&stop, session.run(&a.prompt)).await;
        if a.keep_container {
            let c = agent_box.id().to_string();
            p.note(&format!("kept container {c} (docker exec -it {c} bash)"));
        }
        // What the agent wrote is untrusted: no set-id file stays behind, and
        // a planted repository is named. A walk that cannot finish fails the
        // command (fail closed).
        let sweep = match agent_box.close().await {
            Ok(s) => s,
            Err(e) => {
                let f = Failure::with_code(belay_record::ExitClass::Infra.code(), e);
                run.finish(failed_end(&run, &f.error));
                return Err(f);
            }
        };
        if !sweep.setid_cleared.is_empty() {
            p.warn(&format!(
                "cleared set-id bits the agent left on {}",
                belay_record::printable_line(&sweep.setid_cleared.join(", "))
            ));
        }
        if !sweep.nested_git.is_empty() {
            p.warn(&format!(
                "the agent left repositories in the workspace ({}): their config runs commands in any git there. Remove them before you use git in {}",
                belay_record::printable_line(&sweep.nested_git.join(", ")),
                repo.display()
            ));
        }
        result.map_err(|f| ended(&run, f))?
    };
    let data = serde_json::json!({"stop": report.stop, "turns": report.turns, "usage": report.usage, "cost_usd": report.cost_usd});
    #[derive(serde::Serialize)]
    struct Line<'a> {
        kind: &'static str,
        data: &'a serde_json::Value,
    }
    let _ = run.emit(
        "agent",
        None,
        &Line {
            kind: "agent_report",
            data: &data,
        },
    );
    run.finish(belay_record::RunEnd {
        ok: report.ok(),
        duration_s: run.elapsed_s(),
        tokens: report.usage.input_tokens + report.usage.output_tokens,
        cost_usd: report.cost_usd,
        summary: Some(report.stop.describe()),
    });
    run.write_json("report.json", &report)?;
    // The agent's text: the printer shows its control characters escaped.
    p.out(redactor.redact(&report.final_text));
    p.note(&format!(
        "agent {}: {} turn(s), {} in / {} out tokens, ${:.4}, {:.1}s; events in {}",
        report.stop.describe(),
        report.turns,
        report.usage.input_tokens,
        report.usage.output_tokens,
        report.cost_usd,
        report.duration_s,
        out.join("events.jsonl").display()
    ));
    Ok(if report.ok() { 0 } else { EXIT_FAILED })
}

/// The registry's end of a run that stopped on an error.
fn failed_end(run: &RunHandle, e: &anyhow::Error) -> belay_record::RunEnd {
    belay_record::RunEnd {
        ok: false,
        duration_s: run.elapsed_s(),
        tokens: 0,
        cost_usd: 0.0,
        summary: Some(run.redactor().redact(&format!("{e:#}")).into_owned()),
    }
}
