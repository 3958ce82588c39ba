//! `belay runs`: every run of every mode, from the one registry.

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use belay_record::{Registry, RunEntry, RunStatus};
use belay_sandbox::ContainerRuntime;

use crate::cli::{RunsCommand, RunsEventsArgs, RunsGcArgs, RunsListArgs, RunsShowArgs};
use crate::context::connect;
use crate::exit::{io, usage, Failure};
use crate::output::Printer;

pub async fn runs(p: &Printer, c: RunsCommand) -> Result<u8, Failure> {
    let reg = Registry::default_location();
    match c {
        RunsCommand::List(a) => list(p, &reg, a),
        RunsCommand::Show(a) => show(p, &reg, a),
        RunsCommand::Events(a) => events(p, &reg, a).await,
        RunsCommand::Gc(a) => gc(p, &reg, a).await,
    }
}

fn find(reg: &Registry, id: &str) -> Result<RunEntry, Failure> {
    reg.find(id)?.ok_or_else(|| {
        usage(format!(
            "no run {id} in the registry ({}); `belay runs list` shows them",
            reg.index().display()
        ))
    })
}

fn duration(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 60.0 => format!("{s:.1}s"),
        Some(s) if s < 3600.0 => format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64),
        Some(s) => format!(
            "{}h{:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        ),
    }
}

fn list(p: &Printer, reg: &Registry, a: RunsListArgs) -> Result<u8, Failure> {
    let runs: Vec<RunEntry> = reg
        .list()?
        .into_iter()
        .filter(|e| a.mode.is_none_or(|m| e.mode == m))
        .filter(|e| a.status.is_none_or(|s| e.status == s))
        .collect();
    let mut out = p.writer();
    if a.json {
        for e in &runs {
            let _ = writeln!(out, "{}", serde_json::to_string(e).unwrap_or_default());
        }
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "{:<9} {:<44} {:<12} {:<20} {:>8} {:>9} {:>8}  WHERE",
        "MODE", "ID", "STATUS", "STARTED", "DURATION", "TOKENS", "COST"
    );
    for e in &runs {
        let started: String = e.started_at.chars().take(19).collect();
        let _ = writeln!(
            out,
            "{:<9} {:<44} {:<12} {:<20} {:>8} {:>9} {:>8}  {}",
            e.mode.as_str(),
            e.run_id,
            e.status.as_str(),
            started.replace('T', " "),
            duration(e.duration_s),
            e.tokens,
            format!("${:.4}", e.cost_usd),
            e.dir.display()
        );
    }
    Ok(0)
}

/// The files of a run that exist, by what they are.
fn records(dir: &Path) -> Vec<(&'static str, std::path::PathBuf)> {
    [
        ("events", "events.jsonl"),
        ("state", "state.json"),
        ("summary", "summary.json"),
        ("manifest", "manifest.json"),
        ("report", "report.json"),
        ("model usage", "llm-usage.json"),
        ("logs", "logs"),
        ("dockerfile", "Dockerfile"),
    ]
    .into_iter()
    .map(|(k, f)| (k, dir.join(f)))
    .filter(|(_, p)| p.exists())
    .collect()
}

fn show(p: &Printer, reg: &Registry, a: RunsShowArgs) -> Result<u8, Failure> {
    let e = find(reg, &a.id)?;
    if a.json {
        let mut v = serde_json::to_value(&e).unwrap_or_default();
        let files: serde_json::Map<String, serde_json::Value> = records(&e.dir)
            .into_iter()
            .map(|(k, f)| (k.to_string(), f.display().to_string().into()))
            .collect();
        v["files"] = files.into();
        p.json_line(&v);
        return Ok(0);
    }
    p.out(format!("run       {}", e.run_id));
    p.out(format!("mode      {}", e.mode.as_str()));
    if let Some(t) = &e.title {
        p.out(format!("title     {t}"));
    }
    p.out(format!("status    {}", e.status.as_str()));
    p.out(format!("started   {}", e.started_at));
    if let Some(t) = &e.ended_at {
        p.out(format!("ended     {t}"));
    }
    p.out(format!("duration  {}", duration(e.duration_s)));
    p.out(format!("tokens    {}", e.tokens));
    p.out(format!("cost      ${:.4}", e.cost_usd));
    if let Some(s) = &e.summary {
        p.out(format!("outcome   {s}"));
    }
    p.out(format!("directory {}", e.dir.display()));
    for (k, f) in records(&e.dir) {
        p.out(format!("  {k:<11} {}", f.display()));
    }
    Ok(0)
}

fn print_event(out: &mut impl Write, line: &str, json: bool) {
    if json {
        let _ = writeln!(out, "{line}");
        return;
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        return;
    };
    let at: String = v["at"]
        .as_str()
        .unwrap_or("")
        .chars()
        .skip(11)
        .take(12)
        .collect();
    let data = v["data"].to_string();
    let data: String = data.chars().take(160).collect();
    let text = format!(
        "{:>5} {at} {:<8} {:<20} {:<12} {}",
        v["seq"],
        v["source"].as_str().unwrap_or(""),
        v["kind"].as_str().unwrap_or(""),
        v["step"].as_str().unwrap_or(""),
        if data == "null" { String::new() } else { data }
    );
    // A step's name and what it reported: one line, printable.
    let _ = writeln!(out, "{}", belay_record::printable_line(&text));
}

async fn events(p: &Printer, reg: &Registry, a: RunsEventsArgs) -> Result<u8, Failure> {
    let e = find(reg, &a.id)?;
    let path = e.dir.join("events.jsonl");
    let mut out = p.writer();
    // Wait briefly for a run that has just started to write its log.
    let deadline = Instant::now() + Duration::from_secs(if a.follow { 10 } else { 0 });
    let file = loop {
        match std::fs::File::open(&path) {
            Ok(f) => break f,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(err) => return Err(io(format_args!("read {}", path.display()), err)),
        }
    };
    let mut r = std::io::BufReader::new(file);
    let mut line = String::new();
    let mut last_check = Instant::now();
    loop {
        line.clear();
        let n = r
            .read_line(&mut line)
            .map_err(|err| io(format_args!("read {}", path.display()), err))?;
        if n > 0 && line.ends_with('\n') {
            print_event(&mut out, line.trim_end(), a.json);
            continue;
        }
        if n > 0 {
            // A line still being written: read it again whole.
            let back = n as i64;
            std::io::Seek::seek_relative(&mut r, -back)
                .map_err(|err| io(format_args!("read {}", path.display()), err))?;
        }
        if !a.follow {
            break;
        }
        let _ = out.flush();
        // Tail the file: a run written by another process shows up here.
        if last_check.elapsed() > Duration::from_millis(500) {
            last_check = Instant::now();
            let still = reg
                .find(&e.run_id)?
                .is_some_and(|x| x.status == RunStatus::Running);
            if !still {
                // Whatever it wrote before it ended, then stop.
                let mut rest = String::new();
                let _ = std::io::Read::read_to_string(&mut r, &mut rest);
                for l in rest.lines() {
                    print_event(&mut out, l, a.json);
                }
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = out.flush();
    Ok(0)
}

async fn gc(p: &Printer, reg: &Registry, a: RunsGcArgs) -> Result<u8, Failure> {
    let now = jiff::Timestamp::now();
    let old: Vec<RunEntry> = reg
        .list()?
        .into_iter()
        .filter(|e| e.status != RunStatus::Running)
        .filter(|e| {
            e.started_at
                .parse::<jiff::Timestamp>()
                .map(|t| now.duration_since(t).as_secs() as u64 >= a.older_than.as_secs())
                .unwrap_or(false)
        })
        .collect();
    if a.dry_run {
        for e in &old {
            p.out(format!(
                "would remove {} {} ({})",
                e.mode.as_str(),
                e.run_id,
                e.dir.display()
            ));
        }
        return Ok(0);
    }
    let rt = connect().await?;
    let mut gone = Vec::new();
    for e in &old {
        let label = format!("belay.run={}", e.run_id);
        for c in rt.list_containers(std::slice::from_ref(&label)).await? {
            let _ = rt.remove(&c.id).await;
        }
        for i in rt.list_images(std::slice::from_ref(&label)).await? {
            let _ = rt.remove_image(&i.id).await;
        }
        // The pipeline's named volumes and networks of the run.
        for suffix in [
            "egress",
            "model",
            "open",
            "browser",
            "egress-up",
            "model-up",
            "browser-up",
        ] {
            let _ = rt
                .remove_network(&format!("belay-{}-{suffix}", e.run_id))
                .await;
        }
        belay_sandbox::envimage::remove_run_volumes(&rt, &e.run_id).await;
        if e.dir.is_dir() {
            fs_err::remove_dir_all(&e.dir)
                .map_err(|err| io(format_args!("remove {}", e.dir.display()), err))?;
        }
        p.out(format!("removed {} {}", e.mode.as_str(), e.run_id));
        gone.push(e.run_id.clone());
    }
    reg.forget(&gone)?;
    p.note(&format!("{} run(s) removed", gone.len()));
    Ok(0)
}
