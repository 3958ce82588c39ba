//! `belay ui`, and the one-run dashboard of `--viz`.

use belay_record::Registry;

use crate::cli::{UiArgs, VizArgs};
use crate::context::build_redactor;
use crate::exit::{usage, Failure};
use crate::output::Printer;

fn options(a: &UiArgs) -> belay_ui::UiOptions {
    belay_ui::UiOptions {
        bind: a.bind,
        port: a.port,
        port_fallback: false,
        allow_remote: a.allow_remote,
        registry: Registry::default_location(),
        queues: a.queues.clone(),
        jobs_configs: a.jobs_configs.clone(),
        token: a.token.clone(),
        focus: None,
        redactor: build_redactor(),
    }
}

pub async fn ui(p: &Printer, a: UiArgs) -> Result<u8, Failure> {
    let server = belay_ui::serve(options(&a))
        .await
        .map_err(|e| usage(e.to_string()))?;
    let url = server.url();
    // The URL is the output: a script can read it from stdout.
    p.out(&url);
    p.note(&format!(
        "the dashboard of {} is at {url} (Ctrl-C stops it)",
        Registry::default_location().index().display()
    ));
    if a.open {
        let _ = std::process::Command::new("xdg-open")
            .arg(&url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
    let stop = crate::context::stop_on_signals()?;
    tokio::select! {
        _ = server.wait() => {}
        _ = stop.wait() => {}
    }
    Ok(0)
}

/// The dashboard of one run, while it runs (`--viz`); `None` without it.
pub async fn viz(p: &Printer, v: &VizArgs, run_id: &str) -> Option<belay_ui::Server> {
    if !v.viz {
        return None;
    }
    let o = belay_ui::UiOptions {
        bind: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        port: v.viz_port,
        port_fallback: true,
        allow_remote: false,
        registry: Registry::default_location(),
        queues: vec![],
        jobs_configs: vec![],
        token: None,
        focus: Some(run_id.to_string()),
        redactor: build_redactor(),
    };
    match belay_ui::serve(o).await {
        Ok(s) => {
            p.note(&format!("live view of run {run_id}: {}", s.url()));
            Some(s)
        }
        Err(e) => {
            p.note(&format!("no live view: {e}"));
            None
        }
    }
}
