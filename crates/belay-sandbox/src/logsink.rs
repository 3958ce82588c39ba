//! Streaming exec output to a log file, with redaction, a size cap and
//! bounded tails.
//!
//! Output is never held whole: bytes are written through to the log as they
//! arrive, and only the last [`TAIL_BYTES`] of each stream are kept in memory.
//! Redaction is a property of the stream, not of lines: stdout and stderr are
//! merged into the log through one [`StreamRedactor`], which holds back only
//! as many bytes as the longest secret form, so a secret split across writes,
//! across the two streams, or printed without a newline is still scrubbed.
//! A log stops growing at its cap; the rest is counted and a marker says so.
//! Each piece of output is on disk when `push` returns, so a log is tailed
//! live while its command runs.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use belay_record::{Redactor, StreamRedactor};

use crate::SandboxError;

/// Bytes of each stream kept for `stdout_tail` / `stderr_tail`.
pub const TAIL_BYTES: usize = 4096;
/// The cap of one exec's log when none is given.
pub const DEFAULT_LOG_LIMIT: u64 = 64 << 20;

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
    /// Whether bytes were dropped off the front (the tail starts mid-stream).
    cut: bool,
}

impl Tail {
    fn new() -> Self {
        Self {
            buf: VecDeque::with_capacity(TAIL_BYTES),
            cut: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let bytes = if bytes.len() > TAIL_BYTES {
            self.cut = true;
            &bytes[bytes.len() - TAIL_BYTES..]
        } else {
            bytes
        };
        let overflow = (self.buf.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        if overflow > 0 {
            self.cut = true;
        }
        self.buf.drain(..overflow);
        self.buf.extend(bytes);
    }

    fn text(&self, redactor: &Redactor) -> String {
        let (a, b) = self.buf.as_slices();
        let mut v = Vec::with_capacity(a.len() + b.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        let s = String::from_utf8_lossy(&v);
        // A secret may be split where the tail starts, or between the two
        // streams where it ends: mask partial forms at both edges.
        redactor.redact_fragment(&s)
    }
}

/// Writes one exec's output to its log file.
pub struct LogSink<'a> {
    path: PathBuf,
    out: BufWriter<File>,
    redactor: &'a Redactor,
    observer: &'a dyn ExecObserver,
    merged: StreamRedactor,
    /// Per stream, so that each tail is redacted as its own stream.
    streams: [StreamRedactor; 2],
    tails: [Tail; 2],
    scratch: Vec<u8>,
    written: u64,
    limit: u64,
    dropped: u64,
}

impl<'a> LogSink<'a> {
    pub fn create(
        path: &Path,
        redactor: &'a Redactor,
        observer: &'a dyn ExecObserver,
    ) -> Result<Self, SandboxError> {
        Self::with_limit(path, redactor, observer, DEFAULT_LOG_LIMIT)
    }

    /// A sink whose log stops at `limit` bytes (0: no cap).
    pub fn with_limit(
        path: &Path,
        redactor: &'a Redactor,
        observer: &'a dyn ExecObserver,
        limit: u64,
    ) -> Result<Self, SandboxError> {
        if let Some(dir) = path.parent() {
            fs_err::create_dir_all(dir)
                .map_err(|e| SandboxError::io("cannot create log directory", dir, e))?;
        }
        let file =
            File::create(path).map_err(|e| SandboxError::io("cannot create log", path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(64 * 1024, file),
            redactor,
            observer,
            merged: StreamRedactor::new(redactor.clone()),
            streams: [
                StreamRedactor::new(redactor.clone()),
                StreamRedactor::new(redactor.clone()),
            ],
            tails: [Tail::new(), Tail::new()],
            scratch: Vec::new(),
            written: 0,
            limit: if limit == 0 { u64::MAX } else { limit },
            dropped: 0,
        })
    }

    /// Append a line of belay's own (a header or a note) to the log.
    pub fn note(&mut self, text: &str) -> Result<(), SandboxError> {
        let line = format!("{}\n", self.redactor.redact(text));
        self.tails[0].push(line.as_bytes());
        self.write_log(line.as_bytes())
    }

    pub fn push(&mut self, stream: StreamKind, bytes: &[u8]) -> Result<(), SandboxError> {
        let idx = stream as usize;
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        self.streams[idx].push(bytes, &mut out);
        self.tails[idx].push(&out);
        out.clear();
        self.merged.push(bytes, &mut out);
        if !out.is_empty() {
            self.observer.output(stream, &out);
        }
        let r = self.write_log(&out);
        self.scratch = out;
        r?;
        // The log is on disk as the output comes (the dashboard tails it
        // live): one write per piece of output, not per 64 KiB.
        self.out
            .flush()
            .map_err(|e| SandboxError::io("cannot write log", &self.path, e))
    }

    fn write_log(&mut self, bytes: &[u8]) -> Result<(), SandboxError> {
        let room = self.limit.saturating_sub(self.written);
        let n = (bytes.len() as u64).min(room) as usize;
        if n > 0 {
            self.out
                .write_all(&bytes[..n])
                .map_err(|e| SandboxError::io("cannot write log", &self.path, e))?;
            self.written += n as u64;
        }
        self.dropped += (bytes.len() - n) as u64;
        Ok(())
    }

    /// Flush everything; returns (stdout tail, stderr tail, bytes written).
    pub fn finish(mut self) -> Result<(String, String, u64), SandboxError> {
        let mut out = Vec::new();
        for idx in 0..2 {
            out.clear();
            self.streams[idx].finish(&mut out);
            self.tails[idx].push(&out);
        }
        out.clear();
        self.merged.finish(&mut out);
        if !out.is_empty() {
            self.observer.output(StreamKind::Stdout, &out);
        }
        self.write_log(&out)?;
        if self.dropped > 0 {
            let marker = format!(
                "\n[belay] log truncated at {} bytes; {} more bytes were not kept (the cap is isolation.log_limit)\n",
                self.written, self.dropped
            );
            self.out
                .write_all(marker.as_bytes())
                .map_err(|e| SandboxError::io("cannot write log", &self.path, e))?;
            self.written += marker.len() as u64;
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_piece_is_on_disk_when_push_returns() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("live.log");
        let red = Redactor::new([("K".to_string(), "hunter2-secret".to_string())]);
        let mut s = LogSink::create(&p, &red, &NoopObserver).unwrap();
        s.push(StreamKind::Stdout, b"tick 1\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"tick 1\n");
        s.push(StreamKind::Stderr, b"tick 2\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"tick 1\ntick 2\n");
        s.finish().unwrap();
    }

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

    #[test]
    fn halves_on_two_streams_without_newlines_are_scrubbed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.log");
        let red = Redactor::new([("K".to_string(), "canary-split-4242".to_string())]);
        let mut s = LogSink::create(&p, &red, &NoopObserver).unwrap();
        s.push(StreamKind::Stdout, &vec![b'a'; 65530]).unwrap();
        s.push(StreamKind::Stdout, b"canary-").unwrap();
        s.push(StreamKind::Stderr, b"split-4242").unwrap();
        let (out, err, _) = s.finish().unwrap();
        let log = std::fs::read_to_string(&p).unwrap();
        assert!(log.ends_with("[REDACTED:K]"), "{}", &log[log.len() - 40..]);
        assert!(
            !out.contains("canary-") && !err.contains("split-4242"),
            "{out} / {err}"
        );
    }

    #[test]
    fn a_log_stops_at_its_cap_with_a_marker() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.log");
        let red = Redactor::default();
        let mut s = LogSink::with_limit(&p, &red, &NoopObserver, 1000).unwrap();
        for _ in 0..100 {
            s.push(StreamKind::Stdout, &[b'x'; 100]).unwrap();
        }
        s.push(StreamKind::Stdout, b"the end").unwrap();
        let (out, _, n) = s.finish().unwrap();
        let log = std::fs::read_to_string(&p).unwrap();
        assert!(log.len() < 1200 && n as usize == log.len(), "{}", log.len());
        assert!(log.contains("[belay] log truncated at 1000 bytes; 9007 more bytes"));
        assert!(out.ends_with("the end"), "the tail still shows the end");
    }
}
