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
pub mod pipeline;

use std::io::{IsTerminal, Write};

use indicatif::{MultiProgress, ProgressDrawTarget};

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

    /// Whether notes are off (`--quiet`).
    pub fn is_quiet(&self) -> bool {
        self.quiet
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

    /// The sink of a library's progress lines (jobs, rounds, plan): each
    /// `[prefix] line` on stderr, nothing with `--quiet`. The lines carry
    /// what agents and senders wrote, so they are shown printable.
    pub fn progress_sink(&self, prefix: &'static str) -> Box<dyn Fn(&str) + Send + Sync> {
        let quiet = self.is_quiet();
        Box::new(move |line: &str| {
            if !quiet {
                eprintln!("[{prefix}] {}", belay_record::printable(line));
            }
        })
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
