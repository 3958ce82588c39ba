//! `belay rounds`: the round supervisor of `belay_rounds`. Its exit codes
//! are the peer's (0, 1, 75, 76, 78, 130), which units and scripts key on.

mod control;
mod monitor;
mod observe;

use std::sync::Arc;

use belay_rounds::config::PlacementKind;
use belay_rounds::round::RoundOptions;
use belay_rounds::serve::ServeOptions;
use belay_rounds::trusted::Use;
use belay_rounds::{exit, Config, RoundsError, Supervisor};
use belay_sandbox::ContainerRuntime;

use crate::cli::{JsonArg, RoundArgs, RoundsArgs, RoundsCommand, RoundsInitArgs, ServeArgs};
use crate::exit::Failure;
use crate::output::rounds::RoundLines;
use crate::output::{EventView, Printer};

/// A rounds error with the peer's exit code.
pub(super) fn fail(e: RoundsError) -> Failure {
    Failure::with_code(e.exit_code(), e)
}

pub async fn rounds(p: &Printer, a: RoundsArgs) -> Result<u8, Failure> {
    let config = a.config;
    match a.command {
        RoundsCommand::Init(i) => init(p, i).await,
        RoundsCommand::Doctor(j) => doctor(p, &config, j.json).await,
        RoundsCommand::Trust(j) => trust(p, &config, &j),
        RoundsCommand::Round(r) => round(p, &config, r).await,
        RoundsCommand::Serve(s) => serve(p, &config, s).await,
        RoundsCommand::Status(j) => observe::status(p, &load(&config)?, j.json),
        RoundsCommand::Peek(k) => observe::peek(p, &load(&config)?, &k),
        RoundsCommand::Watch(w) => observe::watch(p, &load(&config)?, &w).await,
        RoundsCommand::Events(e) => observe::events(p, &load(&config)?, &e).await,
        RoundsCommand::Start(s) => control::start(p, &load(&config)?, &s).await,
        RoundsCommand::Stop(s) => control::stop(p, &load(&config)?, !s.no_wait).await,
        RoundsCommand::Kill(_) => control::kill(p, &load(&config)?).await,
        RoundsCommand::Restart(s) => {
            let cfg = load(&config)?;
            control::stop(p, &cfg, true).await?;
            control::start(p, &cfg, &s).await
        }
        RoundsCommand::Install(i) => control::install(p, &load(&config)?, &i).await,
        RoundsCommand::Uninstall(u) => control::uninstall(p, &load(&config)?, u.json).await,
        RoundsCommand::Monitor(m) => monitor::monitor(p, &load(&config)?, &m).await,
    }
}

/// The config for reading the project (status, stop, install, the
/// monitor): belay's trusted copy when a run recorded one, never a file an
/// agent may be writing.
pub(super) fn load(path: &std::path::Path) -> Result<Config, Failure> {
    belay_rounds::trusted::open(path, Use::Observe)
        .map(|g| g.cfg)
        .map_err(fail)
}

async fn init(p: &Printer, a: RoundsInitArgs) -> Result<u8, Failure> {
    let dir = std::env::current_dir().map_err(|e| {
        fail(RoundsError::Environment(format!(
            "no current directory: {e}"
        )))
    })?;
    let r = belay_rounds::init::scaffold(&dir, &a.preset, a.force, !a.no_commit)
        .await
        .map_err(fail)?;
    for f in &r.created {
        p.out(format!("wrote {}", f.display()));
    }
    if let Some(c) = &r.committed {
        p.out(format!("committed {}", &c[..c.len().min(12)]));
    }
    p.note("next: edit agent-runner.toml, then `belay rounds doctor` and `belay rounds round`");
    Ok(0)
}

/// The image of each agent that runs in a container is on the engine (a
/// start would refuse it otherwise); not permanent: `setup-host.sh --agents` builds it.
async fn agent_images(cfg: &Config) -> Vec<belay_rounds::battery::Check> {
    let mut images: Vec<&str> = std::iter::once(&cfg.agent)
        .chain(cfg.phases.iter().filter_map(|ph| ph.agent.as_ref()))
        .filter(|a| a.placement == PlacementKind::Container)
        .map(|a| a.image.as_str())
        .collect();
    images.sort();
    images.dedup();
    if images.is_empty() {
        return Vec::new();
    }
    let check = |ok: bool, reason: String, fix: &str| belay_rounds::battery::Check {
        name: "agent_image_present".into(),
        ok,
        reason,
        how_to_fix: fix.into(),
        permanent: false,
    };
    let rt =
        match crate::context::connect().await {
            Ok(rt) => rt,
            Err(e) => {
                return vec![check(
                false,
                format!("the agent runs in a container and Docker is not reachable: {:#}", e.error),
                "start Docker (./scripts/setup-host.sh), or set placement = \"host\" in [agent]",
            )]
            }
        };
    let mut out = Vec::new();
    for image in images {
        out.push(match rt.image_exists(image).await {
            Ok(true) => check(true, String::new(), ""),
            Ok(false) => check(
                false,
                format!("the agent image {image} is not on this Docker engine"),
                "run ./scripts/setup-host.sh --agents (it builds belay-agent:bookworm), or set [agent] image",
            ),
            Err(e) => check(false, format!("cannot inspect {image}: {e}"), "check the Docker engine"),
        });
    }
    out
}

async fn doctor(p: &Printer, config: &std::path::Path, json: bool) -> Result<u8, Failure> {
    let cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => {
            if json {
                p.json(&serde_json::json!({"ok": false, "checks": [{"name": "config_loaded", "ok": false, "reason": e.to_string(), "permanent": true}]}));
                return Ok(exit::CONFIG);
            }
            return Err(fail(e));
        }
    };
    let mut checks = belay_rounds::battery::run(&cfg);
    // What a start would refuse: a config changed since belay trusted it.
    match belay_rounds::trusted::pending_change(config) {
        Ok(None) => checks.push(belay_rounds::battery::Check {
            name: "config_trusted".into(),
            ok: true,
            reason: String::new(),
            how_to_fix: String::new(),
            permanent: false,
        }),
        Ok(Some(c)) => checks.push(belay_rounds::battery::Check {
            name: "config_trusted".into(),
            ok: false,
            reason: c.to_string(),
            how_to_fix: c.accept.clone(),
            permanent: true,
        }),
        Err(e) => return Err(fail(e)),
    }
    checks.extend(agent_images(&cfg).await);
    let code = belay_rounds::battery::exit_code(&checks).unwrap_or(exit::OK);
    if json {
        p.json(&serde_json::json!({"ok": code == 0, "checks": checks, "notes": cfg.notes}));
    } else {
        for c in &checks {
            if c.ok {
                p.out(format!("ok    {}", c.name));
            } else {
                p.out(format!(
                    "FAIL  {}: {} (fix: {})",
                    c.name, c.reason, c.how_to_fix
                ));
            }
        }
        for n in &cfg.notes {
            p.out(format!("note  {n}"));
        }
    }
    Ok(code)
}

/// The engine, when an agent runs in a container (not ready: 76).
async fn engine_for(cfg: &Config) -> Result<Option<Arc<dyn ContainerRuntime>>, Failure> {
    let needed = std::iter::once(&cfg.agent)
        .chain(cfg.phases.iter().filter_map(|ph| ph.agent.as_ref()))
        .any(|a| a.placement == PlacementKind::Container);
    if !needed {
        return Ok(None);
    }
    match belay_sandbox::DockerRuntime::connect().await {
        Ok(rt) => Ok(Some(Arc::new(rt))),
        Err(e) => Err(fail(RoundsError::Environment(format!(
            "the agent runs in a container and Docker is not reachable ({e}): start it (./scripts/setup-host.sh), or set placement = \"host\" in [agent]"
        )))),
    }
}

/// Each container agent's image: the one its config names (an image or an
/// env build's run id), else the work dir's latest env build when it has
/// git (round agents commit), else the agent image.
async fn resolve_images(
    p: &Printer,
    rt: Option<&dyn ContainerRuntime>,
    cfg: &mut Config,
) -> Result<(), Failure> {
    let work_dir = cfg.runtime.work_dir.clone();
    let agents = std::iter::once(&mut cfg.agent)
        .chain(cfg.phases.iter_mut().filter_map(|ph| ph.agent.as_mut()))
        .filter(|a| a.placement == PlacementKind::Container);
    for a in agents {
        let named = a.image_named.then(|| a.image.clone());
        a.image = crate::context::sandbox_image(
            p,
            rt,
            Some(&work_dir),
            named.as_deref(),
            belay_sandbox::bootstrap::AGENT_IMAGE,
            &["git"],
        )
        .await?;
    }
    Ok(())
}

/// The project opened to run rounds: recovery of a round a killed belay left
/// and the check of the config against its trusted copy come first.
/// `json`: the events as their envelopes on stdout instead of lines.
async fn open(p: &Printer, config: &std::path::Path, json: bool) -> Result<Supervisor, Failure> {
    let mut g = belay_rounds::trusted::open(config, Use::Run).map_err(fail)?;
    let rt = engine_for(&g.cfg).await?;
    resolve_images(p, rt.as_deref(), &mut g.cfg).await?;
    Supervisor::open(
        g.cfg,
        g.trust,
        rt,
        crate::context::build_redactor(),
        Arc::new(EventView::new(p, RoundLines::default(), json)),
    )
    .await
    .map_err(fail)
}

/// `trust`: accept the config and the prompt files as they are now.
fn trust(p: &Printer, config: &std::path::Path, a: &JsonArg) -> Result<u8, Failure> {
    let g = belay_rounds::trusted::open(config, Use::Accept).map_err(fail)?;
    if a.json {
        p.json(&serde_json::json!({"config": g.cfg.path, "notes": g.notes}));
    } else {
        for n in &g.notes {
            p.out(n);
        }
    }
    Ok(exit::OK)
}

async fn round(p: &Printer, config: &std::path::Path, a: RoundArgs) -> Result<u8, Failure> {
    // --json is the round's result on stdout; its events stay lines.
    let sup = open(p, config, false).await?;
    // One SIGTERM or SIGINT stops a lone round now (there is no loop to drain).
    let stop = crate::context::stop_on_signals()?;
    stop.handles_now();
    let now = stop.clone();
    tokio::spawn(async move {
        let why = now.wait().await;
        now.trip_now(why);
    });
    let r = sup
        .round(RoundOptions {
            phase: a.phase.as_deref(),
            kill: Some(stop),
        })
        .await;
    sup.close_env().await;
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            sup.end_run(
                belay_record::RunStatus::Failed,
                &format!("the round did not run: {e}"),
            );
            return Err(fail(e));
        }
    };
    sup.end_run(
        match r.outcome.exit_code() {
            0 => belay_record::RunStatus::Ok,
            130 => belay_record::RunStatus::Interrupted,
            _ => belay_record::RunStatus::Failed,
        },
        &format!("round {}: {}", r.round_num, r.outcome.as_str()),
    );
    if a.json {
        p.json(&r);
    } else {
        p.out(format!(
            "round {}{}: {}{} in {:.1} s; log {}",
            r.round_num,
            r.phase
                .as_deref()
                .map(|ph| format!(" [{ph}]"))
                .unwrap_or_default(),
            r.outcome.as_str(),
            r.exit_code
                .map(|c| format!(" (exit {c})"))
                .unwrap_or_default(),
            r.duration_s,
            r.log
        ));
        if let Some(s) = &r.stashed {
            p.out(format!("the tree was left dirty: stashed as {s}"));
        }
    }
    Ok(r.outcome.exit_code())
}

async fn serve(p: &Printer, config: &std::path::Path, a: ServeArgs) -> Result<u8, Failure> {
    let sup = open(p, config, a.json).await?;
    // The first signal ends the loop after the round, the second stops the
    // agent now, a third exits.
    let stops = crate::context::stop_on_signals()?;
    stops.handles_now();
    let end = sup
        .serve(
            ServeOptions {
                once: a.once,
                max_rounds: a.max_rounds,
                ignore_schedule: a.ignore_schedule,
                monitor: !a.no_monitor,
            },
            &stops,
        )
        .await
        .map_err(fail)?;
    p.note(&format!(
        "serve stopped after {} round(s): {}",
        end.rounds, end.reason
    ));
    Ok(end.exit_code)
}
