//! belay: the binary. clap types live in `cli`, rendering in `progress`;
//! behaviour is in the library crates.

mod agent_cmd;
mod batch;
mod cli;
mod commands;
mod model_cmd;
mod progress;
mod run_cmd;
mod runs_cmd;

use std::process::ExitCode;

use clap::Parser;

/// Exit codes (documented in `belay --help`).
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_INFRA: u8 = 3;

/// An error with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        let error = e.into();
        let code = classify(&error);
        Failure { code, error }
    }
}

fn classify(e: &anyhow::Error) -> u8 {
    if let Some(env) = e.downcast_ref::<belay_env::EnvError>() {
        if env.is_infra() {
            return EXIT_INFRA;
        }
        if env.is_usage() {
            return EXIT_USAGE;
        }
        return EXIT_FAILED;
    }
    if let Some(s) = e.downcast_ref::<belay_sandbox::SandboxError>() {
        if s.is_infra() {
            return EXIT_INFRA;
        }
        if matches!(s, belay_sandbox::SandboxError::ImageMissing { .. }) {
            return EXIT_USAGE;
        }
    }
    if let Some(p) = e.downcast_ref::<belay_pipeline::PipelineError>() {
        if let belay_pipeline::PipelineError::Sandbox(s) = p {
            if s.is_infra() {
                return EXIT_INFRA;
            }
        }
        return if p.is_config() {
            EXIT_USAGE
        } else {
            EXIT_FAILED
        };
    }
    if e.downcast_ref::<belay_pipeline::LoadError>().is_some() {
        return EXIT_USAGE;
    }
    if let Some(a) = e.downcast_ref::<belay_agent::AgentError>() {
        if matches!(
            a,
            belay_agent::AgentError::Spawn { .. } | belay_agent::AgentError::Config(_)
        ) {
            return EXIT_USAGE;
        }
    }
    if e.downcast_ref::<belay_record::RecordError>().is_some() {
        return EXIT_USAGE;
    }
    EXIT_FAILED
}

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "belay: internal error (this is a bug in belay, please report it): {info}\n\
             Run state is written atomically; rerunning the same command resumes where it stopped."
        );
    }));
    let cli = cli::Cli::parse();
    let filter = match cli.verbose {
        0 => "warn",
        1 => "info,bollard=warn",
        _ => "debug,hyper=info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BELAY_LOG")
                .unwrap_or_else(|_| filter.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("belay: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    match rt.block_on(commands::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("belay: error: {:#}", f.error);
            ExitCode::from(f.code)
        }
    }
}
