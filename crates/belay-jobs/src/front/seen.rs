//! The chat messages already made into jobs (by sender and message id),
//! kept on disk, bounded: a message the server delivers again after a
//! reconnect, or after belay's restart, makes no second job.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// How many message ids are remembered.
pub const KEEP: usize = 5_000;

pub struct Seen {
    path: PathBuf,
    keys: VecDeque<String>,
}

impl Seen {
    pub fn load(path: &Path) -> Seen {
        // host-owned: the queue's xmpp-seen.json (0700, belay's own).
        let keys = fs_err::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<VecDeque<String>>(&t).ok())
            .unwrap_or_default();
        Seen {
            path: path.to_path_buf(),
            keys,
        }
    }

    fn key(from: &str, id: &str) -> String {
        let mut id = id.to_string();
        id.truncate(256);
        format!("{from}\u{0}{id}")
    }

    /// Whether the message was taken before.
    pub fn contains(&self, from: &str, id: &str) -> bool {
        self.keys.contains(&Self::key(from, id))
    }

    /// Remember the message as taken.
    pub fn remember(&mut self, from: &str, id: &str) {
        let key = Self::key(from, id);
        if self.keys.contains(&key) {
            return;
        }
        self.keys.push_back(key);
        while self.keys.len() > KEEP {
            self.keys.pop_front();
        }
        if let Err(e) = belay_record::write_json_atomic(&self.path, &self.keys) {
            tracing::warn!("cannot save the seen messages: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_message_id_is_taken_once_even_after_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("seen.json");
        let mut s = super::Seen::load(&p);
        assert!(!s.contains("a@x", "m1"));
        s.remember("a@x", "m1");
        assert!(s.contains("a@x", "m1"));
        assert!(!s.contains("b@x", "m1"));
        let again = super::Seen::load(&p);
        assert!(again.contains("a@x", "m1"));
    }
}
