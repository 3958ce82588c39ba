//! Messages for people: written to the queue's `outbox/` (redacted, one
//! file each), and sent by the chat front end when it is connected, in
//! order, so that a reply made while the connection is down, or by another
//! process (`belay jobs accept` on the command line), still arrives.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::JobsError;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    pub to: String,
    pub text: String,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct Outbox {
    dir: PathBuf,
    redactor: belay_record::Redactor,
    /// Whether a chat front end is configured to send what is queued
    /// (without one, messages are logged, not kept).
    chat: bool,
}

/// Is `who` a chat address (the others are the command line and tools,
/// which read their answers from the records)?
pub fn is_chat_address(who: &str) -> bool {
    who.contains('@') && !who.starts_with("http:")
}

impl Outbox {
    pub fn new(dir: &Path, redactor: belay_record::Redactor, chat: bool) -> Outbox {
        Outbox {
            dir: dir.to_path_buf(),
            redactor,
            chat,
        }
    }

    /// Queue `text` for `to`; a recipient that is no chat address is
    /// logged instead.
    pub fn send(&self, to: &str, text: &str) -> Result<(), JobsError> {
        let text = self.redactor.redact(text).into_owned();
        if !is_chat_address(to) || !self.chat {
            tracing::info!("reply for {to}: {text}");
            return Ok(());
        }
        let m = Message {
            to: to.to_string(),
            text,
            created_at: belay_record::now_rfc3339(),
        };
        let name = format!(
            "{:016}-{:08x}.json",
            belay_record::unix_millis(),
            fastrand::u32(..)
        );
        belay_record::write_json_atomic(&self.dir.join(name), &m)?;
        Ok(())
    }

    /// The queued messages, oldest first, with their files.
    pub fn pending(&self) -> Vec<(PathBuf, Message)> {
        // host-owned: the queue's outbox/ (0700, belay's own).
        let Ok(rd) = fs_err::read_dir(&self.dir) else {
            return vec![];
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "json")
                    && !p
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        files.sort();
        files
            .into_iter()
            .filter_map(|p| {
                // host-owned: a message of the queue's outbox/ (0700, belay's own).
                let m = fs_err::read_to_string(&p)
                    .ok()
                    .and_then(|t| serde_json::from_str::<Message>(&t).ok());
                match m {
                    Some(m) => Some((p, m)),
                    None => {
                        let _ = fs_err::remove_file(&p);
                        None
                    }
                }
            })
            .collect()
    }

    /// A message was sent.
    pub fn done(&self, file: &Path) {
        let _ = fs_err::remove_file(file);
    }
}
