//! `status`, `peek`, `watch`, `events`: read-only views of the log dir.

use std::time::Duration;

use belay_record::Envelope;
use belay_rounds::monitor::view::each_event;
use belay_rounds::Config;
use jiff::Timestamp;

use crate::cli::{EventsArgs, PeekArgs, WatchArgs};
use crate::exit::Failure;
use crate::output::Printer;

fn print_report(p: &Printer, r: &belay_rounds::report::Report) {
    let s = &r.status;
    p.out(format!("project   {}", r.project));
    p.out(format!(
        "state     {}{}",
        r.state,
        if r.serving {
            format!(" (serve pid {})", r.serve_pid.unwrap_or(0))
        } else {
            String::new()
        }
    ));
    if s.round_num > 0 {
        let phase = s
            .current_phase
            .as_deref()
            .map(|ph| format!(" [{ph}]"))
            .unwrap_or_default();
        if s.running {
            p.out(format!(
                "round     {}{phase} since {}",
                s.round_num,
                s.started_at.as_deref().unwrap_or("?")
            ));
        } else {
            p.out(format!(
                "last      round {}{phase}: {}{} at {}",
                s.round_num,
                s.last_outcome.as_deref().unwrap_or("?"),
                s.last_exit_code
                    .map(|c| format!(" (exit {c})"))
                    .unwrap_or_default(),
                s.last_completed_at.as_deref().unwrap_or("?")
            ));
        }
    }
    for o in &r.orphans.stashes {
        p.out(format!(
            "stash     {} from round {} ({}), {} file(s)",
            o.sha,
            o.round_num,
            o.outcome,
            o.files.len()
        ));
    }
    if r.today.rounds > 0 {
        p.out(format!(
            "today     {} round(s), {} turn(s), ${:.4}",
            r.today.rounds, r.today.turns, r.today.cost_usd
        ));
    }
    if let Some(e) = &r.problem {
        p.out(format!("problem   {e}"));
    }
    p.out(format!("log dir   {}", r.log_dir));
}

pub fn status(p: &Printer, cfg: &Config, json: bool) -> Result<u8, Failure> {
    let r = belay_rounds::report::report(&cfg.project, &cfg.runtime.log_dir);
    if json {
        p.json(&r);
    } else {
        print_report(p, &r);
    }
    Ok(0)
}

fn last_events(cfg: &Config, n: usize) -> Vec<Envelope> {
    let mut keep = std::collections::VecDeque::new();
    each_event(
        &cfg.runtime.log_dir.join(belay_record::EVENTS_FILE),
        0,
        &mut |e| {
            if e.source != "agent" {
                keep.push_back(e.clone());
                if keep.len() > n {
                    keep.pop_front();
                }
            }
        },
    );
    keep.into_iter().collect()
}

fn line(e: &Envelope) -> String {
    let data = serde_json::to_string(&e.data).unwrap_or_default();
    let data: String = data.chars().take(160).collect();
    format!("{} {:<26} {}", e.at, e.kind, data)
}

pub fn peek(p: &Printer, cfg: &Config, a: &PeekArgs) -> Result<u8, Failure> {
    let r = belay_rounds::report::report(&cfg.project, &cfg.runtime.log_dir);
    let ctx: Option<serde_json::Value> =
        belay_rounds::state::read(&cfg.runtime.log_dir, belay_rounds::state::CONTEXT_FILE)
            .ok()
            .flatten();
    let events = last_events(cfg, a.events);
    if a.json {
        p.json(&serde_json::json!({"report": r, "round_context": ctx, "events": events}));
        return Ok(0);
    }
    print_report(p, &r);
    if let Some(c) = ctx {
        p.out(format!(
            "context   {}",
            serde_json::to_string(&c).unwrap_or_default()
        ));
    }
    for e in &events {
        p.out(line(e));
    }
    Ok(0)
}

pub async fn watch(p: &Printer, cfg: &Config, a: &WatchArgs) -> Result<u8, Failure> {
    let mut n = 0u64;
    loop {
        if n > 0 {
            p.out("---");
        }
        peek(
            p,
            cfg,
            &PeekArgs {
                events: 10,
                json: false,
            },
        )?;
        n += 1;
        if a.count > 0 && n >= a.count {
            return Ok(0);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(a.interval.max(0.2))) => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
    }
}

/// `--since`: an RFC 3339 time, or an age (`90s`, `10m`, `2h`, `1d`).
fn since(s: &str) -> Result<Timestamp, Failure> {
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok(t);
    }
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num.parse().map_err(|_| {
        crate::exit::usage(format!(
            "--since {s}: give an RFC 3339 time or an age like 10m, 2h, 1d"
        ))
    })?;
    let secs = match unit {
        "s" | "" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => {
            return Err(crate::exit::usage(format!(
                "--since {s}: the unit is s, m, h or d"
            )))
        }
    };
    Timestamp::now()
        .checked_sub(jiff::SignedDuration::from_secs(secs))
        .map_err(|e| crate::exit::usage(format!("--since {s}: {e}")))
}

pub async fn events(p: &Printer, cfg: &Config, a: &EventsArgs) -> Result<u8, Failure> {
    let path = cfg.runtime.log_dir.join(belay_record::EVENTS_FILE);
    let since = a.since.as_deref().map(since).transpose()?;
    let keep = |e: &Envelope| {
        (a.kind.is_empty() || a.kind.iter().any(|k| k == &e.kind))
            && since.is_none_or(|t| e.at.parse::<Timestamp>().is_ok_and(|at| at >= t))
    };
    let mut out = std::collections::VecDeque::new();
    let mut offset = each_event(&path, 0, &mut |e| {
        if keep(e) {
            out.push_back(e.clone());
            if a.last.is_some_and(|n| out.len() > n) {
                out.pop_front();
            }
        }
    });
    for e in &out {
        p.json_line(e);
    }
    if !a.tail {
        return Ok(0);
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
        offset = each_event(&path, offset, &mut |e| {
            if keep(e) {
                p.json_line(e);
            }
        });
    }
}
