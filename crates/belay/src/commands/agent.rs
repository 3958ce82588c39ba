//! `belay agent run`: one task with any agent, through the one agent service
//! (`belay_agent::AgentSession`): in a container by default (the workspace
//! mounted, `.git` read-only, a CLI's network limited to the model endpoint,
//! the CLI mounted read-only), on the host only with `--on-host`.

use std::sync::Arc;

use anyhow::Context;
use belay_agent::session::{container_mounts, EventTarget};
use belay_agent::{AgentReport, AgentSession, Limits, Placement};
use belay_record::{Mode, OpenRun, Redactor, Registry, RunHandle};
use belay_sandbox::{ContainerRuntime, ContainerSpec, Mount, Network};

use crate::cli::AgentRunArgs;
use crate::commands::model::resolve_model;
use crate::context::connect;
use crate::exit::{usage, Failure, EXIT_FAILED};
use crate::output::Printer;

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
    let mut redactor = Redactor::default();
    if let Some((_, Some((name, key)))) = &model {
        redactor.add(name.clone(), key.expose());
    }
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
    let table = match &a.model.llm_prices {
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
        };
        // Interrupted, the run is dropped and its process group killed.
        match interruptible(async { Ok(session.run(&a.prompt).await?) }).await {
            Ok(r) => r,
            Err(e) => {
                run.finish(failed_end(&run, &e));
                return Err(e.into());
            }
        }
    } else {
        let rt: Arc<dyn ContainerRuntime> = Arc::new(connect().await?);
        if !rt.image_exists(&a.image).await? {
            return Err(usage(format!(
                "image {} is not on this Docker engine: run `belay image bootstrap`, or pass --image (an image from `belay env build` works)",
                a.image
            )));
        }
        // A CLI reaches only the model endpoint, through the model route.
        let route = match (&model, spec.is_builtin()) {
            (Some((setup, _)), false) => Some(
                belay_sandbox::route::model_route(
                    rt.as_ref(),
                    &format!("belay-{run_id}-model"),
                    &setup.config.base_url,
                )
                .await?,
            ),
            _ => None,
        };
        let mut mounts = vec![Mount {
            host: repo.clone(),
            container: WORKDIR.into(),
            read_only: false,
        }];
        mounts.extend(git_mounts(git.as_ref(), &repo, &out).await?);
        mounts.extend(container_mounts(&spec)?);
        let mut env = vec![("HOME".to_string(), "/tmp".to_string())];
        if let Some(r) = &route {
            env.extend(r.env.iter().cloned());
        }
        let container = rt
            .create(&ContainerSpec {
                image: a.image.clone(),
                run_id: run_id.clone(),
                kind: "agent".into(),
                network: if a.network && spec.is_builtin() {
                    Network::Bridge
                } else {
                    Network::None
                },
                network_name: route.as_ref().map(|r| r.network.clone()),
                working_dir: Some(WORKDIR.into()),
                mounts,
                env: env.clone(),
                unowned: a.keep_container,
                // The pipeline's step policy: no capabilities (no device
                // nodes, no file capabilities, no set-id of others' files), a
                // read-only root, a scratch /tmp, and the container's own
                // processes out of the agent's reach.
                read_only_rootfs: true,
                drop_capabilities: true,
                tmpfs: vec!["/tmp".into()],
                idle_user: Some("65534:65534".into()),
                ..Default::default()
            })
            .await?;
        let session = AgentSession {
            endpoint: route.as_ref().and_then(|r| endpoint_of(r.url.clone())),
            spec,
            placement: Placement::Container {
                rt: rt.clone(),
                id: container.clone(),
                workdir: WORKDIR.into(),
                env: route.as_ref().map(|r| r.env.clone()).unwrap_or_default(),
                host_root: Some(repo.clone()),
            },
            limits,
            client: client.as_ref(),
            builtin: Default::default(),
            prices,
            // The container is the sandbox: the CLI's own approvals would only stall it.
            auto_approve: true,
            logs: out.join("tool-logs"),
            redactor: redactor.clone(),
            events: Some(events),
        };
        let result = interruptible(async { Ok(session.run(&a.prompt).await?) }).await;
        if a.keep_container {
            p.note(&format!(
                "kept container {container} (docker exec -it {container} bash)"
            ));
        } else {
            let _ = rt.remove(&container).await;
        }
        if let Some(r) = route {
            let net = r.network.clone();
            drop(r);
            let _ = rt.remove_network(&net).await;
        }
        // What the agent wrote is untrusted: no set-id file stays behind, and
        // a planted repository is named. A walk that cannot finish fails the
        // command (fail closed).
        let sweep = belay_sandbox::hostfs::sweep_workspace(&repo).map_err(|e| Failure {
            code: crate::exit::EXIT_INFRA,
            error: anyhow::anyhow!(
                "cannot check the workspace for set-id files after the agent: {e}; remove that path and check {} by hand",
                repo.display()
            ),
        });
        let sweep = match sweep {
            Ok(s) => s,
            Err(f) => {
                run.finish(failed_end(&run, &f.error));
                return Err(f);
            }
        };
        if !sweep.setid_cleared.is_empty() {
            p.warn(&format!(
                "cleared set-id bits the agent left on {}",
                terminal_safe(&sweep.setid_cleared.join(", "))
            ));
        }
        if !sweep.nested_git.is_empty() {
            p.warn(&format!(
                "the agent left repositories in the workspace ({}): their config runs commands in any git there. Remove them before you use git in {}",
                terminal_safe(&sweep.nested_git.join(", ")),
                repo.display()
            ));
        }
        match result {
            Ok(r) => r,
            Err(e) => {
                run.finish(failed_end(&run, &e));
                return Err(e.into());
            }
        }
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
    p.out(terminal_safe(&redactor.redact(&report.final_text)));
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

/// Text the agent wrote, for a terminal: control characters (escape
/// sequences that would move the cursor, rewrite the screen or set the
/// clipboard) are shown as `\u{…}`, newlines and tabs kept.
fn terminal_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// What keeps the agent from git: the repository's git dir read-only (also
/// where `.git` is a file naming a git dir inside the tree), its config seen
/// as a copy without credentials, and, in a directory that is no repository,
/// an empty read-only `.git` so that the agent cannot make one.
async fn git_mounts(
    git: Option<&belay_vcs::Git>,
    repo: &std::path::Path,
    out: &std::path::Path,
) -> Result<Vec<Mount>, Failure> {
    let in_container = |host: &std::path::Path| -> Option<String> {
        host.strip_prefix(repo)
            .ok()
            .map(|rel| format!("{WORKDIR}/{}", rel.display()))
    };
    let mut mounts = Vec::new();
    let Some(git) = git else {
        let empty = out.join("no-git");
        fs_err::create_dir_all(&empty)?;
        mounts.push(Mount {
            host: empty,
            container: format!("{WORKDIR}/.git"),
            read_only: true,
        });
        return Ok(mounts);
    };
    let dot_git = repo.join(".git");
    mounts.push(Mount {
        host: dot_git.clone(),
        container: format!("{WORKDIR}/.git"),
        read_only: true,
    });
    let git_dir = git.git_dir().to_path_buf();
    if git_dir != dot_git {
        if let Some(c) = in_container(&git_dir) {
            mounts.push(Mount {
                host: git_dir.clone(),
                container: c,
                read_only: true,
            });
        }
    }
    if git_dir.join("config").is_file() {
        if let Some(c) = in_container(&git_dir.join("config")) {
            let view = out.join("git-config.sandbox");
            git.write_sanitized_config(&view).await?;
            mounts.push(Mount {
                host: view,
                container: c,
                read_only: true,
            });
        }
    }
    Ok(mounts)
}
