//! Streaming exec output to a log file, with redaction and bounded tails.
//!
//! Output is never held whole: bytes are written through to the log as they
//! arrive (line-buffered only when secrets must be scrubbed, with a bounded line
//! buffer), and only the last [`TAIL_BYTES`] of each stream are kept in memory.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use belay_record::Redactor;

use crate::SandboxError;

/// Bytes of each stream kept for `stdout_tail` / `stderr_tail`.
pub const TAIL_BYTES: usize = 4096;
/// Longest partial line held back for redaction before it is flushed anyway.
const MAX_PENDING: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Stdout,
    Stderr,
}

/// Sees exec output as it streams: progress displays and `--stream-logs`.
/// Output handed to an observer is already redacted.
pub trait ExecObserver: Send + Sync {
    fn output(&self, stream: StreamKind, bytes: &[u8]);
}

pub struct NoopObserver;

impl ExecObserver for NoopObserver {
    fn output(&self, _stream: StreamKind, _bytes: &[u8]) {}
}

struct Tail {
    buf: VecDeque<u8>,
}

impl Tail {
    fn new() -> Self {
        Self {
            buf: VecDeque::with_capacity(TAIL_BYTES),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let bytes = if bytes.len() > TAIL_BYTES {
            &bytes[bytes.len() - TAIL_BYTES..]
        } else {
            bytes
        };
        let overflow = (self.buf.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        self.buf.drain(..overflow);
        self.buf.extend(bytes);
    }

    fn text(&self, redactor: &Redactor) -> String {
        let (a, b) = self.buf.as_slices();
        let mut v = Vec::with_capacity(a.len() + b.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        let s = String::from_utf8_lossy(&v);
        redactor.redact(&s).into_owned()
    }
}

/// Writes one exec's output to its log file.
pub struct LogSink<'a> {
    path: PathBuf,
    out: BufWriter<File>,
    redactor: &'a Redactor,
    observer: &'a dyn ExecObserver,
    pending: [Vec<u8>; 2],
    tails: [Tail; 2],
    written: u64,
}

impl<'a> LogSink<'a> {
    pub fn create(
        path: &Path,
        redactor: &'a Redactor,
        observer: &'a dyn ExecObserver,
    ) -> Result<Self, SandboxError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| SandboxError::io("cannot create log directory", dir, e))?;
        }
        let file =
            File::create(path).map_err(|e| SandboxError::io("cannot create log", path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(64 * 1024, file),
            redactor,
            observer,
            pending: [Vec::new(), Vec::new()],
            tails: [Tail::new(), Tail::new()],
            written: 0,
        })
    }

    /// Append a line of belay's own (a header or a note) to the log.
    pub fn note(&mut self, text: &str) -> Result<(), SandboxError> {
        let line = format!("{}\n", self.redactor.redact(text));
        self.write_out(StreamKind::Stdout, line.as_bytes(), false)
    }

    pub fn push(&mut self, stream: StreamKind, bytes: &[u8]) -> Result<(), SandboxError> {
        if self.redactor.is_empty() {
            return self.write_out(stream, bytes, true);
        }
        let idx = stream as usize;
        let mut pending = std::mem::take(&mut self.pending[idx]);
        pending.extend_from_slice(bytes);
        let cut = match pending.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None if pending.len() > MAX_PENDING => pending.len(),
            None => 0,
        };
        if cut > 0 {
            let rest = pending.split_off(cut);
            self.write_redacted(stream, &pending)?;
            pending = rest;
        }
        self.pending[idx] = pending;
        Ok(())
    }

    fn write_redacted(&mut self, stream: StreamKind, bytes: &[u8]) -> Result<(), SandboxError> {
        let text = String::from_utf8_lossy(bytes);
        let red = self.redactor.redact(&text);
        self.write_out(stream, red.as_bytes(), true)
    }

    fn write_out(
        &mut self,
        stream: StreamKind,
        bytes: &[u8],
        observe: bool,
    ) -> Result<(), SandboxError> {
        self.out
            .write_all(bytes)
            .map_err(|e| SandboxError::io("cannot write log", &self.path, e))?;
        self.written += bytes.len() as u64;
        self.tails[stream as usize].push(bytes);
        if observe {
            self.observer.output(stream, bytes);
        }
        Ok(())
    }

    /// Flush everything; returns (stdout tail, stderr tail, bytes written).
    pub fn finish(mut self) -> Result<(String, String, u64), SandboxError> {
        for (idx, stream) in [(0, StreamKind::Stdout), (1, StreamKind::Stderr)] {
            let pending = std::mem::take(&mut self.pending[idx]);
            if !pending.is_empty() {
                self.write_redacted(stream, &pending)?;
            }
        }
        self.out
            .flush()
            .map_err(|e| SandboxError::io("cannot write log", &self.path, e))?;
        Ok((
            self.tails[0].text(self.redactor),
            self.tails[1].text(self.redactor),
            self.written,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_secrets_split_across_chunks_and_keeps_bounded_tails() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.log");
        let red = Redactor::new([("K".to_string(), "supersecret".to_string())]);
        let mut s = LogSink::create(&p, &red, &NoopObserver).unwrap();
        s.push(StreamKind::Stdout, b"key=super").unwrap();
        s.push(StreamKind::Stdout, b"secret\n").unwrap();
        for _ in 0..10_000 {
            s.push(StreamKind::Stderr, b"0123456789\n").unwrap();
        }
        s.push(StreamKind::Stderr, b"last").unwrap();
        let (out, err, n) = s.finish().unwrap();
        let log = std::fs::read_to_string(&p).unwrap();
        assert!(!log.contains("supersecret"));
        assert!(log.contains("key=[REDACTED:K]"));
        assert_eq!(out, "key=[REDACTED:K]\n");
        assert!(err.len() <= TAIL_BYTES);
        assert!(err.ends_with("0123456789\nlast"));
        assert_eq!(n as usize, log.len());
    }
}
