//! Chat commands, in German as in the seed and in English: what a message
//! asks for, and the answer. Gates are the owner's alone; `/reset` is every
//! sender's for their own context.
//!
//! The same parser serves every chat front end. A gate's id is parsed by
//! the one validator of ids before a gate sees it, and a reply names ids
//! and gives a short reason: never a path of the host.

use belay_record::{Id, IdError};

use crate::gates;
use crate::queue::{Dir, Queue};
use crate::services::Services;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Accept(Option<String>),
    Decline(Option<String>),
    Approve(Option<String>),
    Discard(Option<String>),
    Requeue(Option<String>),
    Reset,
    Status,
    Jobs,
    Help,
    Unknown(String),
    /// Not a command: a request for the builder.
    Request,
}

/// What a message body is.
pub fn parse(body: &str) -> Command {
    let t = body.trim();
    if !t.starts_with('/') {
        return Command::Request;
    }
    let mut words = t.splitn(2, char::is_whitespace);
    let verb = words.next().unwrap_or_default().to_lowercase();
    let arg = words
        .next()
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| a.split_whitespace().next().unwrap_or(a).to_string());
    match verb.as_str() {
        "/annehmen" | "/accept" => Command::Accept(arg),
        "/ablehnen" | "/decline" => Command::Decline(arg),
        "/freigeben" | "/approve" => Command::Approve(arg),
        "/verwerfen" | "/discard" => Command::Discard(arg),
        "/wiederholen" | "/requeue" => Command::Requeue(arg),
        "/neu" | "/reset" => Command::Reset,
        "/status" => Command::Status,
        "/jobs" => Command::Jobs,
        "/help" | "/hilfe" => Command::Help,
        _ => Command::Unknown(verb),
    }
}

const HELP: &str = "Send a request and I build it. /status: the queue. /jobs: your jobs, waiting and recent. /reset (/neu): drop the carried context. The owner also has /accept, /decline (/annehmen, /ablehnen) for requests from others, /approve, /discard (/freigeben, /verwerfen) for commits waiting for approval, and /requeue (/wiederholen) for a failed job.";

/// How many finished jobs `/jobs` shows.
const RECENT: usize = 10;

/// The state of the queue, in one message.
pub fn status(q: &Queue) -> String {
    let mut parts = Vec::new();
    for d in Dir::ALL {
        let n = q.list(d).map(|l| l.len()).unwrap_or(0);
        parts.push(format!("{}: {n}", d.as_str()));
    }
    let running: Vec<String> = q
        .list(Dir::Processing)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    let mut s = format!("Queue: {}.", parts.join(", "));
    if !running.is_empty() {
        s.push_str(&format!(" Running: {}.", running.join(", ")));
    }
    s
}

/// The jobs of `who` (an owner sees all): those in the queue, then the
/// last finished ones with how each ended, newest last.
pub fn jobs(svc: &Services, who: &str) -> String {
    let owner = svc.cfg.is_owner(who);
    let mut lines = Vec::new();
    let mut queued = std::collections::HashSet::new();
    for d in Dir::ALL {
        for p in svc.queue.list(d).unwrap_or_default() {
            let Ok(j) = Queue::read(&p) else { continue };
            if owner || j.sender == who || j.requester() == who {
                queued.insert(j.id.to_string());
                lines.push(format!("{} [{}] {}", j.id, d.as_str(), j.preview(60)));
            }
        }
    }
    let done: Vec<_> = crate::record::finished(&svc.queue.sub("done"))
        .into_iter()
        .filter(|r| !queued.contains(&r.job_id))
        .filter(|r| owner || r.requested_by.as_deref() == Some(who))
        .collect();
    let recent = &done[done.len().saturating_sub(RECENT)..];
    let mut out = if lines.is_empty() {
        "No jobs waiting.".to_string()
    } else {
        format!("Waiting:\n{}", lines.join("\n"))
    };
    if !recent.is_empty() {
        out.push_str(&format!(
            "\nRecent ({} of {} finished):",
            recent.len(),
            done.len()
        ));
        for r in recent {
            let first = r
                .report
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            out.push_str(&format!(
                "\n{} [{}] {} {}",
                r.job_id,
                r.status.as_str(),
                r.completed_at
                    .get(..16)
                    .unwrap_or(&r.completed_at)
                    .replace('T', " "),
                crate::public::without_paths(
                    &belay_record::printable_line(first)
                        .chars()
                        .take(80)
                        .collect::<String>()
                )
            ));
        }
    }
    out
}

/// Why a gate command is refused before the gate sees it; the text is the
/// chat's reply.
#[derive(Debug, thiserror::Error)]
enum GateRefused {
    #[error("Only the owner may use {verb}.")]
    NotOwner { verb: String },
    #[error("Give the job id, e.g. `{verb} <id>`.")]
    NoId { verb: String },
    /// The id is no id (the validator's reason, quoted escaped and short).
    #[error("{0}.")]
    BadId(#[source] IdError),
}

/// Why a chat command did nothing: its reply names ids and gives a short
/// reason, never a host path.
#[derive(Debug, thiserror::Error)]
enum ChatError {
    #[error(transparent)]
    Refused(#[from] GateRefused),
    #[error("{}", .0.reply())]
    Gate(#[from] crate::JobsError),
}

/// The job id a gate command names, parsed by the one validator: a reply
/// when there is none, or when it is no id (quoted escaped and short).
fn need_id(verb: &str, id: &Option<String>) -> Result<Id, GateRefused> {
    let raw = id.as_deref().ok_or_else(|| GateRefused::NoId {
        verb: verb.to_string(),
    })?;
    Id::parse("job", raw).map_err(GateRefused::BadId)
}

/// Answer a command from `from`; `None` for a request.
pub async fn handle(svc: &Services, from: &str, cmd: &Command) -> Option<String> {
    let gate = |verb: &str, id: &Option<String>| -> Result<Id, GateRefused> {
        if !svc.cfg.is_owner(from) {
            return Err(GateRefused::NotOwner {
                verb: verb.to_string(),
            });
        }
        need_id(verb, id)
    };
    let r: Result<String, ChatError> = match cmd {
        Command::Request => return None,
        Command::Help => Ok(HELP.into()),
        Command::Unknown(v) => Ok(format!("Unknown command {v}. {HELP}")),
        Command::Status => Ok(status(&svc.queue)),
        Command::Jobs => Ok(jobs(svc, from)),
        Command::Reset => gates::reset(svc, from).map_err(ChatError::from),
        Command::Accept(id) => match gate("/accept", id) {
            Ok(id) => gates::accept(svc, &id, from).map_err(ChatError::from),
            Err(e) => Err(e.into()),
        },
        Command::Decline(id) => match gate("/decline", id) {
            Ok(id) => gates::decline(svc, &id, from).map_err(ChatError::from),
            Err(e) => Err(e.into()),
        },
        Command::Approve(id) => match gate("/approve", id) {
            Ok(id) => gates::approve(svc, &id, from)
                .await
                .map_err(ChatError::from),
            Err(e) => Err(e.into()),
        },
        Command::Requeue(id) => match gate("/requeue", id) {
            Ok(id) => gates::requeue(svc, &id, from).map_err(ChatError::from),
            Err(e) => Err(e.into()),
        },
        Command::Discard(id) => match gate("/discard", id) {
            Ok(id) => gates::discard(svc, &id, from)
                .await
                .map_err(ChatError::from),
            Err(e) => Err(e.into()),
        },
    };
    Some(r.unwrap_or_else(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn german_and_english_commands_parse_alike() {
        assert_eq!(
            parse("/annehmen j1 please"),
            Command::Accept(Some("j1".into()))
        );
        assert_eq!(parse("/accept"), Command::Accept(None));
        assert_eq!(
            parse("  /Freigeben j2"),
            Command::Approve(Some("j2".into()))
        );
        assert_eq!(parse("/verwerfen j3"), Command::Discard(Some("j3".into())));
        assert_eq!(parse("/ablehnen j4"), Command::Decline(Some("j4".into())));
        assert_eq!(parse("/neu"), Command::Reset);
        assert_eq!(parse("/reset"), Command::Reset);
        assert_eq!(parse("/status"), Command::Status);
        assert_eq!(parse("/requeue j5"), Command::Requeue(Some("j5".into())));
        assert_eq!(
            parse("/Wiederholen j5"),
            Command::Requeue(Some("j5".into()))
        );
        assert_eq!(parse("/x"), Command::Unknown("/x".into()));
        assert_eq!(parse("fix the title /approve j1"), Command::Request);
    }

    #[test]
    fn a_gate_id_is_parsed_by_the_one_validator() {
        assert_eq!(
            need_id("/accept", &Some("j1".into())).unwrap().as_str(),
            "j1"
        );
        for bad in [
            "../../x",
            "../../../tmp/site/evil",
            "/etc/passwd",
            ".x",
            "a..b",
        ] {
            let e = need_id("/accept", &Some(bad.into()))
                .unwrap_err()
                .to_string();
            assert!(e.contains("is not a valid id"), "{bad}: {e}");
        }
        assert!(need_id("/accept", &None)
            .unwrap_err()
            .to_string()
            .contains("Give the job id"));
    }
}
