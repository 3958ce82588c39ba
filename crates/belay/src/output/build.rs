//! Build progress through the [`Printer`]: a live line per block on a
//! terminal (name, elapsed time, last log line), plain notes otherwise.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use belay_env::progress::{BuildEvent, BuildObserver};
use belay_sandbox::StreamKind;
use indicatif::{ProgressBar, ProgressStyle};

use super::Printer;

const LAST_LINE_MAX: usize = 160;

pub struct BuildView<'a> {
    p: &'a Printer,
    stream_logs: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    bars: HashMap<String, ProgressBar>,
    partial: HashMap<String, Vec<u8>>,
}

impl<'a> BuildView<'a> {
    pub fn new(p: &'a Printer, stream_logs: bool) -> Self {
        Self {
            p,
            stream_logs,
            state: Mutex::new(State::default()),
        }
    }

    fn line(&self, text: &str) {
        self.p.note(text);
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

impl BuildObserver for BuildView<'_> {
    fn event(&self, event: &BuildEvent) {
        match event {
            BuildEvent::RunStarted {
                run_id,
                run_dir,
                resumed_from,
            } => {
                self.line(&format!("run {run_id} ({run_dir})"));
                if let Some(r) = resumed_from {
                    self.line(&format!("resuming from checkpoint {r}"));
                }
            }
            BuildEvent::Phase { name, detail } => self.line(&format!("{name}: {detail}")),
            // The phase line that follows says it.
            BuildEvent::Repair { .. } => {}
            BuildEvent::Plan { blocks } => {
                let ids: Vec<&str> = blocks.iter().map(|b| b.0.as_str()).collect();
                self.line(&format!("plan: {}", ids.join(", ")));
            }
            BuildEvent::BlockStarted {
                id,
                title,
                index,
                total,
            } => {
                let prefix = format!("[{}/{}] {id}", index + 1, total);
                match self.p.live() {
                    Some(mp) => {
                        let pb = mp.add(ProgressBar::new_spinner());
                        let style = ProgressStyle::with_template(
                            "{spinner} {prefix:<32} {elapsed:>4} {wide_msg}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_spinner());
                        pb.set_style(style);
                        pb.set_prefix(prefix);
                        pb.set_message(title.clone());
                        pb.enable_steady_tick(Duration::from_millis(120));
                        if let Ok(mut s) = self.state.lock() {
                            s.bars.insert(id.clone(), pb);
                        }
                    }
                    None => self.line(&format!("{prefix} started: {title}")),
                }
            }
            BuildEvent::BlockFinished {
                id,
                ok,
                cached,
                duration,
                detail,
            } => {
                let bar = self.state.lock().ok().and_then(|mut s| {
                    s.partial.remove(id);
                    s.bars.remove(id)
                });
                let msg = if *cached {
                    format!("cached ({detail})")
                } else if *ok && !detail.is_empty() {
                    format!("ok in {}, {detail}", secs(*duration))
                } else if *ok {
                    format!("ok in {}", secs(*duration))
                } else {
                    format!("FAILED after {}: {detail}", secs(*duration))
                };
                match bar {
                    Some(pb) => {
                        pb.set_style(
                            ProgressStyle::with_template("  {prefix:<32} {wide_msg}")
                                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                        );
                        pb.finish_with_message(msg);
                    }
                    None => self.line(&format!("{id} {msg}")),
                }
            }
            // In the event log; the display shows blocks, not each command.
            BuildEvent::Executed { .. } | BuildEvent::Checkpoint { .. } => {}
            BuildEvent::Finished {
                ok,
                final_image,
                error,
                duration,
            } => {
                if *ok {
                    self.line(&format!(
                        "build succeeded in {}: {}",
                        secs(*duration),
                        final_image.as_deref().unwrap_or("")
                    ));
                } else {
                    self.line(&format!(
                        "build failed after {}: {}",
                        secs(*duration),
                        error.as_deref().unwrap_or("unknown error")
                    ));
                }
            }
        }
    }

    fn output(&self, block: &str, _stream: StreamKind, bytes: &[u8]) {
        if self.stream_logs {
            self.p.raw_stderr(bytes);
        }
        let Some(_) = self.p.live() else { return };
        let Ok(mut s) = self.state.lock() else { return };
        let partial = s.partial.entry(block.to_string()).or_default();
        partial.extend_from_slice(bytes);
        // Keep only the tail: the last complete line is all the display needs.
        if partial.len() > 4 * LAST_LINE_MAX {
            let cut = partial.len() - 2 * LAST_LINE_MAX;
            partial.drain(..cut);
        }
        let text = String::from_utf8_lossy(partial);
        let last = text
            .split(['\n', '\r'])
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|l| l.chars().take(LAST_LINE_MAX).collect::<String>());
        if let (Some(last), Some(pb)) = (last, s.bars.get(block)) {
            pb.set_message(last);
        }
    }
}
