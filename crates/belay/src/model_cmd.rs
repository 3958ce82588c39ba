//! `belay model …`: the scripted model server.

use std::io::Write;

use anyhow::Context;
use belay_model::replay::{self, ReplayServer};

use crate::cli::ReplayArgs;
use crate::commands::usage;
use crate::Failure;

pub async fn replay(a: ReplayArgs) -> Result<u8, Failure> {
    let script = replay::load_script(&a.script).map_err(|e| usage(e.to_string()))?;
    let log = a.log.clone().unwrap_or_else(|| {
        let mut p = a.script.clone().into_os_string();
        p.push(".requests.jsonl");
        p.into()
    });
    let turns = script.turns.len();
    let server = ReplayServer::start(
        script,
        std::net::SocketAddr::new(a.host, a.port),
        Some(log.clone()),
    )
    .await
    .map_err(|e| usage(e.to_string()))?;
    // The first line is the address, for scripts and tests to read.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "belay replay: listening on {} ({turns} turns; requests appended to {})",
        server.url(),
        log.display()
    )
    .context("cannot write to stdout")?;
    writeln!(
        out,
        "  OpenAI base URL: {}   Anthropic base URL: {}",
        server.openai_base(),
        server.url()
    )
    .context("cannot write to stdout")?;
    out.flush().context("cannot write to stdout")?;
    drop(out);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch for SIGTERM")?;
    tokio::select! {
        _ = server.wait() => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(0)
}
