//! Command glue: parse arguments into library calls and print results.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context};
use belay_env::build::{build, BaseSpec, BuildOptions};
use belay_env::plan::plan_rules;
use belay_env::preflight::RuntimeNotes;
use belay_sandbox::bootstrap::{self, DEFAULT_BASE_IMAGE};
use belay_sandbox::{
    ContainerRuntime, ContainerSpec, DockerRuntime, ExecObserver, ExecSpec, StreamKind,
};

use crate::cli::*;
use crate::progress::Printer;
use crate::{Failure, EXIT_FAILED, EXIT_INFRA, EXIT_USAGE};

pub async fn run(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Doctor(a) => doctor(a).await,
        Command::Image(ImageCommand::Bootstrap(a)) => image_bootstrap(a).await,
        Command::Env(EnvCommand::Plan(a)) => env_plan(a).await,
        Command::Env(EnvCommand::Build(a)) => env_build(*a).await,
        Command::Env(EnvCommand::Shell(a)) => env_shell(a).await,
        Command::Env(EnvCommand::BuildProjects(a)) => crate::batch::build_projects(*a).await,
        Command::Env(EnvCommand::Gc(a)) => env_gc(a).await,
        Command::Model(ModelCommand::Replay(a)) => crate::model_cmd::replay(a).await,
        Command::Agent(AgentCommand::Run(a)) => crate::agent_cmd::agent_run(*a).await,
        Command::Run(a) => crate::run_cmd::run(a).await,
        Command::Runs(c) => crate::runs_cmd::runs(c).await,
    }
}

pub(crate) fn usage(msg: impl Into<String>) -> Failure {
    Failure {
        code: EXIT_USAGE,
        error: anyhow!(msg.into()),
    }
}

/// The secrets an env build's records must not hold: proxy credentials and
/// the model keys of the environment.
pub(crate) fn build_redactor() -> belay_record::Redactor {
    let mut r = belay_record::Redactor::default();
    belay_sandbox::trust::HostTrust::detect().register_secrets(&mut r);
    for k in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "BELAY_LLM_API_KEY"] {
        if let Ok(v) = std::env::var(k) {
            r.add(k, v);
        }
    }
    r
}

pub(crate) async fn connect() -> Result<DockerRuntime, Failure> {
    DockerRuntime::connect().await.map_err(|e| Failure {
        code: EXIT_INFRA,
        error: e.into(),
    })
}

// ---------------------------------------------------------------- doctor

async fn doctor(a: DoctorArgs) -> Result<u8, Failure> {
    let mut failed = 0;
    let mut report = |ok: bool, what: &str, detail: String| {
        println!("{} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            failed += 1;
        }
    };
    match DockerRuntime::connect().await {
        Ok(rt) => {
            match rt.info().await {
                Ok(i) => report(
                    true,
                    "docker",
                    format!(
                        "Docker {} ({}), API {} (belay speaks {}), storage {}",
                        i.server_version,
                        i.os,
                        i.api_version,
                        i.negotiated_api_version,
                        i.storage_driver
                    ),
                ),
                Err(e) => report(false, "docker", e.to_string()),
            }
            match rt.image_exists(&a.base_image).await {
                Ok(true) => report(true, "base image", format!("{} is present", a.base_image)),
                Ok(false) => {
                    report(
                        false,
                        "base image",
                        if a.base_image == DEFAULT_BASE_IMAGE {
                            format!(
                                "{} is missing. Build it offline with `belay image bootstrap`",
                                a.base_image
                            )
                        } else {
                            format!("{} is missing. Build or load it (`docker images` lists what is there)", a.base_image)
                        },
                    )
                }
                Err(e) => report(false, "base image", e.to_string()),
            }
        }
        Err(e) => {
            report(false, "docker", e.to_string());
            report(
                false,
                "base image",
                "not checked: the Docker daemon is not reachable".into(),
            );
        }
    }
    match std::process::Command::new("git").arg("--version").output() {
        Ok(o) if o.status.success() => report(
            true,
            "git",
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        ),
        _ => report(
            false,
            "git",
            "git is not on PATH. Install it (`apt-get install -y git`)".into(),
        ),
    }
    for (what, path) in [
        ("disk (state dir)", a.state_dir.clone()),
        ("disk (docker)", PathBuf::from("/var/lib/docker")),
    ] {
        if !path.exists() {
            continue;
        }
        match free_bytes(&path) {
            Some(free) => {
                let gib = free as f64 / (1u64 << 30) as f64;
                if gib < 2.0 {
                    report(false, what, format!("only {gib:.1} GiB free under {}. Free at least 2 GiB (`docker system prune`, `belay env gc`)", path.display()));
                } else {
                    report(
                        true,
                        what,
                        format!("{gib:.1} GiB free under {}", path.display()),
                    );
                }
            }
            None => report(
                false,
                what,
                format!("cannot read free space of {}", path.display()),
            ),
        }
    }
    Ok(if failed == 0 { 0 } else { EXIT_FAILED })
}

fn free_bytes(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

// ---------------------------------------------------------------- image

async fn image_bootstrap(a: BootstrapArgs) -> Result<u8, Failure> {
    let tag = a
        .tag
        .clone()
        .unwrap_or_else(|| format!("belay-base:{}", a.suite));
    let rt = connect().await?;
    if !a.force && rt.image_exists(&tag).await? {
        println!("{tag} already exists (use --force to rebuild)");
        return Ok(0);
    }
    let sources = bootstrap::host_sources(Path::new("/"), &a.suite);
    let mirror = match a.mirror.clone().or_else(|| bootstrap::mirror_for(&sources, &a.suite)) {
        Some(m) => m,
        None => {
            return Err(usage(format!(
                "no apt source for suite {} in /etc/apt/sources.list or /etc/apt/sources.list.d; pass --mirror URL",
                a.suite
            )))
        }
    };
    let work = std::env::temp_dir().join(format!("belay-bootstrap-{}", std::process::id()));
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let log = work.join("debootstrap.log");
    eprintln!(
        "[belay] debootstrap {} from {mirror} (log: {})",
        a.suite,
        log.display()
    );
    let result = async {
        bootstrap::debootstrap(&a.suite, &rootfs, &mirror, &log).await?;
        let list = if sources.is_empty() {
            vec![bootstrap::AptSource {
                uri: mirror.clone(),
                suites: vec![a.suite.clone()],
                components: vec!["main".into()],
                signed_by: None,
            }]
        } else {
            sources.clone()
        };
        let text = bootstrap::render_sources(&list, &rootfs);
        let apt = rootfs.join("etc/apt");
        std::fs::create_dir_all(apt.join("sources.list.d"))
            .with_context(|| format!("cannot create {}", apt.display()))?;
        let _ = std::fs::remove_file(apt.join("sources.list"));
        std::fs::write(apt.join("sources.list.d/belay.sources"), text).with_context(|| {
            format!(
                "cannot write {}",
                apt.join("sources.list.d/belay.sources").display()
            )
        })?;
        eprintln!("[belay] importing {tag}");
        let changes = vec![
            "LABEL belay=true".to_string(),
            "LABEL belay.kind=base".to_string(),
            format!("LABEL belay.suite={}", a.suite),
            "ENV LANG=C.UTF-8".to_string(),
            "CMD [\"bash\"]".to_string(),
        ];
        let id = rt.import_rootfs(&rootfs, &tag, changes).await?;
        anyhow::Ok(id)
    }
    .await;
    let _ = std::fs::remove_dir_all(&rootfs);
    let id = result?;
    let _ = std::fs::remove_dir_all(&work);
    println!("{tag} {id}");
    Ok(0)
}

// ---------------------------------------------------------------- env plan

async fn env_plan(a: PlanArgs) -> Result<u8, Failure> {
    let setup = crate::model_cmd::model_setup(&a.llm)?;
    let mut ctx = belay_env::analyze::analyze(&a.repo)?;
    let notes = RuntimeNotes::assumed_debian();
    let mut blocks = plan_rules(&ctx, &notes)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| ctx.repo_path.join(".belay").join("plan"));
    for d in [out.join("blocks"), out.join("scripts")] {
        std::fs::create_dir_all(&d).map_err(|e| {
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
            eprintln!("[belay] plan: {m}");
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
        let v =
            serde_json::json!({"out": out, "planner": planner, "context": ctx, "blocks": blocks});
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let langs: Vec<&str> = ctx.languages.iter().map(|l| l.as_str()).collect();
    println!(
        "repo: {} ({})",
        ctx.repo_name,
        if langs.is_empty() {
            "no language detected".to_string()
        } else {
            langs.join(", ")
        }
    );
    if !ctx.test_frameworks.is_empty() {
        println!("tests: {}", ctx.test_frameworks.join(", "));
    }
    for w in &ctx.warnings {
        println!("warning: {w}");
    }
    for b in &blocks {
        println!(
            "{:<26} {:<28} validate: {}",
            b.id, b.title, b.validation_command
        );
    }
    println!("planner: {planner}");
    println!("written to {}", out.display());
    Ok(0)
}

// ---------------------------------------------------------------- env build

async fn env_build(a: BuildArgs) -> Result<u8, Failure> {
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
    let rt = connect().await?;
    let mut opts = build_options(&a.repo, &a.common)?;
    opts.state_dir = a.state_dir.clone();
    opts.run_id = a.run_id.clone();
    opts.keep_container = a.keep_container;
    opts.oracle_file = a.oracle_file.clone();
    opts.resume_from = a.resume_from.clone();
    opts.start_at_block = a.start_at_block.clone();
    let printer = Printer::new(a.stream_logs);
    let recorder = belay_env::progress::Recorder::new(&printer, build_redactor());
    let outcome = build(&rt, &opts, &recorder).await?;
    let m = &outcome.manifest;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"ok": m.ok, "run_id": m.run_id, "final_image": m.final_image, "manifest": m.manifest_path, "error": m.error})
        );
    } else {
        println!("run:      {}", m.run_id);
        println!("manifest: {}", m.manifest_path.display());
        println!("scripts:  {}", m.scripts_dir.display());
        if let Some(img) = &m.final_image {
            println!("image:    {img}");
        }
        if let Some(df) = &m.dockerfile_path {
            println!("dockerfile: {}", df.display());
        }
        if m.ok {
            println!("shell:    belay env shell {}", m.run_id);
        } else if let Some(e) = &m.error {
            println!("error:    {e}");
        }
    }
    Ok(if m.ok { 0 } else { EXIT_FAILED })
}

/// Build options from the flags `build` and `build-projects` share.
pub(crate) fn build_options(repo: &Path, c: &CommonBuildArgs) -> Result<BuildOptions, Failure> {
    let mut opts = BuildOptions::new(repo);
    if let Some((setup, key)) = crate::model_cmd::model_setup(&c.llm)? {
        if let Some((name, k)) = key {
            opts.redactor.add(name, k.expose());
        }
        opts.llm = Some(setup);
    }
    opts.image_prefix = c.image_prefix.clone();
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
    opts.force_clean_replay = c.control.force_clean_replay;
    opts.oracle_collect_only = c.control.oracle_collect_only;
    Ok(opts)
}

// ---------------------------------------------------------------- env gc

async fn env_gc(a: GcArgs) -> Result<u8, Failure> {
    let rt = connect().await?;
    let opts = belay_env::gc::GcOptions {
        older_than: a.older_than,
        runs: a.runs,
        include_final: a.include_final,
        dry_run: a.dry_run,
    };
    let r = belay_env::gc::gc(&rt, &opts).await?;
    let verb = if r.dry_run { "would remove" } else { "removed" };
    for t in &r.removed_images {
        println!("{verb} image {t}");
    }
    for c in &r.removed_containers {
        println!("{verb} container {c}");
    }
    for s in &r.skipped {
        println!("skipped {s}");
    }
    println!(
        "{verb} {} image tag(s) and {} container(s); kept {} final image(s){}",
        r.removed_images.len(),
        r.removed_containers.len(),
        r.kept_final.len(),
        if r.kept_final.is_empty() {
            ""
        } else {
            " (--include-final removes them)"
        }
    );
    Ok(0)
}

// ---------------------------------------------------------------- env shell

struct Passthrough;

impl ExecObserver for Passthrough {
    fn output(&self, stream: StreamKind, bytes: &[u8]) {
        use std::io::Write;
        let _ = match stream {
            StreamKind::Stdout => std::io::stdout().write_all(bytes),
            StreamKind::Stderr => std::io::stderr().write_all(bytes),
        };
    }
}

async fn env_shell(a: ShellArgs) -> Result<u8, Failure> {
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
            .args(["run", "--rm", "-it", "--network", belay_sandbox::Network::from(a.network).as_docker(), "-w", "/workspace/repo", &image, "bash"])
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
        working_dir: Some("/workspace/repo".into()),
        ..Default::default()
    };
    let cid = rt.create(&spec).await?;
    let log = std::env::temp_dir().join(format!("belay-shell-{}.log", std::process::id()));
    let exec = ExecSpec {
        argv: a.command.clone(),
        working_dir: Some("/workspace/repo".into()),
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
            &Passthrough,
        )
        .await;
    let _ = rt.remove(&cid).await;
    let _ = std::fs::remove_file(&log);
    let out = res?;
    Ok(out.exit_code.clamp(0, 255) as u8)
}
