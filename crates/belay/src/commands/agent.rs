//! `belay agent run`: one task with any agent, through the one agent runner
//! (`belay_agent::runner::Runner`): in a container by default (the workspace
//! mounted, `.git` read-only, a CLI's network limited to the model endpoint,
//! the CLI mounted read-only), on the host only with `--on-host`.

use std::sync::Arc;

use belay_agent::runner::{Call, Runner};
use belay_agent::sandbox::BoxExtras;
use belay_agent::session::EventTarget;
use belay_agent::{AgentReport, Limits};
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
        Err(why) => Err(belay_record::Stopped(format!("{}: the agent was stopped", why.0)).into()),
    }
}

/// A warning in the run's events.
#[derive(serde::Serialize)]
struct Warning<'a> {
    kind: &'static str,
    data: &'a serde_json::Value,
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
    let (git, repo) = work_tree(&a).await?;
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
    let out = records_dir(&a, &repo, &run_id)?;
    let model = resolve_model(&a.model, spec.is_builtin(), spec.kind.native_dialect())?;
    let (endpoint, redactor) = endpoint_and_redactor(&spec, &model)?;
    // Refused before the run opens: a price it cannot have, no model.
    let (table, client) = pricing(&a, &spec, &model, &out)?;
    let stop = crate::context::stop_on_signals()?;
    let run = RunHandle::open(OpenRun {
        dir: out.clone(),
        id: &run_id,
        mode: Mode::Agent,
        title: Some(&a.prompt.chars().take(80).collect::<String>()),
        repo: None,
        redactor: redactor.clone(),
        registry: Registry::default_location(),
    })
    .map_err(|e| {
        usage(format!(
            "cannot open the run in {}: {e}. Pass --out with a writable directory",
            out.display()
        ))
    })?;
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
    let endpoint: Option<belay_agent::cli::Endpoint> = endpoint.map(Into::into);
    let rt: Option<Arc<dyn ContainerRuntime>> = if a.on_host {
        None
    } else {
        Some(Arc::new(connect().await?))
    };
    let env = run_env(rt.as_deref(), &a.image, &run_id, &redactor).await?;
    // The agent's warnings are untrusted text: one printable line each,
    // recorded in the run's events (the dashboard and `runs events` show
    // them) and printed.
    let warn = |m: &str| {
        let line = belay_record::printable_line(m);
        let data = serde_json::json!({ "message": line });
        let _ = run.emit(
            "engine",
            None,
            &Warning {
                kind: "warning",
                data: &data,
            },
        );
        p.warn(&line);
    };
    // The one agent runner (the plan loop's, the rounds', the jobs'): the
    // box, the endpoint as the container reaches it, the sweep of the work
    // tree, and on the host the adoption of what leaves the agent's group.
    let runner = Runner {
        rt: rt.clone(),
        image: &a.image,
        on_host: a.on_host,
        // In a container the container is the sandbox: the CLI's own
        // approvals would only stall it. On the host only when asked.
        auto_approve: a.auto_approve || !a.on_host,
        endpoint: endpoint.as_ref(),
        client: client.as_ref(),
        prices: &table,
        redactor: &redactor,
        run_id: &run_id,
        workdir: &repo,
        git: git.as_ref(),
        records: out.clone(),
        warn: &warn,
        extras: BoxExtras {
            network: a.network,
            keep: a.keep_container,
            env: env.agent.clone(),
            ..BoxExtras::default()
        },
        agent_env: vec![],
        boxes: None,
        warm: false,
    };
    let call = Call {
        spec: &spec,
        kind: "agent".into(),
        prompt: &a.prompt,
        limits,
        events: Some(events),
        logs: if a.on_host {
            out.clone()
        } else {
            out.join("tool-logs")
        },
        pid_file: None,
        process: Default::default(),
        prepared: None,
    };
    // Interrupted, the call is dropped: its process group is killed, and
    // what its container left is removed and swept here.
    let output = interruptible(&stop, runner.run(call)).await;
    // (A kept container keeps its volumes: the engine refuses to remove a
    // volume in use.)
    if let Some(rt) = &rt {
        env.remove(rt.as_ref()).await;
        if !a.keep_container {
            env.tidy(&repo);
        }
    }
    let output = match output {
        Ok(o) => o,
        Err(f) => {
            if f.code == belay_record::ExitClass::Interrupted.code() {
                belay_agent::runner::after_stop(rt.as_deref(), &run_id, &repo, &warn).await;
            }
            return Err(ended(&run, f));
        }
    };
    if let Some(c) = &output.kept {
        p.note(&format!("kept container {c} (docker exec -it {c} bash)"));
    }
    let report: AgentReport = output.report;
    report_end(p, &run, &report, &redactor, &out)?;
    Ok(if report.ok() { 0 } else { EXIT_FAILED })
}

/// An env build's image brings the project's environment over the tree (in
/// a container; on the host, nothing).
async fn run_env(
    rt: Option<&dyn ContainerRuntime>,
    image: &str,
    run_id: &str,
    redactor: &belay_record::Redactor,
) -> Result<belay_sandbox::envimage::RunEnv, Failure> {
    Ok(match rt {
        Some(rt) => {
            belay_sandbox::envimage::RunEnv::open(
                rt,
                image,
                run_id,
                belay_agent::sandbox::WORKDIR,
                redactor,
                false,
            )
            .await?
        }
        None => Default::default(),
    })
}

/// The end of a call: its report recorded and shown.
fn report_end(
    p: &Printer,
    run: &RunHandle,
    report: &AgentReport,
    redactor: &belay_record::Redactor,
    out: &std::path::Path,
) -> Result<(), Failure> {
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
    run.write_json("report.json", report)?;
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
    Ok(())
}

/// The work tree: the whole repository `--repo` is in (a subdirectory would
/// leave its `.git` unmounted, for the agent to plant one the next host git
/// reads), or the directory itself when it is no repository. Hooks point at
/// an empty directory belay owns (never a shared /tmp path another user
/// could fill).
async fn work_tree(
    a: &AgentRunArgs,
) -> Result<(Option<belay_vcs::Git>, std::path::PathBuf), Failure> {
    let given = fs_err::canonicalize(&a.repo).map_err(|e| {
        usage(format!(
            "--repo {}: {e}. Pass an existing directory",
            a.repo.display()
        ))
    })?;
    let git = belay_vcs::Git::open(&given, &belay_record::no_hooks_dir())
        .await
        .ok();
    let repo = git
        .as_ref()
        .map(|g| g.root().to_path_buf())
        .unwrap_or(given);
    Ok((git, repo))
}

/// Where the run's records live: where the agent cannot write, never under
/// the mounted workspace (checked again through links once it exists).
fn records_dir(
    a: &AgentRunArgs,
    repo: &std::path::Path,
    run_id: &str,
) -> Result<std::path::PathBuf, Failure> {
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| belay_record::state_home().join("agent").join(run_id));
    let inside = |o: &std::path::Path| -> Result<(), Failure> {
        if o.starts_with(repo) {
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
    inside(&fs_err::canonicalize(&out)?)?;
    Ok(out)
}

/// The price table (cost is priced by the model the CLI runs; Claude Code
/// reports its own) and, for the built-in agent, its model client.
fn pricing(
    a: &AgentRunArgs,
    spec: &belay_agent::AgentSpec,
    model: &Option<crate::commands::model::ModelChoice>,
    out: &std::path::Path,
) -> Result<(belay_model::PriceTable, Option<belay_model::ModelClient>), Failure> {
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
    let client = match (model, spec.is_builtin()) {
        (Some((setup, _)), true) => Some(
            setup
                .client(Some(out.join("llm-usage.json")))
                .map_err(|e| usage(e.to_string()))?,
        ),
        (None, true) => return Err(usage("the built-in agent needs a model")),
        _ => None,
    };
    Ok((table, client))
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

/// The agent's endpoint (checked against the dialect its CLI speaks) and the
/// run's redactor with the endpoint's secrets.
fn endpoint_and_redactor(
    spec: &belay_agent::AgentSpec,
    model: &Option<crate::commands::model::ModelChoice>,
) -> Result<
    (
        Option<belay_model::resolve::AgentEndpoint>,
        belay_record::Redactor,
    ),
    Failure,
> {
    let mut redactor = crate::context::build_redactor();
    let endpoint = model.as_ref().map(crate::commands::model::agent_endpoint);
    if let Some(e) = &endpoint {
        e.add_secrets(&mut redactor);
        if !spec.is_builtin() {
            spec.check_dialect("CLI", e.api, &e.base_url, |api| {
                format!("give --llm-api {api} (or leave --llm-api out: the agent's own dialect is the default)")
            })
            .map_err(belay_agent::AgentError::from)?;
        }
    }
    Ok((endpoint, redactor))
}
