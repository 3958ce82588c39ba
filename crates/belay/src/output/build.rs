//! Build progress through the [`Printer`]: a live line per block on a
//! terminal (name, elapsed time, last log line), plain notes otherwise.
//! What the build's commands print is shown printable (see
//! [`belay_record::printable`]): a line on a bar, and the streamed logs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use belay_env::progress::{BuildEvent, BuildObserver};
use belay_record::printable_line;
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
    /// The streamed logs' last bytes of a character not yet whole, a block's
    /// stream each (stderr: `true`).
    carry: HashMap<(String, bool), Vec<u8>>,
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
                        pb.set_prefix(printable_line(&prefix).into_owned());
                        pb.set_message(printable_line(title).into_owned());
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
                let (bar, cut) = self
                    .state
                    .lock()
                    .map(|mut s| {
                        s.partial.remove(id);
                        let mut cut = Vec::new();
                        for err in [false, true] {
                            if let Some(c) = s.carry.remove(&(id.clone(), err)) {
                                cut.extend(c);
                            }
                        }
                        (s.bars.remove(id), cut)
                    })
                    .unwrap_or_default();
                if self.stream_logs && !cut.is_empty() {
                    let text = String::from_utf8_lossy(&cut);
                    self.p.raw_stderr(belay_record::printable(&text).as_bytes());
                }
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
                        pb.finish_with_message(printable_line(&msg).into_owned());
                    }
                    None => self.line(&format!("{id} {msg}")),
                }
            }
            // In the event log; the display shows blocks, not each command.
            BuildEvent::Executed { .. } | BuildEvent::Checkpoint { .. } => {}
            BuildEvent::Finished {
                ok,
                interrupted,
                final_image,
                error,
                duration,
            } => {
                if *interrupted {
                    self.line(&format!(
                        "build stopped after {}: {}",
                        secs(*duration),
                        error.as_deref().unwrap_or("interrupted")
                    ));
                } else if *ok {
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

    fn output(&self, block: &str, stream: StreamKind, bytes: &[u8]) {
        if self.stream_logs {
            let key = (block.to_string(), stream == StreamKind::Stderr);
            let text = match self.state.lock() {
                Ok(mut s) => printable_chunk(s.carry.entry(key).or_default(), bytes),
                Err(_) => belay_record::printable(&String::from_utf8_lossy(bytes)).into_owned(),
            };
            self.p.raw_stderr(text.as_bytes());
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
            pb.set_message(printable_line(&last).into_owned());
        }
    }
}

/// Streamed log bytes as printable text. A character cut between two chunks
/// is kept back in `carry` until its rest comes.
fn printable_chunk(carry: &mut Vec<u8>, bytes: &[u8]) -> String {
    carry.extend_from_slice(bytes);
    let whole = carry.len() - cut_char(carry.as_slice());
    let rest = carry.split_off(whole);
    let text = belay_record::printable(&String::from_utf8_lossy(carry.as_slice())).into_owned();
    *carry = rest;
    text
}

/// How many of the last bytes of `b` begin a UTF-8 character that is not whole.
fn cut_char(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let c = b[b.len() - back];
        if c & 0xC0 != 0x80 {
            let need = match c {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => 1,
            };
            return if need > back { back } else { 0 };
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::printable_chunk;

    #[test]
    fn streamed_logs_are_printable_and_keep_cut_characters_whole() {
        let mut carry = Vec::new();
        let all = "ok é\x1b]52;c;eA==\x07\r\n✓ 🦀\n".as_bytes();
        let mut out = String::new();
        for chunk in all.chunks(1) {
            out.push_str(&printable_chunk(&mut carry, chunk));
        }
        assert!(carry.is_empty());
        assert_eq!(out, "ok é\\x1b]52;c;eA==\\x07\\r\n✓ 🦀\n");
        // A character cut at the end is kept back, then completed.
        let crab = "🦀".as_bytes();
        assert_eq!(printable_chunk(&mut carry, &crab[..2]), "");
        assert_eq!(printable_chunk(&mut carry, &crab[2..]), "🦀");
        // The C1 CSI cut in two is escaped once it is whole.
        assert_eq!(printable_chunk(&mut carry, &[b'a', 0xC2]), "a");
        assert_eq!(printable_chunk(&mut carry, &[0x9B, b'J']), "\\u{9b}J");
    }
}
