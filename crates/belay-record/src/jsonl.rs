use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{RecordError, Redactor};

/// An append-only JSON Lines file. Each record is serialised whole, redacted, and
/// written with a single `write_all` of one line, so a crash can at worst lose the
/// last line; it never interleaves or tears earlier ones. Records are appended,
/// never rewritten: the file grows linearly with the run.
#[derive(Debug)]
pub struct JsonlAppender {
    path: PathBuf,
    file: File,
}

impl JsonlAppender {
    /// Open for appending. A last line torn by a kill mid-write is closed
    /// with a newline first, so it cannot swallow the next record.
    pub fn open(path: &Path) -> Result<Self, RecordError> {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(|e| RecordError::io("cannot open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| RecordError::io("cannot stat", path, e))?
            .len();
        if len > 0 {
            use std::io::{Read, Seek, SeekFrom};
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1))
                .and_then(|_| file.read_exact(&mut last))
                .map_err(|e| RecordError::io("cannot read", path, e))?;
            if last[0] != b'\n' {
                file.write_all(b"\n")
                    .map_err(|e| RecordError::io("cannot append to", path, e))?;
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Append one record and make it durable.
    pub fn append<T: Serialize>(
        &mut self,
        record: &T,
        redactor: &Redactor,
    ) -> Result<(), RecordError> {
        self.append_line(record, redactor)?;
        self.sync()
    }

    /// Append one record (one `write` of one whole line, which survives a
    /// kill of this process; [`Self::sync`] makes it survive a machine crash
    /// too). The line as written, without its newline.
    pub fn append_line<T: Serialize>(
        &mut self,
        record: &T,
        redactor: &Redactor,
    ) -> Result<String, RecordError> {
        let json_err = |source| RecordError::Json {
            path: self.path.clone(),
            source,
        };
        // Redacted as a value first (escaping cannot hide a secret), then as
        // text (a secret split over two fields).
        let mut value = serde_json::to_value(record).map_err(json_err)?;
        redactor.redact_value(&mut value);
        let line = serde_json::to_string(&value).map_err(json_err)?;
        let mut line = redactor.redact(&line).into_owned();
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|e| RecordError::io("cannot append to", &self.path, e))?;
        line.pop();
        Ok(line)
    }

    pub fn sync(&mut self) -> Result<(), RecordError> {
        self.file
            .sync_data()
            .map_err(|e| RecordError::io("cannot sync", &self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_whole_lines_and_redacts() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events.jsonl");
        let red = Redactor::new([("TOKEN".to_string(), "s3cr3t-value".to_string())]);
        let mut w = JsonlAppender::open(&p).unwrap();
        w.append(
            &serde_json::json!({"a": 1, "msg": "uses s3cr3t-value"}),
            &red,
        )
        .unwrap();
        drop(w);
        let mut w = JsonlAppender::open(&p).unwrap();
        w.append(&serde_json::json!({"a": 2}), &red).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(!text.contains("s3cr3t-value"));
        assert!(lines[0].contains("[REDACTED:TOKEN]"));
    }
}
