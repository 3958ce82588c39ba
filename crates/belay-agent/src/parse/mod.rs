//! Incremental parsers of agent CLI event streams: one JSON object per line in,
//! [`AgentEvent`]s out. A line that is not what the parser expects becomes a
//! non-fatal error event; nothing panics and nothing is held beyond the line.

mod claude;
mod codex;
mod gemini;

pub use claude::ClaudeParser;
pub use codex::CodexParser;
pub use gemini::GeminiParser;

use serde_json::value::RawValue;

use crate::AgentEvent;

pub trait StreamParser: Send {
    /// One line (without its newline).
    fn line(&mut self, line: &[u8], out: &mut Vec<AgentEvent>);
    /// End of stream.
    fn finish(&mut self, _out: &mut Vec<AgentEvent>, _exit_code: Option<i32>) {}
}

/// How much of a malformed line an error event quotes.
const QUOTE: usize = 200;

pub(crate) fn bad_line(line: &[u8], why: &str) -> AgentEvent {
    let text = String::from_utf8_lossy(&line[..line.len().min(QUOTE)]);
    AgentEvent::Error {
        message: format!("unparseable agent output ({why}): {text}"),
        fatal: false,
    }
}

/// Text of a JSON value that may be a string, or anything else (kept as JSON).
pub(crate) fn raw_text(v: Option<&RawValue>) -> String {
    match v {
        None => String::new(),
        Some(r) => {
            let s = r.get();
            if s.starts_with('"') {
                serde_json::from_str::<String>(s).unwrap_or_default()
            } else {
                s.to_string()
            }
        }
    }
}

/// Output kept per command or tool result (the tail).
pub(crate) const OUTPUT_KEEP: usize = 16 * 1024;

pub(crate) fn tail(mut s: String) -> String {
    if s.len() > OUTPUT_KEEP {
        let mut cut = s.len() - OUTPUT_KEEP;
        while !s.is_char_boundary(cut) {
            cut += 1;
        }
        s.replace_range(..cut, "…");
    }
    s
}

/// Plain prompt-argument CLIs: the final text is stdout (its last 256 KiB).
#[derive(Debug, Default)]
pub struct PlainParser {
    text: String,
}

const PLAIN_KEEP: usize = 256 * 1024;

impl StreamParser for PlainParser {
    fn line(&mut self, line: &[u8], _out: &mut Vec<AgentEvent>) {
        self.text.push_str(&String::from_utf8_lossy(line));
        self.text.push('\n');
        if self.text.len() > 2 * PLAIN_KEEP {
            let mut cut = self.text.len() - PLAIN_KEEP;
            while !self.text.is_char_boundary(cut) {
                cut += 1;
            }
            self.text.replace_range(..cut, "");
        }
    }

    fn finish(&mut self, out: &mut Vec<AgentEvent>, exit_code: Option<i32>) {
        let mut text = std::mem::take(&mut self.text);
        if text.len() > PLAIN_KEEP {
            let mut cut = text.len() - PLAIN_KEEP;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            text.replace_range(..cut, "");
        }
        let text = text.trim_end().to_string();
        out.push(AgentEvent::Message { text: text.clone() });
        out.push(AgentEvent::Final {
            text,
            is_error: exit_code != Some(0),
            subtype: exit_code.map(|c| format!("exit {c}")),
            num_turns: None,
            cost_usd: None,
        });
    }
}
