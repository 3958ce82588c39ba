//! What a sender's next job carries: the last answer (or interim report)
//! they were given, per sender and board, until they reset it; and whether
//! a sender has had the first-reply notice.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::queue::Queue;
use crate::JobsError;

/// The most of a previous answer a job carries (its end).
pub const MAX_CONTEXT_CHARS: usize = 6_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Carried {
    pub sender: String,
    #[serde(default)]
    pub board_slug: Option<String>,
    pub job_id: String,
    pub text: String,
    pub updated_at: String,
}

fn key(parts: &[&str]) -> String {
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    hex::encode(&h.finalize()[..12])
}

fn path(q: &Queue, sender: &str, board: Option<&str>) -> PathBuf {
    q.sub("contexts")
        .join(format!("{}.json", key(&[sender, board.unwrap_or("")])))
}

fn introduced_path(q: &Queue, sender: &str) -> PathBuf {
    q.sub("contexts")
        .join(format!("{}.introduced", key(&[sender])))
}

/// The context a sender's next job carries, if any.
pub fn load(q: &Queue, sender: &str, board: Option<&str>) -> Option<Carried> {
    // host-owned: the queue's contexts/ (0700, belay's own).
    let text = fs_err::read_to_string(path(q, sender, board)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Keep `text` (its end) for the sender's next job.
pub fn save(
    q: &Queue,
    sender: &str,
    board: Option<&str>,
    job_id: &str,
    text: &str,
    redactor: &belay_record::Redactor,
) -> Result<(), JobsError> {
    let text = redactor.redact(text);
    let text = belay_agent::checks::last_chars(&text, MAX_CONTEXT_CHARS);
    let c = Carried {
        sender: sender.to_string(),
        board_slug: board.map(str::to_string),
        job_id: job_id.to_string(),
        text,
        updated_at: belay_record::now_rfc3339(),
    };
    belay_record::write_json_atomic(&path(q, sender, board), &c)?;
    Ok(())
}

/// Drop every context of `sender` (all boards); how many there were.
pub fn reset(q: &Queue, sender: &str) -> Result<usize, JobsError> {
    let dir = q.sub("contexts");
    let mut n = 0;
    // host-owned: the queue's contexts/ (0700, belay's own).
    for e in fs_err::read_dir(&dir)
        .map_err(|e| JobsError::io("read", &dir, e))?
        .flatten()
    {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        // host-owned: a file of the queue's contexts/ (0700, belay's own).
        let Ok(text) = fs_err::read_to_string(&p) else {
            continue;
        };
        if serde_json::from_str::<Carried>(&text).is_ok_and(|c| c.sender == sender) {
            fs_err::remove_file(&p).map_err(|e| JobsError::io("remove", &p, e))?;
            n += 1;
        }
    }
    Ok(n)
}

/// Has the sender had the first-reply notice?
pub fn introduced(q: &Queue, sender: &str) -> bool {
    introduced_path(q, sender).exists()
}

/// Mark the sender as told (after the reply went out).
pub fn mark_introduced(q: &Queue, sender: &str) -> Result<(), JobsError> {
    belay_record::atomic_write(&introduced_path(q, sender), sender.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_is_per_sender_and_board_and_reset_drops_all_of_a_sender() {
        let d = tempfile::tempdir().unwrap();
        let q = Queue::open(d.path()).unwrap();
        let r = belay_record::Redactor::new([("K".to_string(), "sk-secret-123456".to_string())]);
        save(&q, "a@x", None, "j1", "answer with sk-secret-123456", &r).unwrap();
        save(&q, "a@x", Some("b1"), "j2", "board answer", &r).unwrap();
        save(&q, "b@x", None, "j3", "other", &r).unwrap();
        let c = load(&q, "a@x", None).unwrap();
        assert!(!c.text.contains("sk-secret-123456"), "{}", c.text);
        assert_eq!(load(&q, "a@x", Some("b1")).unwrap().job_id, "j2");
        assert_eq!(reset(&q, "a@x").unwrap(), 2);
        assert!(load(&q, "a@x", None).is_none() && load(&q, "a@x", Some("b1")).is_none());
        assert!(load(&q, "b@x", None).is_some());
        assert!(!introduced(&q, "a@x"));
        mark_introduced(&q, "a@x").unwrap();
        assert!(introduced(&q, "a@x"));
    }
}
