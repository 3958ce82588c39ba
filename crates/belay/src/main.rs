//! belay: the binary. clap types live in `cli`, one module per command in
//! `commands`, all output in `output`, exit codes in `exit`;
//! behaviour is in the library crates.

mod cli;
mod commands;
mod context;
mod exit;
#[cfg(test)]
mod lint_tests;
mod output;

use std::process::ExitCode;

use clap::Parser;

use crate::exit::EXIT_FAILED;

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "belay: internal error (this is a bug in belay, please report it): {info}\n\
             Run state is written atomically; rerunning the same command resumes where it stopped."
        );
    }));
    // belay launching a tied agent (see belay_agent::lifeline): become it.
    let mut raw = std::env::args_os();
    if raw
        .nth(1)
        .is_some_and(|a| a == belay_agent::lifeline::EXEC_ARG)
    {
        let rest: Option<Vec<String>> = raw.map(|a| a.into_string().ok()).collect();
        let why = match rest {
            Some(rest) => belay_agent::lifeline::exec_tied(&rest),
            None => "an argument is not UTF-8".to_string(),
        };
        eprintln!("belay: {why}");
        return ExitCode::from(127);
    }
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
        // Colours only on a terminal: stderr redirected to a log file (a
        // systemd unit, `belay jobs work 2> log`) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
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
    let printer = output::Printer::new(cli.quiet);
    match rt.block_on(commands::run(cli, &printer)) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            printer.error_coded(f.error_code(), &f.error);
            ExitCode::from(f.code)
        }
    }
}
