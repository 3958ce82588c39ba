//! `monitor`: the detectors on their own (their own unit), over the log dir
//! serve writes. Alerts go to stdout (lines or JSONL) and to
//! `monitor-events.jsonl`; an auto-stop asks serve to stop after its round
//! (SIGTERM), and is reported once serve has it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use belay_record::JsonlAppender;
use belay_rounds::monitor::{http, Monitor};
use belay_rounds::report::live_serve;
use belay_rounds::{Config, RoundsError};
use jiff::Timestamp;

use super::fail;
use crate::cli::{MonitorArgs, MonitorMode};
use crate::exit::Failure;
use crate::output::Printer;

pub const MONITOR_LOG: &str = "monitor-events.jsonl";

pub async fn monitor(p: &Printer, cfg: &Config, a: &MonitorArgs) -> Result<u8, Failure> {
    let mode = if a.json { MonitorMode::Events } else { a.mode };
    let mut m = Monitor::new(cfg);
    let log_path = cfg.runtime.log_dir.join(MONITOR_LOG);
    let red = crate::context::build_redactor();
    let mut log = JsonlAppender::open(&log_path).map_err(|e| fail(e.into()))?;
    let snapshot: http::Snapshot =
        Arc::new(Mutex::new(serde_json::json!({"project": cfg.project})));
    let _server = if mode == MonitorMode::Http {
        let (addr, task) = http::bind(a.port, snapshot.clone()).await.map_err(|e| {
            fail(RoundsError::Environment(format!(
                "cannot listen on 127.0.0.1:{}: {e}",
                a.port
            )))
        })?;
        p.out(format!(
            "monitor page: http://{addr}/ (JSON at /status.json)"
        ));
        Some(task)
    } else {
        None
    };
    let interval = Duration::from_secs_f64(a.interval.max(0.05));
    let mut n = 0u64;
    loop {
        let now = Timestamp::now();
        let tick = m.tick(now);
        for f in &tick.new {
            let rec = serde_json::json!({"at": now.to_string(), "event": "monitor_alert_emitted", "detector": f.detector, "severity": f.severity, "message": f.message, "episode": f.episode});
            let _ = log.append_line(&rec, &red);
            match mode {
                MonitorMode::Events => p.json_line(&rec),
                _ => p.out(format!(
                    "{now} {} {}: {}",
                    serde_json::to_string(&f.severity)
                        .unwrap_or_default()
                        .trim_matches('"'),
                    f.detector.as_str(),
                    f.message
                )),
            }
        }
        for d in &tick.cleared {
            let rec = serde_json::json!({"at": now.to_string(), "event": "monitor_alert_cleared", "detector": d});
            let _ = log.append_line(&rec, &red);
            if mode == MonitorMode::Events {
                p.json_line(&rec);
            }
        }
        if let (Some(f), false) = (&tick.stop, a.no_auto_stop) {
            let rec = match live_serve(&cfg.runtime.log_dir) {
                Some(s)
                    if rustix::process::Pid::from_raw(s.pid as i32).is_some_and(|pid| {
                        rustix::process::kill_process(pid, rustix::process::Signal::TERM).is_ok()
                    }) =>
                {
                    serde_json::json!({"at": now.to_string(), "event": "monitor_auto_stop_triggered", "detector": f.detector, "serve_pid": s.pid, "draining": m.view().open_round.is_some()})
                }
                _ => {
                    serde_json::json!({"at": now.to_string(), "event": "monitor_auto_stop_failed", "detector": f.detector, "reason": "no serve is running"})
                }
            };
            let _ = log.append_line(&rec, &red);
            match mode {
                MonitorMode::Events => p.json_line(&rec),
                _ => p.out(format!("auto-stop: {}", rec)),
            }
        }
        let _ = log.sync();
        if let Ok(mut s) = snapshot.lock() {
            *s = serde_json::json!({
                "project": cfg.project,
                "at": now.to_string(),
                "status": belay_rounds::report::report(&cfg.project, &cfg.runtime.log_dir),
                "alerts": m.current,
                "sample": m.latest_sample(),
            });
        }
        n += 1;
        if a.ticks > 0 && n >= a.ticks {
            return Ok(0);
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
    }
}
