//! `belay env plan|build|gc|shell`: the environment builder's commands.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use belay_env::build::{BaseSpec, BuildOptions};
use belay_env::plan::plan_rules;
use belay_env::preflight::RuntimeNotes;
use belay_sandbox::{ContainerRuntime, ContainerSpec, ExecObserver, ExecSpec, StreamKind};

use crate::cli::{BuildArgs, CommonBuildArgs, GcArgs, PlanArgs, ShellArgs};
use crate::context::{build_redactor, connect};
use crate::exit::{usage, Failure, EXIT_FAILED};
use crate::output::build::BuildView;
use crate::output::Printer;

pub async fn plan(p: &Printer, a: PlanArgs) -> Result<u8, Failure> {
    let setup = crate::commands::model::model_setup(&a.llm)?;
    let mut ctx = belay_env::analyze::analyze(&a.repo)?;
    let choice = belay_env::as_of::AsOfChoice::parse(&a.resolve_as_of)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| ctx.repo_path.join(".belay").join("plan"));
    check_plan_out(&ctx.repo_path, &out)?;
    let hooks = belay_record::no_hooks_dir();
    let python = belay_env::base_suite::choose(ctx.python.as_ref())
        .map(|c| c.python)
        .unwrap_or_default();
    if let Some(py) = ctx.python.as_mut() {
        py.resolve_as_of =
            belay_env::as_of::resolve(&ctx.repo_path, &hooks, &choice, &python).await;
    }
    if let Some(node) = ctx.node.as_mut() {
        belay_env::as_of::date_node(node, &ctx.repo_path, &hooks, &choice).await;
    }
    // The suite `env build` would base the project on (a planning error when none fits).
    let suite = belay_env::base_suite::choose(ctx.python.as_ref())?;
    let notes = RuntimeNotes::assumed_debian();
    let mut blocks = plan_rules(&ctx, &notes)?;
    for d in [out.join("blocks"), out.join("scripts")] {
        fs_err::create_dir_all(&d).map_err(|e| {
            usage(format!(
                "cannot create {}: {e}. Pass --out with a writable directory",
                d.display()
            ))
        })?;
    }
    let mut planner = "rules";
    if let Some((setup, _key)) = &setup {
        let client = setup
            .client(Some(out.join("llm-usage.json")))
            .map_err(|e| usage(e.to_string()))?;
        let mut said = Vec::new();
        match belay_env::llm::plan(&client, &ctx, &notes, &blocks, &mut |m| said.push(m)).await {
            Ok(b) => {
                blocks = b;
                planner = "llm";
            }
            Err(why) => {
                said.push(format!(
                    "the model planner failed ({why}); falling back to the rules planner"
                ));
                planner = "rules (llm fallback)";
            }
        }
        for m in said {
            p.note(&format!("plan: {m}"));
        }
    }
    ctx.runtime_notes = Some(notes);
    belay_record::write_json_atomic(&out.join("context.json"), &ctx)?;
    for b in &blocks {
        belay_record::write_json_atomic(&out.join("blocks").join(format!("{}.json", b.id)), b)?;
        belay_record::atomic_write(
            &out.join("scripts").join(format!("{}.sh", b.id)),
            b.script.as_bytes(),
        )?;
    }
    if a.json {
        let v = serde_json::json!({"out": out, "planner": planner, "base_suite": suite, "context": ctx, "blocks": blocks});
        p.json(&v);
        return Ok(0);
    }
    let langs: Vec<&str> = ctx.languages.iter().map(|l| l.as_str()).collect();
    p.out(format!(
        "repo: {} ({})",
        ctx.repo_name,
        if langs.is_empty() {
            "no language detected".to_string()
        } else {
            langs.join(", ")
        }
    ));
    if !ctx.test_frameworks.is_empty() {
        p.out(format!("tests: {}", ctx.test_frameworks.join(", ")));
    }
    p.out(format!(
        "base: {} (Python {}): {}",
        suite.image(),
        suite.python,
        suite.reason
    ));
    for w in &ctx.warnings {
        p.out(format!("warning: {w}"));
    }
    let under = blocks.iter().take_while(|b| b.before_workspace).count();
    for (i, b) in blocks.iter().enumerate() {
        if i == under {
            p.out("-- the repository is copied in here --".to_string());
        }
        p.out(format!(
            "{:<26} {:<28} validate: {}",
            b.id, b.title, b.validation_command
        ));
    }
    if under == blocks.len() {
        p.out("-- the repository is copied in here --".to_string());
    }
    p.out(format!("planner: {planner}"));
    p.out(format!("written to {}", out.display()));
    Ok(0)
}

/// `--out` (default `<repo>/.belay/plan`) inside the repository: never
/// through a link (or a file) the repository ships, as `.belay -> /host/dir`.
fn check_plan_out(repo: &Path, out: &Path) -> Result<(), belay_env::EnvError> {
    for d in [out.join("blocks"), out.join("scripts")] {
        belay_env::rundir::check_in_repo(repo, &d, "--out")?;
    }
    Ok(())
}

/// The state dir (default `<repo>/.belay`), before Docker is reached: never
/// through a link the repository ships (the build checks it again).
fn check_state_dir(repo: &Path, state_dir: Option<&Path>) -> Result<(), Failure> {
    let repo = fs_err::canonicalize(repo).map_err(|e| {
        usage(format!(
            "cannot resolve the repository {}: {e}. Pass --repo with the path of a project directory",
            repo.display()
        ))
    })?;
    let dir = belay_env::build::state_dir_for(&repo, state_dir);
    belay_env::rundir::check_in_repo(&repo, &dir, "--state-dir")?;
    Ok(())
}

pub async fn build(p: &Printer, a: BuildArgs) -> Result<u8, Failure> {
    if !a.repo.is_dir() {
        return Err(usage(format!(
            "repository {} does not exist or is not a directory. Pass --repo with the path of a project directory",
            a.repo.display()
        )));
    }
    if let Some(f) = &a.oracle_file {
        if !f.is_file() {
            return Err(usage(format!(
                "oracle file {} does not exist. Pass --oracle-file with an existing *.oracle.json",
                f.display()
            )));
        }
        belay_env::oracle::load(f)?;
    }
    if let Some(df) = &a.common.base_dockerfile {
        if !df.is_file() {
            return Err(usage(format!(
                "--base-dockerfile {} does not exist. Pass the path of a Dockerfile",
                df.display()
            )));
        }
    }
    if let Some(id) = &a.run_id {
        belay_record::run_id::validate(id)?;
    }
    check_state_dir(&a.repo, a.state_dir.as_deref())?;
    let rt = connect().await?;
    let mut opts = build_options(&a.repo, &a.common)?;
    opts.state_dir = a.state_dir.clone();
    opts.run_id = a.run_id.clone();
    opts.keep_container = a.keep_container;
    opts.oracle_file = a.oracle_file.clone();
    opts.resume_from = a.resume_from.clone();
    opts.start_at_block = a.start_at_block.clone();
    if a.viz.viz && opts.run_id.is_none() {
        // The live view opens this run: its id is chosen here.
        let name = fs_err::canonicalize(&a.repo)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "repo".into());
        opts.run_id = Some(belay_record::run_id::generate(&name));
    }
    let _viz = match &opts.run_id {
        Some(id) => crate::commands::ui::viz(p, &a.viz, id).await,
        None => None,
    };
    let view = BuildView::new(p, a.stream_logs);
    let outcome = belay_env::build::build(&rt, &opts, &view).await?;
    let m = &outcome.manifest;
    if a.json {
        p.json_line(&serde_json::json!({"ok": m.ok, "run_id": m.run_id, "final_image": m.final_image, "manifest": m.manifest_path, "error": m.error}));
    } else {
        p.out(format!("run:      {}", m.run_id));
        p.out(format!("manifest: {}", m.manifest_path.display()));
        p.out(format!("scripts:  {}", m.scripts_dir.display()));
        if let Some(img) = &m.final_image {
            p.out(format!("image:    {img}"));
        }
        if let Some(df) = &m.dockerfile_path {
            p.out(format!("dockerfile: {} (BuildKit)", df.display()));
        }
        if let Some(df) = &m.dockerfile_legacy_path {
            p.out(format!("            {} (legacy builder)", df.display()));
        }
        if m.ok {
            p.out(format!("shell:    belay env shell {}", m.run_id));
        } else if let Some(e) = &m.error {
            p.out(format!("error:    {e}"));
        }
    }
    Ok(if m.ok { 0 } else { EXIT_FAILED })
}

/// Build options from the flags `build` and `build-projects` share.
pub fn build_options(repo: &Path, c: &CommonBuildArgs) -> Result<BuildOptions, Failure> {
    let mut opts = BuildOptions::new(repo);
    opts.redactor = build_redactor();
    opts.stop = crate::context::stop_on_signals()?;
    if let Some((setup, key)) = crate::commands::model::model_setup(&c.llm)? {
        if let Some((name, k)) = key {
            opts.redactor.add(name, k.expose());
        }
        opts.llm = Some(setup);
    }
    opts.image_prefix = c.image_prefix.clone();
    if let Some(reg) = &c.registry {
        opts.use_registry(reg)?;
    }
    opts.pull_final = !c.no_pull_final;
    opts.resolve_as_of = belay_env::as_of::AsOfChoice::parse(&c.resolve_as_of)?;
    opts.base = match (&c.base_image, &c.base_dockerfile) {
        (Some(i), _) => BaseSpec::Image(i.clone()),
        (None, Some(d)) => BaseSpec::Dockerfile(d.clone()),
        (None, None) => BaseSpec::Default,
    };
    opts.command_timeout = Duration::from_secs(c.command_timeout);
    opts.docker_build_timeout = Duration::from_secs(c.docker_build_timeout);
    opts.oracle_timeout = Duration::from_secs(c.oracle_timeout);
    opts.network = c.network.into();
    opts.host_trust = !c.no_host_trust;
    opts.ablation = c.control.ablation;
    opts.max_repair_attempts = c.control.max_repair_attempts;
    opts.max_probe_failures = c.control.max_probe_failures;
    opts.cache = !c.control.no_cache;
    opts.package_cache = !c.control.no_package_cache;
    opts.force_clean_replay = c.control.force_clean_replay;
    opts.oracle_collect_only = c.control.oracle_collect_only;
    Ok(opts)
}

pub async fn gc(p: &Printer, a: GcArgs) -> Result<u8, Failure> {
    let rt = connect().await?;
    let opts = belay_env::gc::GcOptions {
        older_than: a.older_than,
        runs: a.runs,
        include_final: a.include_final,
        dry_run: a.dry_run,
    };
    let registry = a
        .registry
        .as_deref()
        .map(belay_sandbox::registry::parse_registry)
        .transpose()?;
    let r = belay_env::gc::gc(&rt, &opts).await?;
    let verb = if r.dry_run { "would remove" } else { "removed" };
    for t in &r.removed_images {
        p.out(format!("{verb} image {t}"));
    }
    for c in &r.removed_containers {
        p.out(format!("{verb} container {c}"));
    }
    for s in &r.skipped {
        p.out(format!("skipped {s}"));
    }
    p.out(format!(
        "{verb} {} image tag(s) and {} container(s); kept {} final image(s){}",
        r.removed_images.len(),
        r.removed_containers.len(),
        r.kept_final.len(),
        if r.kept_final.is_empty() {
            ""
        } else {
            " (--include-final removes them)"
        }
    ));
    if let Some(reg) = &registry {
        let r = belay_env::registry_store::gc::gc(reg, &opts).await?;
        for t in &r.removed_tags {
            p.out(format!("{verb} {t}"));
        }
        for s in &r.skipped {
            p.out(format!("skipped {s}"));
        }
        p.out(format!(
            "{verb} {} manifest(s) ({} tag(s)) from {reg}; kept {} final image(s); `docker-registry garbage-collect` frees their blobs",
            r.removed_manifests,
            r.removed_tags.len(),
            r.kept_final.len()
        ));
    }
    if a.package_caches {
        let dir = belay_env::rundir::machine_cache_dir(Path::new(".belay"));
        let (bytes, files) = if a.dry_run {
            belay_env::package_cache::usage(&dir)
        } else {
            belay_env::package_cache::clear(&dir)?
        };
        p.out(format!(
            "{verb} the package caches in {}: {files} file(s), {:.1} MiB",
            belay_env::package_cache::root(&dir).display(),
            bytes as f64 / (1024.0 * 1024.0)
        ));
    }
    Ok(0)
}

struct Passthrough<'a>(&'a Printer);

impl ExecObserver for Passthrough<'_> {
    fn output(&self, stream: StreamKind, bytes: &[u8]) {
        match stream {
            StreamKind::Stdout => self.0.raw(bytes),
            StreamKind::Stderr => self.0.raw_stderr(bytes),
        }
    }
}

pub async fn shell(p: &Printer, a: ShellArgs) -> Result<u8, Failure> {
    belay_record::run_id::validate(&a.run_id)?;
    let rt = connect().await?;
    let images = rt
        .list_images(&[format!("{}=true", belay_sandbox::labels::BELAY)])
        .await?;
    let image = images
        .iter()
        .flat_map(|i| i.tags.iter())
        .find(|t| t.ends_with(&format!(":{}-final", a.run_id)))
        .cloned()
        .ok_or_else(|| usage(format!(
            "run {} has no final image on this Docker engine (did its build succeed? `docker images --filter label=belay.run={}` lists its checkpoints)",
            a.run_id, a.run_id
        )))?;
    if a.command.is_empty() {
        if !std::io::stdin().is_terminal() {
            return Err(usage("an interactive shell needs a terminal; pass a command after `--` to run it instead"));
        }
        let status = std::process::Command::new("docker")
            .args(["run", "--rm", "-it", "--network", belay_sandbox::Network::from(a.network).as_docker(), "-w", belay_sandbox::layout::REPO, &image, "bash"])
            .status()
            .map_err(|e| usage(format!("cannot run the docker CLI for an interactive shell ({e}); install it, or pass a command after `--`")))?;
        return Ok(status
            .code()
            .map(|c| c.clamp(0, 255) as u8)
            .unwrap_or(EXIT_FAILED));
    }
    let spec = ContainerSpec {
        image: image.clone(),
        run_id: a.run_id.clone(),
        kind: "shell".into(),
        network: a.network.into(),
        env: vec![("HOME".into(), "/root".into())],
        working_dir: Some(belay_sandbox::layout::REPO.into()),
        ..Default::default()
    };
    let cid = rt.create(&spec).await?;
    let log = std::env::temp_dir().join(format!("belay-shell-{}.log", std::process::id()));
    let exec = ExecSpec {
        argv: a.command.clone(),
        working_dir: Some(belay_sandbox::layout::REPO.into()),
        env: vec![],
        timeout: None,
        log_path: log.clone(),
        log_limit: None,
    };
    let res = rt
        .exec(
            &cid,
            &exec,
            &belay_record::Redactor::default(),
            &Passthrough(p),
        )
        .await;
    let _ = rt.remove(&cid).await;
    let _ = fs_err::remove_file(&log);
    let out = res?;
    Ok(out.exit_code.clamp(0, 255) as u8)
}
