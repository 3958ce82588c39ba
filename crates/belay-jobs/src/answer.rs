//! What an agent's answer may carry to the host: a commit block (the only
//! way to a commit) and, from a fixer, exactly one FIX_RESULT block. Both are
//! parsed strictly from the whole answer (never a truncated one): the
//! answer is untrusted text.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const COMMIT_START: &str = "===COMMIT-MESSAGE===";
pub const COMMIT_END: &str = "===END-COMMIT-MESSAGE===";
pub const FIX_START: &str = "===FIX_RESULT===";
pub const FIX_END: &str = "===END_FIX_RESULT===";

/// The longest commit message taken from an answer.
pub const MAX_MESSAGE_CHARS: usize = 10_000;
/// The longest FIX_RESULT summary.
pub const MAX_SUMMARY_CHARS: usize = 2_000;

/// An answer's commit block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitBlock {
    /// The answer without the block (what the sender is shown).
    pub text: String,
    /// The message, when there is exactly one well-formed block.
    pub message: Option<String>,
    /// Why a block that is there was not taken.
    pub problem: Option<String>,
}

/// Every `start … end` span of `s`: (start of the start marker, end of the
/// end marker, the inner text); an unterminated start is reported.
fn blocks<'a>(s: &'a str, start: &str, end: &str) -> (Vec<(usize, usize, &'a str)>, bool) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = s[at..].find(start) {
        let b = at + i;
        let inner_from = b + start.len();
        match s[inner_from..].find(end) {
            Some(j) => {
                let e = inner_from + j + end.len();
                out.push((b, e, &s[inner_from..inner_from + j]));
                at = e;
            }
            None => return (out, true),
        }
    }
    (out, false)
}

fn remove(s: &str, spans: &[(usize, usize, &str)]) -> String {
    let mut out = String::new();
    let mut at = 0;
    for (b, e, _) in spans {
        out.push_str(&s[at..*b]);
        at = *e;
    }
    out.push_str(&s[at..]);
    out.trim().to_string()
}

/// The commit block of `answer`: exactly one, with a message that is not
/// blank. Two blocks are ambiguous and give none.
pub fn commit_block(answer: &str) -> CommitBlock {
    let (spans, unterminated) = blocks(answer, COMMIT_START, COMMIT_END);
    let text = remove(answer, &spans);
    let problem = |p: String| CommitBlock {
        text: text.clone(),
        message: None,
        problem: Some(p),
    };
    if unterminated {
        return problem(format!(
            "the answer opens a commit block ({COMMIT_START}) and never closes it ({COMMIT_END}); nothing was committed"
        ));
    }
    match spans.as_slice() {
        [] => CommitBlock {
            text,
            message: None,
            problem: None,
        },
        [(_, _, inner)] => {
            let msg: String = inner
                .trim()
                .lines()
                .map(str::trim_end)
                .collect::<Vec<_>>()
                .join("\n");
            if msg.is_empty() {
                return problem("the commit block is empty; nothing was committed".into());
            }
            if msg.chars().count() > MAX_MESSAGE_CHARS {
                return problem(format!(
                    "the commit message is longer than {MAX_MESSAGE_CHARS} characters; nothing was committed"
                ));
            }
            CommitBlock {
                text,
                message: Some(msg),
                problem: None,
            }
        }
        more => problem(format!(
            "the answer has {} commit blocks, and one is the rule; nothing was committed",
            more.len()
        )),
    }
}

/// A fixer's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Repaired,
    NeedsInput,
    NotApplicable,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestRun {
    pub command: String,
    /// `passed` or `failed`.
    pub result: String,
}

/// A valid FIX_RESULT (FORMATS.md §7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixResult {
    pub schema_version: u32,
    pub outcome: Outcome,
    pub summary: String,
    /// Filled by belay after its commit (the agent cannot commit).
    pub commit_hash: Option<String>,
    pub pushed_branch: Option<String>,
    pub tests: Vec<TestRun>,
    pub question: Option<String>,
    pub required_action: Option<String>,
    pub review_required: bool,
    pub failure: Option<String>,
}

pub const FIX_FIELDS: [&str; 10] = [
    "schema_version",
    "outcome",
    "summary",
    "commit_hash",
    "pushed_branch",
    "tests",
    "question",
    "required_action",
    "review_required",
    "failure",
];

/// A valid fixer answer: its result and the commit message (`repaired`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixAnswer {
    pub result: FixResult,
    pub message: Option<String>,
}

// model-facing: part of the FIX_RESULT check whose reason is the fixer's format correction.
fn opt_str(o: &serde_json::Map<String, Value>, k: &str) -> Result<Option<String>, String> {
    match o.get(k) {
        Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!("`{k}` must be a string or null, not {}", kind(v))),
        None => Err(format!("`{k}` is missing")),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn filled(v: &Option<String>) -> bool {
    v.as_deref().is_some_and(|s| !s.trim().is_empty())
}

/// Validate a fixer's answer: exactly one FIX_RESULT block with exactly the
/// fields and types of FORMATS.md §7, the per-outcome rules, a commit block
/// for `repaired` and none otherwise, and no other text.
// model-facing: the reason is the fixer's format correction (`prompt::correction`).
pub fn fix_result(answer: &str) -> Result<FixAnswer, String> {
    let (inner, commit) = fix_block(answer)?;
    let o = fix_object(inner)?;
    let r = fix_fields(&o)?;
    // The agent cannot commit: the hash and the branch are belay's to fill.
    if r.commit_hash.is_some() || r.pushed_branch.is_some() {
        return Err(
            "`commit_hash` and `pushed_branch` must be null: belay commits and fills them in"
                .into(),
        );
    }
    outcome_rules(&r, commit.message.is_some())?;
    Ok(FixAnswer {
        result: r,
        message: commit.message,
    })
}

/// The one FIX_RESULT block's inner text and the commit block beside it.
// model-facing: part of the FIX_RESULT check whose reason is the fixer's format correction.
fn fix_block(answer: &str) -> Result<(&str, CommitBlock), String> {
    let (spans, unterminated) = blocks(answer, FIX_START, FIX_END);
    if unterminated {
        return Err(format!("a {FIX_START} block is not closed with {FIX_END}"));
    }
    let inner = match spans.as_slice() {
        [(_, _, inner)] => *inner,
        [] => return Err(format!("there is no {FIX_START} … {FIX_END} block")),
        more => {
            return Err(format!(
                "there are {} FIX_RESULT blocks; exactly one is allowed",
                more.len()
            ))
        }
    };
    let rest = remove(answer, &spans);
    let commit = commit_block(&rest);
    if let Some(p) = &commit.problem {
        return Err(p.clone());
    }
    if !commit.text.is_empty() {
        return Err("there is text outside the FIX_RESULT block (and the commit block): answer with the block alone".into());
    }
    Ok((inner, commit))
}

/// The FIX_RESULT block as a JSON object with exactly the FIX_RESULT fields.
// model-facing: part of the FIX_RESULT check whose reason is the fixer's format correction.
fn fix_object(inner: &str) -> Result<serde_json::Map<String, Value>, String> {
    let v: Value = serde_json::from_str(inner.trim())
        .map_err(|e| format!("the FIX_RESULT block is not valid JSON: {e}"))?;
    let Value::Object(o) = v else {
        return Err(format!(
            "the FIX_RESULT block must be a JSON object, not {}",
            kind(&v)
        ));
    };
    for k in o.keys() {
        if !FIX_FIELDS.contains(&k.as_str()) {
            return Err(format!(
                "`{k}` is not a FIX_RESULT field (the fields are exactly: {})",
                FIX_FIELDS.join(", ")
            ));
        }
    }
    for k in FIX_FIELDS {
        if !o.contains_key(k) {
            return Err(format!(
                "`{k}` is missing (the fields are exactly: {})",
                FIX_FIELDS.join(", ")
            ));
        }
    }
    Ok(o)
}

/// The FIX_RESULT fields, each of its type.
// model-facing: part of the FIX_RESULT check whose reason is the fixer's format correction.
fn fix_fields(o: &serde_json::Map<String, Value>) -> Result<FixResult, String> {
    match o.get("schema_version") {
        Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(v) => return Err(format!("`schema_version` must be the integer 1, not {v}")),
        None => unreachable_missing()?,
    }
    let outcome = match o.get("outcome") {
        Some(Value::String(s)) => match s.as_str() {
            "repaired" => Outcome::Repaired,
            "needs_input" => Outcome::NeedsInput,
            "not_applicable" => Outcome::NotApplicable,
            "failed" => Outcome::Failed,
            other => {
                return Err(format!(
                "`outcome` `{other}` is not one of repaired, needs_input, not_applicable, failed"
            ))
            }
        },
        Some(v) => return Err(format!("`outcome` must be a string, not {}", kind(v))),
        None => unreachable_missing()?,
    };
    let summary = match o.get("summary") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => return Err("`summary` is empty".into()),
        Some(v) => return Err(format!("`summary` must be a string, not {}", kind(v))),
        None => unreachable_missing()?,
    };
    if summary.chars().count() > MAX_SUMMARY_CHARS {
        return Err(format!(
            "`summary` is longer than {MAX_SUMMARY_CHARS} characters"
        ));
    }
    let review_required = match o.get("review_required") {
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(format!(
                "`review_required` must be a boolean, not {}",
                kind(v)
            ))
        }
        None => unreachable_missing()?,
    };
    let tests = match o.get("tests") {
        Some(Value::Array(a)) => fix_tests(a)?,
        Some(v) => return Err(format!("`tests` must be an array, not {}", kind(v))),
        None => unreachable_missing()?,
    };
    Ok(FixResult {
        schema_version: 1,
        outcome,
        summary,
        commit_hash: opt_str(o, "commit_hash")?,
        pushed_branch: opt_str(o, "pushed_branch")?,
        tests,
        question: opt_str(o, "question")?,
        required_action: opt_str(o, "required_action")?,
        review_required,
        failure: opt_str(o, "failure")?,
    })
}

/// The `tests` entries: each exactly a command and a result.
// model-facing: part of the FIX_RESULT check whose reason is the fixer's format correction.
fn fix_tests(a: &[Value]) -> Result<Vec<TestRun>, String> {
    let mut out = Vec::new();
    for (i, t) in a.iter().enumerate() {
        let Value::Object(t) = t else {
            return Err(format!(
                "`tests[{i}]` must be an object with command and result"
            ));
        };
        if t.len() != 2 || !t.contains_key("command") || !t.contains_key("result") {
            return Err(format!(
                "`tests[{i}]` must have exactly the fields command and result"
            ));
        }
        let Some(Value::String(command)) = t.get("command") else {
            return Err(format!("`tests[{i}].command` must be a string"));
        };
        let result = match t.get("result") {
            Some(Value::String(r)) if r == "passed" || r == "failed" => r.clone(),
            _ => {
                return Err(format!(
                    "`tests[{i}].result` must be \"passed\" or \"failed\""
                ))
            }
        };
        out.push(TestRun {
            command: command.clone(),
            result,
        });
    }
    Ok(out)
}

/// The per-outcome rules of FORMATS.md §7.
// model-facing: part of the FIX_RESULT check whose reason is the fixer's format correction.
fn outcome_rules(r: &FixResult, has_commit: bool) -> Result<(), String> {
    match r.outcome {
        Outcome::Repaired => {
            if !has_commit {
                return Err("`repaired` needs exactly one commit block".into());
            }
            if !r.review_required {
                return Err("`repaired` needs `review_required`: true".into());
            }
            if r.question.is_some() || r.required_action.is_some() || r.failure.is_some() {
                return Err(
                    "`repaired` needs `question`, `required_action` and `failure` to be null"
                        .into(),
                );
            }
        }
        Outcome::NeedsInput => {
            if has_commit {
                return Err("only `repaired` may carry a commit block".into());
            }
            if !filled(&r.question) || !filled(&r.required_action) {
                return Err("`needs_input` needs a `question` and a `required_action`".into());
            }
            if !r.tests.is_empty() || r.review_required {
                return Err("`needs_input` needs `tests`: [] and `review_required`: false".into());
            }
        }
        Outcome::NotApplicable => {
            if has_commit {
                return Err("only `repaired` may carry a commit block".into());
            }
            if r.review_required {
                return Err("`not_applicable` needs `review_required`: false".into());
            }
        }
        Outcome::Failed => {
            if has_commit {
                return Err("only `repaired` may carry a commit block".into());
            }
            if !filled(&r.failure) {
                return Err("`failed` needs a `failure`".into());
            }
        }
    }
    Ok(())
}

// model-facing: part of the FIX_RESULT check whose reason is the fixer's format correction.
fn unreachable_missing<T>() -> Result<T, String> {
    Err("a FIX_RESULT field is missing".into())
}

/// The deterministic result when a fixer gave no valid block, even after its
/// one correction.
pub fn fallback(second_error: &str) -> FixResult {
    FixResult {
        schema_version: 1,
        outcome: Outcome::NeedsInput,
        summary: format!(
            "The fixer gave no valid machine-readable decision, even after one format correction ({second_error})."
        ),
        commit_hash: None,
        pushed_branch: None,
        tests: vec![],
        question: Some("The fixer could not give a valid machine-readable decision. Please add concrete information for the repair, or hand the job to the fixer again.".into()),
        required_action: Some("Check and complete the FIX_RESULT details.".into()),
        review_required: false,
        failure: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(o: serde_json::Value) -> String {
        format!("{FIX_START}\n{o}\n{FIX_END}")
    }

    fn base(outcome: &str) -> serde_json::Value {
        serde_json::json!({
            "schema_version": 1, "outcome": outcome, "summary": "s",
            "commit_hash": null, "pushed_branch": null, "tests": [],
            "question": null, "required_action": null,
            "review_required": false, "failure": null
        })
    }

    #[test]
    fn one_commit_block_is_taken_and_two_are_refused() {
        let a = format!("Done.\n{COMMIT_START}\nfix: the title \n\nbody\n{COMMIT_END}\n");
        let b = commit_block(&a);
        assert_eq!(b.message.as_deref(), Some("fix: the title\n\nbody"));
        assert_eq!(b.text, "Done.");
        let two = format!("{a}{COMMIT_START}x{COMMIT_END}");
        assert!(commit_block(&two).message.is_none());
        assert!(commit_block(&two)
            .problem
            .unwrap()
            .contains("2 commit blocks"));
        assert!(commit_block(&format!("{COMMIT_START}  \n {COMMIT_END}"))
            .problem
            .is_some());
        assert!(commit_block(&format!("x {COMMIT_START} y"))
            .problem
            .unwrap()
            .contains("never closes"));
        let none = commit_block("just text");
        assert!(none.message.is_none() && none.problem.is_none());
    }

    #[test]
    fn a_valid_fix_result_passes_and_each_rule_is_enforced() {
        let mut r = base("repaired");
        r["review_required"] = true.into();
        let ok = format!("{}\n{COMMIT_START}\nfix it\n{COMMIT_END}", fix(r.clone()));
        let a = fix_result(&ok).unwrap();
        assert_eq!(a.message.as_deref(), Some("fix it"));
        assert_eq!(a.result.outcome, Outcome::Repaired);
        // repaired without a commit block
        assert!(fix_result(&fix(r.clone()))
            .unwrap_err()
            .contains("exactly one commit block"));
        let mut n = base("needs_input");
        n["question"] = "which?".into();
        n["required_action"] = "say".into();
        assert!(fix_result(&fix(n.clone())).is_ok());
        // a commit block on needs_input
        let bad = format!("{}{COMMIT_START}x{COMMIT_END}", fix(n.clone()));
        assert!(fix_result(&bad).unwrap_err().contains("only `repaired`"));
        // an extra field
        let mut extra = n.clone();
        extra["target_phase"] = "x".into();
        assert!(fix_result(&fix(extra))
            .unwrap_err()
            .contains("`target_phase` is not a FIX_RESULT field"));
        // a wrong type
        let mut wrong = n.clone();
        wrong["review_required"] = "false".into();
        assert!(fix_result(&fix(wrong))
            .unwrap_err()
            .contains("must be a boolean"));
        let mut v = n.clone();
        v["schema_version"] = serde_json::json!(1.0);
        assert!(fix_result(&fix(v)).is_err());
        let mut t = n.clone();
        t["tests"] = serde_json::json!([{"command": "x", "result": "ok"}]);
        assert!(fix_result(&fix(t)).is_err());
        // text around it, two blocks, a missing field
        assert!(fix_result(&format!("Sure! {}", fix(n.clone())))
            .unwrap_err()
            .contains("text outside"));
        assert!(fix_result(&format!("{}{}", fix(n.clone()), fix(n.clone())))
            .unwrap_err()
            .contains("2 FIX_RESULT"));
        let mut m = n.clone();
        m.as_object_mut().unwrap().remove("failure");
        assert!(fix_result(&fix(m))
            .unwrap_err()
            .contains("`failure` is missing"));
        // the agent cannot fill the hash
        let mut h = n;
        h["commit_hash"] = "a".repeat(40).into();
        assert!(fix_result(&fix(h)).unwrap_err().contains("must be null"));
        let mut f = base("failed");
        assert!(fix_result(&fix(f.clone()))
            .unwrap_err()
            .contains("needs a `failure`"));
        f["failure"] = "it broke".into();
        assert!(fix_result(&fix(f)).is_ok());
        assert_eq!(fallback("x").outcome, Outcome::NeedsInput);
    }

    proptest::proptest! {
        #[test]
        fn any_answer_parses_without_panic(s in "\\PC{0,300}") {
            if let Some(m) = commit_block(&s).message {
                proptest::prop_assert!(!m.trim().is_empty());
                proptest::prop_assert!(!m.contains(COMMIT_END));
            }
            let wrapped = format!("{FIX_START}{s}{FIX_END}");
            if let Ok(a) = fix_result(&wrapped) {
                proptest::prop_assert!(a.result.commit_hash.is_none());
            }
        }
    }
}
