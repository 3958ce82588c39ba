//! All output of the binary goes through one [`Printer`]: results to stdout
//! (a line, or JSON with `--json`), notes and progress to stderr (live bars on
//! a terminal, plain `[belay]` lines otherwise, nothing with `--quiet`), and
//! warnings and errors to stderr always.
//!
//! Text printed here often carries untrusted text (a step's output, an
//! agent's commit message, a request body): every line of text is shown
//! through [`belay_record::printable`], so that no escape sequence (OSC 52
//! setting the clipboard, CSI moving the cursor, CR overwriting a line)
//! reaches the terminal. JSON is escaped by serde and left as it is.

pub mod batch;
pub mod build;
pub mod jobs;
pub mod pipeline;
pub mod plan;
pub mod rounds;

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use belay_record::Observer;
use indicatif::{MultiProgress, ProgressDrawTarget};

/// Cheap to clone: the clones share the live display, so that an engine's
/// observer, which outlives the borrow of a command, prints through it too.
#[derive(Clone)]
pub struct Printer {
    quiet: bool,
    live: Option<MultiProgress>,
}

impl Printer {
    /// `quiet`: no notes and no progress; results, warnings and errors stay.
    pub fn new(quiet: bool) -> Self {
        let live = (!quiet && std::io::stderr().is_terminal())
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8)));
        Printer { quiet, live }
    }

    /// The live display, on a terminal without `--quiet`.
    pub fn live(&self) -> Option<&MultiProgress> {
        self.live.as_ref()
    }

    /// A progress note.
    pub fn note(&self, text: &str) {
        if self.quiet {
            return;
        }
        self.to_stderr(&format!("[belay] {text}"));
    }

    /// A warning: shown even with `--quiet`.
    pub fn warn(&self, text: &str) {
        self.to_stderr(&format!("[belay] warning: {text}"));
    }

    /// The error and its causes, each cause once (library errors often say
    /// their source in their own message already).
    /// The error with its stable code: `belay: error[BELAY-E302]: …`
    /// (`docs/troubleshooting.md` explains each code).
    pub fn error_coded(&self, code: &str, e: &anyhow::Error) {
        self.to_stderr(&format!("belay: error[{code}]: {}", Self::causes(e)));
    }

    fn causes(e: &anyhow::Error) -> String {
        let mut text = String::new();
        for cause in e.chain() {
            let c = cause.to_string();
            if !text.contains(&c) {
                if !text.is_empty() {
                    text.push_str(": ");
                }
                text.push_str(&c);
            }
        }
        text
    }

    fn to_stderr(&self, line: &str) {
        let line = belay_record::printable(line);
        let line: &str = &line;
        match &self.live {
            Some(mp) => {
                let _ = mp.println(line);
            }
            None => eprintln!("{line}"),
        }
    }

    /// A line of the command's result (stdout), printable.
    pub fn out(&self, text: impl std::fmt::Display) {
        self.stdout_line(&belay_record::printable(&text.to_string()));
    }

    fn stdout_line(&self, text: &str) {
        let mut o = std::io::stdout().lock();
        // A closed pipe (`| head`) ends the output, not the command.
        let _ = writeln!(o, "{text}");
    }

    /// The command's result as JSON (stdout), pretty-printed.
    pub fn json(&self, v: &impl serde::Serialize) {
        match serde_json::to_string_pretty(v) {
            Ok(s) => self.stdout_line(&s),
            Err(e) => self.warn(&format!("cannot encode the result as JSON: {e}")),
        }
    }

    /// A recorded envelope (one JSON line as the event log holds it, its
    /// text escaped by serde) on stdout, as it is.
    pub fn envelope(&self, line: &str) {
        self.stdout_line(line);
    }

    /// One JSON value on one line (streamed results such as events).
    pub fn json_line(&self, v: &impl serde::Serialize) {
        match serde_json::to_string(v) {
            Ok(s) => self.stdout_line(&s),
            Err(e) => self.warn(&format!("cannot encode the result as JSON: {e}")),
        }
    }

    /// A buffered writer on stdout, for long listings and streams (flush it
    /// to show what is written so far).
    pub fn writer(&self) -> std::io::BufWriter<std::io::StdoutLock<'static>> {
        std::io::BufWriter::new(std::io::stdout().lock())
    }

    /// Raw bytes to stdout (a command's passthrough output), flushed.
    pub fn raw(&self, bytes: &[u8]) {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(bytes);
        let _ = o.flush();
    }

    /// Raw bytes to stderr, around the live display.
    pub fn raw_stderr(&self, bytes: &[u8]) {
        let write = || {
            let _ = std::io::stderr().write_all(bytes);
        };
        match &self.live {
            Some(mp) => mp.suspend(write),
            None => write(),
        }
    }
}

/// A line an event gets on the terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Progress: nothing with `--quiet`.
    Note(String),
    /// Shown even with `--quiet`.
    Warn(String),
}

/// What an engine's events look like on the terminal: the lines of each
/// (none for most). It may keep what a later line needs (the plan file's
/// name, a round's phase).
pub trait Render<E>: Send {
    fn lines(&mut self, step: Option<&str>, e: &E) -> Vec<Line>;
}

/// An engine's observer over the [`Printer`]: each event's lines (notes
/// around the live display on a terminal, plain lines otherwise, nothing
/// with `--quiet`; warnings always), or with `json` the recorded envelopes
/// on stdout instead of the notes.
pub struct EventView<R> {
    p: Printer,
    json: bool,
    render: Mutex<R>,
}

impl<R> EventView<R> {
    pub fn new(p: &Printer, render: R, json: bool) -> Self {
        EventView {
            p: p.clone(),
            json,
            render: Mutex::new(render),
        }
    }
}

impl<E, R: Render<E>> Observer<E> for EventView<R> {
    fn event(&self, step: Option<&str>, e: &E) {
        let lines = self
            .render
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .lines(step, e);
        for l in lines {
            match l {
                Line::Note(t) if !self.json => self.p.note(&t),
                Line::Note(_) => {}
                Line::Warn(t) => self.p.warn(&t),
            }
        }
    }

    fn recorded(&self, envelope: &str) {
        if self.json {
            self.p.envelope(envelope);
        }
    }
}

/// The last `n` lines of `text` (its blank end left out), each indented as
/// a quote under the line it explains.
pub(crate) fn quoted_tail(text: &str, n: usize) -> Vec<Line> {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let from = lines.len().saturating_sub(n);
    lines[from..]
        .iter()
        .map(|l| Line::Note(format!("   | {l}")))
        .collect()
}
