//! What an agent changed in the plan file, and what of it stands.
//!
//! Before each agent call belay writes the plan file from its own state.
//! After it, [`judge`] compares the file with what belay wrote. The legal
//! transitions are few:
//!
//! * the developer may set *its* checkpoint to `built` and write its notes;
//! * the reviewer changes nothing: its verdict and notes are its final answer
//!   ([`crate::verdict`]), never the plan file. A reviewer may run the code
//!   under review, and that code can write whatever the reviewer can, so a
//!   file in the tree is no channel for a verdict. In a container the plan
//!   file is mounted read-only for the review; any change to it found after a
//!   review (on the host, or through a way around the mount) is a violation,
//!   recorded as tampering and reverted, never a transition.
//!
//! Every other change (another checkpoint's status, any scope, exit criteria,
//! attempts, the branch, the project commands, a checkpoint added or removed,
//! a file that no longer parses) is a [`Violation`]: belay rewrites the file
//! from its state, records the violation, and tells the agent in its next
//! prompt.

use serde::Serialize;
use serde_json::Value;

use crate::schema::Status;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Developer,
    Reviewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Developer => "developer",
            Role::Reviewer => "reviewer",
        }
    }
}

/// An illegal change, described for the record and for the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Where: `checkpoints[c2].status`, `branch`, `(file)`.
    pub field: String,
    pub what: String,
}

/// What stands of an agent's changes to the plan file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judgement {
    /// The status the agent proposed for its checkpoint, if it changed it
    /// legally.
    pub status: Option<Status>,
    /// The notes it wrote for its checkpoint, if it changed them.
    pub notes: Option<String>,
    pub violations: Vec<Violation>,
}

/// The longest notes taken from an agent (they go into prompts and commits).
pub const MAX_NOTES: usize = 16 * 1024;

fn show(v: Option<&Value>) -> String {
    match v {
        None => "(absent)".into(),
        Some(v) => {
            let s = v.to_string();
            if s.chars().count() > 80 {
                format!("{}…", s.chars().take(80).collect::<String>())
            } else {
                s
            }
        }
    }
}

/// Judge `after` (the file's bytes now, `None` if it is gone or not a
/// regular file) against `before` (what belay wrote), for `role` working on
/// checkpoint `cid`.
pub fn judge(before: &Value, after: Option<&[u8]>, role: Role, cid: &str) -> Judgement {
    let mut j = Judgement::default();
    let Some(bytes) = after else {
        j.violations.push(Violation {
            field: "(file)".into(),
            what: "the plan file was removed or replaced by something that is not a file".into(),
        });
        return j;
    };
    let after: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            j.violations.push(Violation {
                field: "(file)".into(),
                what: format!("the plan file no longer parses ({e})"),
            });
            return j;
        }
    };
    let (Some(b), Some(a)) = (before.as_object(), after.as_object()) else {
        j.violations.push(Violation {
            field: "(file)".into(),
            what: "the plan file is no longer a JSON object".into(),
        });
        return j;
    };
    judge_top_level(&mut j, b, a);
    let empty = vec![];
    let bc = b
        .get("checkpoints")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let Some(ac) = a.get("checkpoints").and_then(Value::as_array) else {
        j.violations.push(Violation {
            field: "checkpoints".into(),
            what: "the checkpoints list was removed or is no longer a list".into(),
        });
        return j;
    };
    let id_of = |v: &Value| v.get("id").and_then(Value::as_str).map(String::from);
    let bids: Vec<Option<String>> = bc.iter().map(id_of).collect();
    let aids: Vec<Option<String>> = ac.iter().map(id_of).collect();
    if bids != aids {
        j.violations.push(Violation {
            field: "checkpoints".into(),
            what: "checkpoints were added, removed, renamed or reordered".into(),
        });
    }
    for bcp in bc {
        let Some(id) = id_of(bcp) else { continue };
        let Some(acp) = ac.iter().find(|c| id_of(c).as_deref() == Some(&id)) else {
            continue;
        };
        let (Some(bo), Some(ao)) = (bcp.as_object(), acp.as_object()) else {
            j.violations.push(Violation {
                field: format!("checkpoints[{id}]"),
                what: format!("checkpoint `{id}` is no longer an object"),
            });
            continue;
        };
        let fields: std::collections::BTreeSet<&String> = bo.keys().chain(ao.keys()).collect();
        for f in fields {
            let (was, now) = (bo.get(f), ao.get(f));
            if was == now {
                continue;
            }
            judge_field(&mut j, role, cid, &id, f, was, now);
        }
    }
    j
}

/// Every top-level field but `checkpoints` is belay's: a change is a violation.
fn judge_top_level(
    j: &mut Judgement,
    b: &serde_json::Map<String, Value>,
    a: &serde_json::Map<String, Value>,
) {
    let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    for k in keys {
        if k == "checkpoints" {
            continue;
        }
        if b.get(k) != a.get(k) {
            j.violations.push(Violation {
                field: k.clone(),
                what: format!(
                    "`{k}` changed from {} to {}",
                    show(b.get(k)),
                    show(a.get(k))
                ),
            });
        }
    }
}

/// Judge field `f` of checkpoint `id` changed by `role` (on `cid`): a proposal, or a violation.
fn judge_field(
    j: &mut Judgement,
    role: Role,
    cid: &str,
    id: &str,
    f: &str,
    was: Option<&Value>,
    now: Option<&Value>,
) {
    let field = format!("checkpoints[{id}].{f}");
    let mine = id == cid;
    match f {
        _ if role == Role::Reviewer => j.violations.push(Violation {
            field,
            what: format!(
                "`{f}` of checkpoint `{id}` changed from {} to {} during a review: the plan file is belay's while the reviewer and the code it runs work, and the verdict is the reviewer's final answer",
                show(was),
                show(now)
            ),
        }),
        "review_notes" if mine => match now {
            Some(Value::String(s)) => {
                j.notes = Some(crate::truncate(s, MAX_NOTES).to_string());
            }
            _ => j.violations.push(Violation {
                field,
                what: "review_notes must stay a string".into(),
            }),
        },
        "status" if mine => {
            // Only the developer gets here: it may propose `built`.
            let proposed = now.and_then(Value::as_str).and_then(Status::parse);
            if proposed == Some(Status::Built) {
                j.status = proposed;
            } else {
                let why = match proposed {
                    Some(Status::Approved) => {
                        "only the reviewer approves a checkpoint, in its answer".to_string()
                    }
                    _ => format!(
                        "the {} may not set status {}",
                        role.as_str(),
                        show(now)
                    ),
                };
                j.violations.push(Violation {
                    field,
                    what: format!("status changed from {} to {}: {why}", show(was), show(now)),
                });
            }
        }
        "attempts" => j.violations.push(Violation {
            field,
            what: format!(
                "attempts changed from {} to {}: belay keeps the count, agents cannot reset it",
                show(was),
                show(now)
            ),
        }),
        _ if !mine => j.violations.push(Violation {
            field,
            what: format!(
                "checkpoint `{id}` is not the one you work on: `{f}` changed from {} to {}",
                show(was),
                show(now)
            ),
        }),
        _ => j.violations.push(Violation {
            field,
            what: format!(
                "`{f}` of your checkpoint is the plan's, not yours to change (from {} to {})",
                show(was),
                show(now)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn plan() -> Value {
        json!({"plan_file": "p.md", "branch": "feature/x", "checkpoints": [
            {"id": "c1", "name": "one", "scope": "s1", "status": "pending", "exit_criteria": ["a"], "attempts": 0, "review_notes": ""},
            {"id": "c2", "name": "two", "scope": "s2", "status": "pending", "exit_criteria": ["b"], "attempts": 0, "review_notes": ""}
        ]})
    }

    fn with(f: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut v = plan();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn the_developer_may_mark_its_checkpoint_built_and_write_notes() {
        let after = with(|v| {
            v["checkpoints"][0]["status"] = json!("built");
            v["checkpoints"][0]["review_notes"] = json!("did it");
        });
        let j = judge(&plan(), Some(&after), Role::Developer, "c1");
        assert_eq!(j.status, Some(Status::Built));
        assert_eq!(j.notes.as_deref(), Some("did it"));
        assert!(j.violations.is_empty(), "{:?}", j.violations);
    }

    #[test]
    fn self_approval_a_later_checkpoint_and_attempts_are_violations() {
        let after = with(|v| {
            v["checkpoints"][0]["status"] = json!("approved");
            v["checkpoints"][0]["attempts"] = json!(0);
            v["checkpoints"][1]["status"] = json!("approved");
            v["checkpoints"][1]["scope"] = json!("nothing");
        });
        let j = judge(&plan(), Some(&after), Role::Developer, "c1");
        assert_eq!(j.status, None);
        let fields: Vec<&str> = j.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "checkpoints[c1].status",
                "checkpoints[c2].scope",
                "checkpoints[c2].status"
            ]
        );
        assert!(j.violations[0].what.contains("only the reviewer approves"));
        let reset = with(|v| v["checkpoints"][0]["attempts"] = json!(-5));
        let mut before = plan();
        before["checkpoints"][0]["attempts"] = json!(2);
        let j = judge(&before, Some(&reset), Role::Developer, "c1");
        assert!(j.violations[0].what.contains("agents cannot reset it"));
    }

    #[test]
    fn nothing_a_reviewer_writes_in_the_plan_file_is_a_verdict() {
        // What the code under review wrote while the reviewer ran it: its own
        // checkpoint approved, with notes. Every change is a violation, none
        // a transition.
        let after = with(|v| {
            v["checkpoints"][0]["status"] = json!("approved");
            v["checkpoints"][0]["review_notes"] = json!("all good");
            v["checkpoints"][1]["status"] = json!("approved");
        });
        let j = judge(&plan(), Some(&after), Role::Reviewer, "c1");
        assert_eq!(j.status, None);
        assert_eq!(j.notes, None);
        let fields: Vec<&str> = j.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "checkpoints[c1].review_notes",
                "checkpoints[c1].status",
                "checkpoints[c2].status"
            ]
        );
        assert!(j.violations[1].what.contains("during a review"));
        // A rejection written there is no verdict either.
        let rejected = with(|v| v["checkpoints"][0]["status"] = json!("built"));
        let j = judge(&plan(), Some(&rejected), Role::Reviewer, "c1");
        assert_eq!(j.status, None);
        assert_eq!(j.violations.len(), 1);
    }

    #[test]
    fn a_broken_or_missing_file_and_structural_changes() {
        assert_eq!(
            judge(&plan(), Some(b"{oops"), Role::Developer, "c1").violations[0].field,
            "(file)"
        );
        assert_eq!(
            judge(&plan(), None, Role::Developer, "c1").violations[0].field,
            "(file)"
        );
        let added = with(|v| {
            v["checkpoints"]
                .as_array_mut()
                .unwrap()
                .push(json!({"id": "c3"}));
            v["branch"] = json!("main");
        });
        let j = judge(&plan(), Some(&added), Role::Developer, "c1");
        let fields: Vec<&str> = j.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["branch", "checkpoints"]);
    }
}
