//! `belay plan`: init, validate, status, run, reset: the checkpoint plan
//! loop of `belay_plan`, over the shared agent, sandbox and git services.

use std::path::Path;
use std::sync::Arc;

use belay_plan::engine::{self, RunOptions};
use belay_plan::schema;
use belay_plan::state::Outcome;
use belay_record::Redactor;
use belay_sandbox::ContainerRuntime;

use crate::cli::{
    EndpointArgs, PlanCommand, PlanFileArgs, PlanInitArgs, PlanResetArgs, PlanRunArgs,
    PlanStatusArgs,
};
use crate::context::connect;
use crate::exit::{usage, Failure, EXIT_FAILED};
use crate::output::plan::PlanLines;
use crate::output::{EventView, Printer};

pub async fn plan(p: &Printer, c: PlanCommand) -> Result<u8, Failure> {
    match c {
        PlanCommand::Init(a) => init(p, *a).await,
        PlanCommand::Validate(a) => validate(p, a),
        PlanCommand::Status(a) => status(p, a).await,
        PlanCommand::Run(a) => run(p, *a).await,
        PlanCommand::Reset(a) => reset(p, a).await,
    }
}

/// The agents' endpoint, its key (a secret for the redactor) and prices.
struct Model {
    endpoint: Option<belay_agent::cli::Endpoint>,
    prices: belay_model::PriceTable,
    redactor: Redactor,
}

/// `native`: the dialect of the agent the endpoint is for (when `--llm-api`
/// is not given).
fn model(a: &EndpointArgs, native: Option<belay_model::Api>) -> Result<Model, Failure> {
    let mut redactor = crate::context::build_redactor();
    let Some((setup, key)) = crate::commands::model::resolve_endpoint(a, None, false, native)?
    else {
        return Ok(Model {
            endpoint: None,
            prices: belay_model::PriceTable::builtin(),
            redactor,
        });
    };
    let choice = (setup, key);
    let e = crate::commands::model::agent_endpoint(&choice);
    let setup = choice.0;
    e.add_secrets(&mut redactor);
    Ok(Model {
        endpoint: Some(e.into()),
        prices: setup.prices,
        redactor,
    })
}

/// The engine, when one is needed (agents in containers, or the gate).
async fn engine_if(needed: bool) -> Result<Option<Arc<dyn ContainerRuntime>>, Failure> {
    if !needed {
        return Ok(None);
    }
    Ok(Some(Arc::new(connect().await?)))
}

fn validate(p: &Printer, a: PlanFileArgs) -> Result<u8, Failure> {
    let plan = schema::load(&a.state)?;
    p.out(format!(
        "OK: {} ({} checkpoints, branch {})",
        a.state.display(),
        plan.checkpoints.len(),
        plan.branch
    ));
    for c in &plan.checkpoints {
        p.out(format!(
            "  {:<12} {:<9} attempts={} {}",
            c.id,
            c.status.as_str(),
            c.attempts,
            c.name
        ));
    }
    Ok(0)
}

async fn status(p: &Printer, a: PlanStatusArgs) -> Result<u8, Failure> {
    let plan = schema::load(&a.file.state)?;
    // The unfinished run's state is the truth where there is one.
    let run = match engine::plan_key(&a.file.state).await {
        Ok((_, loc)) => engine::current_run(&loc)?,
        Err(_) => None,
    };
    let rows: Vec<serde_json::Value> = plan
        .checkpoints
        .iter()
        .map(|c| {
            let s = run.as_ref().and_then(|r| r.get(&c.id));
            serde_json::json!({
                "id": c.id,
                "name": c.name,
                "status": s.map(|s| s.stage.status()).unwrap_or(c.status),
                "attempts": s.map(|s| s.attempts).unwrap_or(c.attempts),
                "failed_builds": s.map(|s| s.failed_builds).unwrap_or(0),
                "decided_by": s.and_then(|s| s.decided.as_ref()).map(|d| d.by.clone()),
            })
        })
        .collect();
    if a.json {
        p.json(&serde_json::json!({
            "plan": a.file.state,
            "plan_file": plan.plan_file,
            "branch": run.as_ref().map(|r| r.branch.clone()).unwrap_or(plan.branch.clone()),
            "run_id": run.as_ref().map(|r| r.run_id.clone()),
            "outcome": run.as_ref().and_then(|r| r.outcome),
            "checkpoints": rows,
        }));
        return Ok(0);
    }
    p.out(format!(
        "branch: {}",
        run.as_ref()
            .map(|r| r.branch.as_str())
            .unwrap_or(&plan.branch)
    ));
    p.out(format!("plan:   {}", plan.plan_file));
    if let Some(r) = &run {
        p.out(format!(
            "run:    {} ({})",
            r.run_id,
            r.outcome
                .map(|o| format!("{o:?}").to_lowercase())
                .unwrap_or_else(|| "unfinished".into())
        ));
    }
    for r in rows {
        p.out(format!(
            "  {:<12} {:<9} attempts={} failed_builds={} {}",
            r["id"].as_str().unwrap_or_default(),
            r["status"].as_str().unwrap_or_default(),
            r["attempts"],
            r["failed_builds"],
            r["name"].as_str().unwrap_or_default()
        ));
    }
    Ok(0)
}

async fn reset(p: &Printer, a: PlanResetArgs) -> Result<u8, Failure> {
    let done = engine::reset(&a.file.state, &a.ids).await?;
    p.out(format!(
        "reset the attempts of {}: the next `belay plan run` goes on with them",
        done.join(", ")
    ));
    Ok(0)
}

/// The largest `--feature-file`.
const MAX_FEATURE_FILE: u64 = 1 << 20;

/// `--feature-file`: read like any file an agent could have written (it may
/// be in the work tree): no link followed (at any level under the current
/// directory, the last name elsewhere), a regular file only, non-blocking,
/// at most 1 MiB.
fn feature_file(file: &Path) -> Result<String, Failure> {
    let cwd = std::env::current_dir()?;
    let abs = schema::lexical(&cwd.join(file));
    let bytes = belay_sandbox::hostfs::read_under(&cwd, &abs, MAX_FEATURE_FILE + 1)
        .map_err(|e| usage(format!("--feature-file: {e}")))?
        .ok_or_else(|| usage(format!("--feature-file: {} does not exist", file.display())))?;
    if bytes.len() as u64 > MAX_FEATURE_FILE {
        return Err(usage(format!(
            "--feature-file: {} is more than 1 MiB",
            file.display()
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        usage(format!(
            "--feature-file: {} is not UTF-8 text: {e}",
            file.display()
        ))
    })
}

async fn init(p: &Printer, a: PlanInitArgs) -> Result<u8, Failure> {
    let (feature, default_doc, slug_from) = match (&a.feature, &a.feature_file) {
        (Some(f), None) => (
            f.clone(),
            belay_plan::init::DEFAULT_PLAN_DOC.to_string(),
            f.clone(),
        ),
        (None, Some(file)) => {
            let text = feature_file(file)?;
            let stem = file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            (text, file.display().to_string(), stem)
        }
        _ => return Err(usage("give the feature as text, or --feature-file")),
    };
    if feature.trim().is_empty() {
        return Err(usage("the feature description is empty"));
    }
    let branch = a
        .branch
        .clone()
        .unwrap_or_else(|| belay_plan::init::default_branch(&slug_from));
    // Refused before any agent is called.
    if let Some(why) = schema::branch_problem(&branch) {
        return Err(usage(why));
    }
    if a.file.state.exists() && !a.force {
        return Err(usage(format!(
            "{} already exists: pass --force to replace it",
            a.file.state.display()
        )));
    }
    let plan_doc = a.plan_file.clone().unwrap_or(default_doc);
    let dir = std::path::absolute(&a.file.state)?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| ".".into());
    let git = belay_vcs::Git::open(&dir, &belay_record::no_hooks_dir())
        .await
        .map_err(|e| usage(format!("{} is not in a git work tree: {e}", dir.display())))?;
    let m = model(&a.model, a.agent.kind.native_dialect())?;
    if let Some(e) = &m.endpoint {
        a.agent
            .check_dialect("planner", e.api, &e.base_url, |api| {
                format!("give its dialect with --llm-api {api}")
            })
            .map_err(belay_agent::AgentError::from)?;
    }
    let rt = engine_if(!a.on_host).await?;
    let image = crate::context::sandbox_image(
        p,
        rt.as_deref(),
        Some(git.root()),
        a.image.as_deref(),
        belay_sandbox::bootstrap::DEFAULT_BASE_IMAGE,
        &[],
    )
    .await?;
    let run_id = belay_record::run_id::generate("plan-init");
    let records = belay_record::state_home().join("plan/init").join(&run_id);
    let warn = |m: &str| p.warn(m);
    let runner = belay_agent::runner::Runner {
        rt,
        image: &image,
        on_host: a.on_host,
        auto_approve: false,
        endpoint: m.endpoint.as_ref(),
        client: None,
        prices: &m.prices,
        redactor: &m.redactor,
        run_id: &run_id,
        workdir: git.root(),
        git: Some(&git),
        records: records.join("box"),
        warn: &warn,
        extras: Default::default(),
        agent_env: vec![],
        boxes: None,
        warm: false,
    };
    p.note(&format!("asking {} for a plan of {}", a.agent, branch));
    let plan = belay_plan::generate::generate(belay_plan::generate::Generate {
        runner: &runner,
        spec: &a.agent,
        feature: &feature,
        plan_file: &plan_doc,
        branch: &branch,
        timeout: a.timeout,
        logs: records.join("logs"),
    })
    .await?;
    let mut plan = plan;
    // The gate: the project's own commands, from the env builder's analysis.
    let commands = belay_env::analyze::analyze(git.root())
        .map(|ctx| belay_env::analyze::commands::project_commands(&ctx))
        .unwrap_or_default();
    if !commands.is_empty() && plan.get("project").is_none() {
        plan["project"] = serde_json::to_value(&commands).unwrap_or_default();
        for (k, v) in [
            ("build", &commands.build_cmd),
            ("test", &commands.test_cmd),
            ("lint", &commands.lint_cmd),
        ] {
            if let Some(v) = v {
                p.note(&format!("gate {k} command from the repository: {v}"));
            }
        }
    }
    belay_plan::init::write(&a.file.state, &plan, a.force)?;
    // The document the plan names, when belay chose its name: it exists.
    let doc = dir.join(&plan_doc);
    let wrote_doc =
        a.plan_file.is_none() && a.feature.is_some() && fs_err::symlink_metadata(&doc).is_err();
    if wrote_doc {
        // Never through a link on the way (a repository may ship one).
        belay_sandbox::hostfs::write(
            &dir,
            &plan_doc,
            belay_plan::init::plan_doc(&feature, &plan).as_bytes(),
        )?;
    }
    // belay wrote it: its trusted copy, so that a resumed run takes it.
    if let Err(e) = engine::trust_plan(&a.file.state).await {
        p.note(&format!(
            "{} is written, but belay could not record it as trusted ({e}): an unfinished run of it will ask for --accept-plan",
            a.file.state.display()
        ));
    }
    let n = plan["checkpoints"].as_array().map(Vec::len).unwrap_or(0);
    if wrote_doc {
        p.out(format!(
            "wrote {} ({n} checkpoints, branch {branch}) and {plan_doc}; next: git add {plan_doc} && git commit -m 'the plan', then belay plan run --developer … --reviewer …",
            a.file.state.display()
        ));
    } else {
        p.out(format!(
            "wrote {} ({n} checkpoints, branch {branch}); next: belay plan validate && belay plan run --developer … --reviewer …",
            a.file.state.display()
        ));
    }
    Ok(0)
}

async fn run(p: &Printer, a: PlanRunArgs) -> Result<u8, Failure> {
    let (developer, reviewer) = a.roles.resolve(&a.model);
    let m = model(&developer, a.developer.kind.native_dialect())?;
    let r = model(&reviewer, a.reviewer.kind.native_dialect())?;
    let mut redactor = m.redactor;
    redactor.extend_from(&r.redactor);
    for name in &a.secret_env {
        match std::env::var(name) {
            Ok(v) if !v.is_empty() => redactor.add(name.clone(), v),
            _ => {
                return Err(usage(format!(
                    "--secret-env {name}: the variable is not set"
                )))
            }
        }
    }
    let plan = schema::load(&a.file.state)?;
    let gate = plan
        .checkpoints
        .iter()
        .any(|c| !plan.commands_for(&c.id).list().is_empty());
    let rt = engine_if(!a.on_host || gate).await?;
    // The plan file's directory (`Path::parent` of a bare name is "").
    let dir = a
        .file
        .state
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let image = crate::context::sandbox_image(
        p,
        rt.as_deref(),
        Some(dir),
        a.image.as_deref(),
        belay_sandbox::bootstrap::DEFAULT_BASE_IMAGE,
        &[],
    )
    .await?;
    let json = a.json;
    let o = RunOptions {
        plan: a.file.state.clone(),
        developer: a.developer,
        reviewer: a.reviewer,
        developer_model: a.developer_model,
        reviewer_model: a.reviewer_model,
        max_review_attempts: a.max_review_attempts,
        timeout: a.timeout,
        idle: Some(a.idle),
        max_turns: a.max_turns,
        max_cost_usd: a.max_cost,
        audit: a.audit_level,
        on_host: a.on_host,
        auto_approve: a.auto_approve,
        accept_plan: a.accept_plan,
        image,
        developer_endpoint: m.endpoint,
        reviewer_endpoint: r.endpoint,
        client: None,
        prices: m.prices,
        gate_timeout: a.gate_timeout,
        redactor,
        registry: belay_record::Registry::default_location(),
        rt,
        observer: Arc::new(EventView::new(p, PlanLines::default(), json)),
        stop: crate::context::stop_on_signals()?,
    };
    let report = engine::run(&o).await?;
    // With --json, stdout is the run's events: `run_outcome` is the result.
    let out = |text: String| {
        if !json {
            p.out(text);
        }
    };
    p.note(&format!(
        "run {}: {} agent call(s), ${:.4}; events in {}",
        report.run_id,
        report.agent_calls,
        report.cost_usd,
        report.run_dir.join("events.jsonl").display()
    ));
    match report.outcome {
        Outcome::Completed => {
            out(format!(
                "completed: every checkpoint approved on {} (not merged)",
                report.branch
            ));
            Ok(0)
        }
        Outcome::Halted | Outcome::Failed => {
            out(format!(
                "{}: {}",
                if report.outcome == Outcome::Halted {
                    "halted"
                } else {
                    "failed"
                },
                report.reason.unwrap_or_default()
            ));
            Ok(EXIT_FAILED)
        }
    }
}
