//! An incremental Server-Sent Events parser.
//!
//! Bytes go in as they arrive (chunk boundaries anywhere, even inside a UTF-8
//! character or a `\r\n`); whole events come out. Only the current event is held,
//! and it is bounded: a stream is never buffered whole.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, or `message` when absent.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// The largest event accepted (data of a single event). Model events are a few
/// KiB; a larger one means the stream is not what we think it is.
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a following `\n` belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("SSE event larger than {MAX_EVENT_BYTES} bytes")]
pub struct TooLarge;

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; `out` receives every event they complete.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Event>) -> Result<(), TooLarge> {
        let mut rest = bytes;
        if self.after_cr {
            self.after_cr = false;
            if let Some(b'\n') = rest.first() {
                rest = &rest[1..];
            }
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&rest[..pos]);
            if rest[pos] == b'\r' {
                match rest.get(pos + 1) {
                    Some(b'\n') => rest = &rest[pos + 2..],
                    Some(_) => rest = &rest[pos + 1..],
                    None => {
                        self.after_cr = true;
                        rest = &[];
                    }
                }
            } else {
                rest = &rest[pos + 1..];
            }
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out)?;
            self.line = line;
            self.line.clear();
        }
        self.line.extend_from_slice(rest);
        if self.line.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(TooLarge);
        }
        Ok(())
    }

    /// End of stream: an event without its blank line is dispatched only if the
    /// caller asks (SSE says drop it; some servers forget the final blank line).
    pub fn finish(&mut self, out: &mut Vec<Event>) -> Result<(), TooLarge> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out)?;
        }
        self.dispatch(out);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Event>) -> Result<(), TooLarge> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"event" => self.event = Some(value.into_owned()),
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
                if self.data.len() > MAX_EVENT_BYTES {
                    return Err(TooLarge);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<Event>) {
        if self.has_data {
            out.push(Event {
                event: self.event.take().unwrap_or_else(|| "message".into()),
                data: std::mem::take(&mut self.data),
            });
        }
        self.event = None;
        self.data.clear();
        self.has_data = false;
    }
}

/// A model stream that breaks the size bound failed as a decode would.
impl belay_record::Classify for TooLarge {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Failed
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<Event> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out).unwrap();
        }
        p.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn events_fields_and_comments() {
        let ev = parse_all(&[
            b": keep-alive\n\nevent: response.created\ndata: {\"a\":1}\n\ndata: one\ndata: two\n\n",
        ]);
        assert_eq!(
            ev,
            vec![
                Event {
                    event: "response.created".into(),
                    data: "{\"a\":1}".into()
                },
                Event {
                    event: "message".into(),
                    data: "one\ntwo".into()
                }
            ]
        );
    }

    #[test]
    fn crlf_split_across_chunks() {
        let ev = parse_all(&[b"data: x\r", b"\n\r", b"\ndata: y\r\n\r\n"]);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].data, "x");
        assert_eq!(ev[1].data, "y");
    }

    #[test]
    fn oversized_event_is_refused() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        let big = vec![b'a'; MAX_EVENT_BYTES + 10];
        let mut chunk = b"data: ".to_vec();
        chunk.extend_from_slice(&big);
        assert_eq!(p.feed(&chunk, &mut out), Err(TooLarge));
    }

    proptest! {
        /// Any split of a stream into chunks yields the same events.
        #[test]
        fn chunking_does_not_matter(datas in proptest::collection::vec("[a-z{}\":, ]{0,20}", 1..6), cut in 0usize..200) {
            let mut text = String::new();
            for d in &datas {
                text.push_str("event: e\r\ndata: ");
                text.push_str(d);
                text.push_str("\r\n\r\n");
            }
            let bytes = text.as_bytes();
            let cut = cut.min(bytes.len());
            let whole = parse_all(&[bytes]);
            let split = parse_all(&[&bytes[..cut], &bytes[cut..]]);
            prop_assert_eq!(&whole, &split);
            prop_assert_eq!(whole.len(), datas.len());
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_all(&[&bytes]);
        }
    }
}
