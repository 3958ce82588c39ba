//! Server-sent events: a run's event log, and changes of the registry, both
//! tailed from their files, so that a run another process writes shows up as
//! it happens. Every event of a run carries its `seq` as the SSE `id:`: a
//! browser that reconnects sends `Last-Event-ID` and gets what came after,
//! nothing twice and nothing lost.

use std::convert::Infallible;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use belay_record::Redactor;
use futures_util::Stream;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::api::find;
use crate::state::App;

/// How often a tail looks for more (the page's latency budget is 200 ms).
const POLL: Duration = Duration::from_millis(40);
/// A line longer than this is not an event belay wrote; it is skipped.
const MAX_LINE: usize = 8 << 20;

fn keep_alive() -> KeepAlive {
    KeepAlive::new()
        .interval(Duration::from_secs(10))
        .text("keep-alive")
}

#[derive(Deserialize)]
pub(crate) struct After {
    after: Option<u64>,
}

fn last_event_id(h: &HeaderMap) -> Option<u64> {
    h.get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

pub(crate) async fn events(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    h: HeaderMap,
    Query(q): Query<After>,
) -> Response {
    let e = match find(&app, &id) {
        Ok(e) => e,
        Err(r) => return *r,
    };
    let after = last_event_id(&h).or(q.after).unwrap_or(0);
    let path = e.dir.join(belay_record::EVENTS_FILE);
    Sse::new(tail_events(path, after, app.redactor.clone()))
        .keep_alive(keep_alive())
        .into_response()
}

struct Tail {
    path: PathBuf,
    reader: Option<BufReader<tokio::fs::File>>,
    inode: u64,
    pos: u64,
    line: Vec<u8>,
    /// Inside a line too long to be an event.
    skipping: bool,
    after: u64,
    redactor: Redactor,
}

impl Tail {
    /// The next whole line, waiting for it. A log replaced or cut short is
    /// read again from its start (the `seq` filter drops what was sent).
    async fn next_line(&mut self) -> Vec<u8> {
        loop {
            if self.reader.is_none() {
                // Not through a link: the log is the run's own file.
                let open = tokio::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                    .open(&self.path)
                    .await;
                match open {
                    Ok(f) => {
                        self.inode = f.metadata().await.map(|m| m.ino()).unwrap_or(0);
                        self.reader = Some(BufReader::new(f));
                        self.pos = 0;
                        self.line.clear();
                    }
                    Err(_) => {
                        tokio::time::sleep(POLL).await;
                        continue;
                    }
                }
            }
            let Some(r) = self.reader.as_mut() else {
                continue;
            };
            // Never more than a bounded line in memory: a line longer than
            // MAX_LINE (no event belay writes) is dropped up to its newline.
            let room = (MAX_LINE + 1).saturating_sub(self.line.len()) as u64;
            match tokio::io::AsyncReadExt::take(&mut *r, room.max(1))
                .read_until(b'\n', &mut self.line)
                .await
            {
                Ok(0) | Err(_) => {
                    tokio::time::sleep(POLL).await;
                    if let Ok(m) = tokio::fs::metadata(&self.path).await {
                        if m.ino() != self.inode || m.len() < self.pos {
                            self.reader = None;
                            self.skipping = false;
                        }
                    }
                }
                Ok(n) => {
                    self.pos += n as u64;
                    let whole = self.line.ends_with(b"\n");
                    if whole && !self.skipping {
                        return std::mem::take(&mut self.line);
                    }
                    if whole {
                        // The end of an oversized line.
                        self.skipping = false;
                        self.line.clear();
                    } else if self.line.len() > MAX_LINE {
                        self.skipping = true;
                        self.line = Vec::new();
                    }
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct Seq {
    seq: u64,
}

impl Tail {
    fn new(path: PathBuf, after: u64, redactor: Redactor) -> Tail {
        Tail {
            path,
            reader: None,
            inode: 0,
            pos: 0,
            line: Vec::new(),
            skipping: false,
            after,
            redactor,
        }
    }

    /// The next event after the last one given: its `seq` and its line,
    /// redacted.
    async fn next_event(&mut self) -> (u64, String) {
        loop {
            let line = self.next_line().await;
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            let Ok(s) = serde_json::from_str::<Seq>(text) else {
                continue;
            };
            if s.seq <= self.after {
                continue;
            }
            self.after = s.seq;
            return (s.seq, self.redactor.redact(text).into_owned());
        }
    }
}

fn tail_events(
    path: PathBuf,
    after: u64,
    redactor: Redactor,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let t = Tail::new(path, after, redactor);
    futures_util::stream::unfold((t, true), |(mut t, first)| async move {
        let (seq, data) = t.next_event().await;
        let mut ev = Event::default().id(seq.to_string()).data(data);
        if first {
            // A dropped connection is retried quickly (the default is 3 s).
            ev = ev.retry(Duration::from_millis(500));
        }
        Some((Ok(ev), (t, false)))
    })
}

/// `changed` whenever the registry gains a record (coalesced), so the page
/// reloads its list; a run started by another process appears at once.
pub(crate) async fn registry(State(app): State<Arc<App>>) -> Response {
    let path = app.registry.index();
    let start = std::fs::metadata(&path).map(|m| (m.ino(), m.len())).ok();
    let s = futures_util::stream::unfold((path, start), |(path, last)| async move {
        loop {
            tokio::time::sleep(POLL).await;
            let now = std::fs::metadata(&path).map(|m| (m.ino(), m.len())).ok();
            if now != last {
                let id = now.map(|(_, l)| l).unwrap_or(0);
                let ev = Event::default()
                    .event("changed")
                    .id(id.to_string())
                    .data("runs");
                return Some((Ok::<_, Infallible>(ev), (path, now)));
            }
        }
    });
    Sse::new(s).keep_alive(keep_alive()).into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn a_tail_resumes_after_its_id_and_waits_for_whole_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("events.jsonl");
        let mut f = std::fs::File::create(&p).unwrap();
        writeln!(f, "{{\"seq\":1,\"kind\":\"a\"}}").unwrap();
        writeln!(f, "{{\"seq\":2,\"kind\":\"b\",\"x\":\"tok-123\"}}").unwrap();
        write!(f, "{{\"seq\":3,\"ki").unwrap();
        f.flush().unwrap();
        let red = Redactor::new([("T".to_string(), "tok-123".to_string())]);
        let mut t = Tail::new(p.clone(), 1, red);
        let (seq, text) = t.next_event().await;
        assert_eq!(seq, 2);
        assert!(
            text.contains("[REDACTED:T]") && !text.contains("tok-123"),
            "{text}"
        );
        // The torn third line is not given until it is whole.
        let waited = tokio::time::timeout(Duration::from_millis(200), t.next_event()).await;
        assert!(waited.is_err(), "a torn line was given");
        writeln!(f, "nd\":\"c\"}}").unwrap();
        f.flush().unwrap();
        let (seq, text) = tokio::time::timeout(Duration::from_secs(2), t.next_event())
            .await
            .unwrap();
        assert_eq!((seq, text.as_str()), (3, "{\"seq\":3,\"kind\":\"c\"}"));
        // A log replaced by a new file is read again; what was given is not
        // given twice.
        drop(f);
        std::fs::write(
            &p,
            "{\"seq\":1}\n{\"seq\":2}\n{\"seq\":3}\n{\"seq\":4,\"kind\":\"d\"}\n",
        )
        .unwrap();
        let (seq, _) = tokio::time::timeout(Duration::from_secs(2), t.next_event())
            .await
            .unwrap();
        assert_eq!(seq, 4);
        // A line longer than any event is dropped (never held whole), and
        // the next event comes.
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        let junk = vec![b'x'; MAX_LINE + (1 << 20)];
        f.write_all(b"{\"seq\":5,\"pad\":\"").unwrap();
        f.write_all(&junk).unwrap();
        f.write_all(b"\"}\n{\"seq\":6}\n").unwrap();
        let (seq, _) = tokio::time::timeout(Duration::from_secs(5), t.next_event())
            .await
            .unwrap();
        assert_eq!(seq, 6);
        assert!(
            t.line.capacity() <= MAX_LINE + 2 * (1 << 16),
            "{}",
            t.line.capacity()
        );
    }
}
