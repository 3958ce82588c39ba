//! `belay agent run`: one task, with the built-in agent in a container or an
//! agent CLI (on the host only with --on-host).

use std::sync::Arc;

use anyhow::Context;
use belay_agent::builtin::{BuiltinAgent, BuiltinConfig};
use belay_agent::cli::{CliAgent, CliKind, Endpoint, Launch};
use belay_agent::workspace::ContainerWorkspace;
use belay_agent::{AgentEvent, AgentReport, Limits};
use belay_record::{EventSink, Mode, Redactor, Registry};
use belay_sandbox::{ContainerRuntime, ContainerSpec, Network, TarFilter};
use serde::Serialize;

use crate::cli::{AgentKind, AgentRunArgs};
use crate::commands::model::resolve_model;
use crate::context::connect;
use crate::exit::{usage, Failure, EXIT_FAILED};
use crate::output::Printer;

/// An agent run's event: `{"kind": …, "data": …}` for the envelope.
#[derive(Serialize)]
struct AgentLine<'a> {
    kind: &'static str,
    data: &'a serde_json::Value,
}

const WORKDIR: &str = "/workspace/repo";

/// Run `fut` unless Ctrl-C or SIGTERM comes first (then the future is dropped,
/// which kills an agent CLI's process group, and the caller cleans up).
async fn interruptible<T>(
    fut: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch for SIGTERM")?;
    tokio::select! {
        r = fut => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted (Ctrl-C): the agent was stopped")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated (SIGTERM): the agent was stopped")),
    }
}

pub async fn run(p: &Printer, a: AgentRunArgs) -> Result<u8, Failure> {
    let repo = std::fs::canonicalize(&a.repo).map_err(|e| {
        usage(format!(
            "--repo {}: {e}. Pass an existing directory",
            a.repo.display()
        ))
    })?;
    let run_id = belay_record::run_id::generate("agent");
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| repo.join(".belay").join("agent").join(&run_id));
    std::fs::create_dir_all(&out).map_err(|e| {
        usage(format!(
            "cannot create {}: {e}. Pass --out with a writable directory",
            out.display()
        ))
    })?;
    let model = resolve_model(&a.model, a.agent == AgentKind::Builtin)?;
    let mut redactor = Redactor::default();
    if let Some((_, Some((name, key)))) = &model {
        redactor.add(name.clone(), key.expose());
    }
    let sink = EventSink::open(
        &out.join("events.jsonl"),
        &run_id,
        Mode::Agent,
        redactor.clone(),
    )?;
    let registry = Registry::default_location();
    if let Err(e) = registry.started(
        &run_id,
        Mode::Agent,
        &out,
        Some(&a.prompt.chars().take(80).collect::<String>()),
    ) {
        p.warn(&format!("the run is not in the registry: {e}"));
    }
    let t0 = std::time::Instant::now();
    let mut write_err: Option<String> = None;
    let mut on_event = |e: &AgentEvent| {
        let data = serde_json::json!({ "event": e });
        if let Err(err) = sink.emit(
            "agent",
            None,
            &AgentLine {
                kind: "agent",
                data: &data,
            },
        ) {
            write_err.get_or_insert(err.to_string());
        }
    };

    let report: AgentReport = if a.agent == AgentKind::Builtin {
        let Some((setup, _)) = &model else {
            return Err(usage("the built-in agent needs a model"));
        };
        let client = setup
            .client(Some(out.join("llm-usage.json")))
            .map_err(|e| usage(e.to_string()))?;
        let rt = connect().await?;
        if !rt.image_exists(&a.image).await? {
            return Err(usage(format!(
                "image {} is not on this Docker engine: run `belay image bootstrap`, or pass --image (an image from `belay env build` works)",
                a.image
            )));
        }
        let container = rt
            .create(&ContainerSpec {
                image: a.image.clone(),
                run_id: run_id.clone(),
                kind: "agent".into(),
                network: if a.network {
                    Network::Bridge
                } else {
                    Network::None
                },
                working_dir: Some(WORKDIR.into()),
                unowned: a.keep_container,
                ..Default::default()
            })
            .await?;
        let filter = TarFilter {
            exclude: vec![".belay".into(), ".git".into()],
            ignore: None,
        };
        let rt: Arc<dyn ContainerRuntime> = Arc::new(rt);
        let result = interruptible(async {
            rt.copy_dir_in(&container, &repo, WORKDIR, &filter).await?;
            let ws = ContainerWorkspace::new(
                rt.clone(),
                &container,
                WORKDIR,
                out.join("tool-logs"),
                redactor.clone(),
                vec![],
            );
            let mut agent = BuiltinAgent::new(
                &client,
                &ws,
                BuiltinConfig {
                    max_iterations: a.max_turns,
                    max_cost_usd: a.max_cost,
                    wall_time: a.wall_time,
                    ..BuiltinConfig::default()
                },
            );
            anyhow::Ok(agent.run(&a.prompt, &mut on_event).await?)
        })
        .await;
        if a.keep_container {
            p.note(&format!(
                "kept container {container} (docker exec -it {container} bash)"
            ));
        } else {
            let _ = rt.remove(&container).await;
        }
        result?
    } else {
        if !a.on_host {
            return Err(usage(
                "agent CLIs run in a pipeline step's container; to run one here, on this machine, in --repo, pass --on-host (an explicit opt-out of the sandbox)",
            ));
        }
        let kind = match a.agent {
            AgentKind::Codex => CliKind::Codex,
            AgentKind::Claude => CliKind::Claude,
            AgentKind::Gemini => CliKind::Gemini,
            _ => CliKind::Plain,
        };
        let mut agent = CliAgent::new(kind);
        if let Some(prog) = &a.program {
            agent.program = prog.clone();
        }
        if kind == CliKind::Plain && (a.program.is_none() || a.args.is_empty()) {
            return Err(usage(
                "--agent plain needs --program and --arg (with {prompt} where the prompt goes)",
            ));
        }
        agent.template = a.args.clone();
        agent.auto_approve = a.auto_approve;
        agent.model = a.model.model.clone();
        // Cost is priced by the model the CLI runs (--model); Claude Code
        // reports its own cost, the others do not.
        let table = match &a.model.llm_prices {
            Some(f) => belay_model::PriceTable::load(f).map_err(usage)?,
            None => belay_model::PriceTable::builtin(),
        };
        let prices = a.model.model.as_deref().and_then(|m| table.lookup(m));
        if a.max_cost.is_some() && prices.is_none() && kind != CliKind::Claude {
            return Err(usage(
                "--max-cost needs a price for this CLI's model: pass --model with a priced model, or --llm-prices with its price",
            ));
        }
        if let Some((setup, key)) = &model {
            let base = &setup.config.base_url;
            if a.model.openai_base_url.is_some() || !base.contains("api.openai.com") {
                agent.endpoint = Some(Endpoint {
                    base_url: base.clone(),
                    api: setup.config.api,
                    key: key.as_ref().map(|(_, k)| k.clone()),
                });
            }
        }
        let launch = Launch::for_agent(&agent, &a.prompt, repo.clone(), &[])?;
        let limits = Limits {
            max_turns: Some(a.max_turns),
            max_cost_usd: a.max_cost,
            wall_time: a.wall_time,
            final_grace: a.final_grace,
            ..Limits::default()
        };
        let mut parser = agent.parser();
        // Interrupted, the run is dropped and its process group killed.
        interruptible(async {
            Ok(
                belay_agent::cli::run(&launch, parser.as_mut(), &limits, prices, &mut on_event)
                    .await?,
            )
        })
        .await?
    };
    if let Some(e) = write_err {
        p.warn(&e);
    }
    let data = serde_json::json!({"stop": report.stop, "turns": report.turns, "usage": report.usage, "cost_usd": report.cost_usd});
    let _ = sink.emit(
        "agent",
        None,
        &AgentLine {
            kind: "agent_report",
            data: &data,
        },
    );
    let end = belay_record::RunEnd {
        ok: report.ok(),
        duration_s: t0.elapsed().as_secs_f64(),
        tokens: report.usage.input_tokens + report.usage.output_tokens,
        cost_usd: report.cost_usd,
        summary: Some(report.stop.describe()),
    };
    if let Err(e) = registry.ended(&run_id, end) {
        p.warn(&format!("the run's end is not in the registry: {e}"));
    }
    let text = serde_json::to_string_pretty(&report).context("cannot serialise the report")?;
    belay_record::atomic_write(&out.join("report.json"), redactor.redact(&text).as_bytes())?;
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
