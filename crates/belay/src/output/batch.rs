//! Rendering a batch build: a live line per project on a terminal, plain
//! notes otherwise. A bar's text is one printable line (see
//! [`belay_record::printable_line`]): errors carry what builds printed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use belay_env::batch::{BatchObserver, ProjectResult};
use belay_env::progress::BuildEvent;
use belay_record::printable_line;
use indicatif::{ProgressBar, ProgressStyle};

use super::Printer;

pub struct BatchView<'a> {
    p: &'a Printer,
    bars: Mutex<HashMap<String, ProgressBar>>,
}

impl<'a> BatchView<'a> {
    pub fn new(p: &'a Printer) -> Self {
        Self {
            p,
            bars: Mutex::new(HashMap::new()),
        }
    }

    fn line(&self, text: &str) {
        self.p.note(text);
    }
}

impl BatchObserver for BatchView<'_> {
    fn project_started(&self, name: &str) {
        match self.p.live() {
            Some(mp) => {
                let pb = mp.add(ProgressBar::new_spinner());
                pb.set_style(
                    ProgressStyle::with_template("{spinner} {prefix:<30} {elapsed:>5} {wide_msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                pb.set_prefix(printable_line(name).into_owned());
                pb.set_message("preparing");
                pb.enable_steady_tick(Duration::from_millis(150));
                if let Ok(mut b) = self.bars.lock() {
                    b.insert(name.to_string(), pb);
                }
            }
            None => self.line(&format!("{name}: started")),
        }
    }

    fn project_event(&self, name: &str, event: &BuildEvent) {
        let msg = match event {
            BuildEvent::BlockStarted {
                id, index, total, ..
            } => format!("[{}/{}] {id}", index + 1, total),
            BuildEvent::BlockFinished {
                id,
                ok: false,
                detail,
                ..
            } => format!("{id} failed: {detail}"),
            BuildEvent::BlockFinished {
                id, cached: true, ..
            } => format!("{id} cached"),
            BuildEvent::Phase { name, detail } if name != "plan" => format!("{name}: {detail}"),
            _ => return,
        };
        match self.p.live() {
            Some(_) => {
                if let Some(pb) = self.bars.lock().ok().and_then(|b| b.get(name).cloned()) {
                    pb.set_message(printable_line(&msg).into_owned());
                }
            }
            None => self.line(&format!("{name}: {msg}")),
        }
    }

    fn project_finished(&self, r: &ProjectResult) {
        let text = match r.status.as_str() {
            "ok" => format!("ok in {:.1}s", r.duration_s),
            "skipped" => "skipped (already built)".to_string(),
            _ => format!(
                "{} after {:.1}s: {}",
                r.stage.as_deref().unwrap_or("failed"),
                r.duration_s,
                r.error.as_deref().unwrap_or("")
            ),
        };
        match self.p.live() {
            Some(_) => {
                if let Some(pb) = self.bars.lock().ok().and_then(|mut b| b.remove(&r.name)) {
                    pb.set_style(
                        ProgressStyle::with_template("  {prefix:<30} {wide_msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                    pb.finish_with_message(printable_line(&text).into_owned());
                } else {
                    self.line(&format!("{}: {text}", r.name));
                }
            }
            None => self.line(&format!("{}: {text}", r.name)),
        }
    }

    fn engine_lost(&self, why: &str, held: &[String], budget: Duration) {
        self.line(&printable_line(&format!(
            "the engine failed under {} ({why}): no new project starts; waiting up to {} s for it to answer, then they resume from their checkpoints",
            held.join(", "),
            budget.as_secs()
        )));
    }

    fn engine_back(&self, waited: Duration) {
        self.line(&format!(
            "the engine answers again after {:.0} s: resuming the held projects",
            waited.as_secs_f64()
        ));
    }
}
