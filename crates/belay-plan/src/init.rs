//! `belay plan init`: ask an agent for 2 to 6 ordered checkpoints, as JSON
//! only, and turn its answer into a plan file.
//!
//! The answer is accepted as raw JSON or as exactly one fenced block and
//! nothing else; prose with a fence, two fences or nothing is refused with the
//! reason, and the agent gets one correction round. Every checkpoint starts
//! `pending` with 0 attempts and no notes, whatever the agent said. The file
//! is written atomically and exclusively (`--force` replaces it).

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};
use unicode_normalization::UnicodeNormalization;

use crate::schema::{self, Seg};
use crate::PlanError;

/// The plan file recorded for a feature given as text.
pub const DEFAULT_PLAN_DOC: &str = "docs/implementation_plan.md";

/// The fewest and most checkpoints a generated plan may have.
pub const MIN_CHECKPOINTS: usize = 2;
pub const MAX_CHECKPOINTS: usize = 6;

/// A branch-safe slug: NFKD then ASCII ("café" gives "cafe"), lower case,
/// every other run of characters one hyphen, at most `max` characters;
/// `feature` when nothing is left.
pub fn slugify(text: &str, max: usize) -> String {
    let ascii: String = text.nfkd().filter(char::is_ascii).collect();
    let mut slug = String::new();
    let mut dash = false;
    for c in ascii.trim().to_lowercase().chars() {
        if c.is_ascii_alphanumeric() {
            if dash && !slug.is_empty() {
                slug.push('-');
            }
            dash = false;
            slug.push(c);
        } else {
            dash = true;
        }
    }
    let cut: String = slug.chars().take(max).collect();
    let cut = cut.trim_matches('-').to_string();
    if cut.is_empty() {
        "feature".into()
    } else {
        cut
    }
}

/// The branch for a feature: `feature/<slug>`.
pub fn default_branch(feature: &str) -> String {
    format!("feature/{}", slugify(feature, 40))
}

/// The planning prompt.
pub fn prompt(feature: &str) -> String {
    format!(
        r#"You are generating an implementation plan for a checkpoint-gated developer/reviewer coding loop. Convert the feature description below into an ordered list of independently reviewable checkpoints.

Feature description:
{feature}

Rules:
- Break the feature into {MIN_CHECKPOINTS} to {MAX_CHECKPOINTS} sequential checkpoints, ordered so each one builds on the ones before it and can be developed and reviewed in isolation.
- Each checkpoint must be project-agnostic: do not assume a specific language, framework, build tool, or test command unless the feature description names one.
- Each checkpoint needs a short unique id (e.g. "phase0", "phase1", ...), a short name, a "scope" describing exactly what to build, and an "exit_criteria" list of objective, independently verifiable conditions. Do not use vague criteria like "code is clean" or "works well".
- Do not include "status", "attempts", or "review_notes" fields; they are assigned automatically.
- Output ONLY a single JSON object and nothing else: no prose, no explanation, no markdown headings, before or after it. You may wrap the JSON in a single ```json code fence, or output raw JSON with no fence at all. Never mix prose with either form.

Output JSON shape exactly:
{{
  "checkpoints": [
    {{"id": "phase0", "name": "...", "scope": "...", "exit_criteria": ["...", "..."]}}
  ]
}}
"#
    )
}

/// The correction prompt after a refused answer.
pub fn correction(feature: &str, why: &str) -> String {
    format!(
        "Your previous answer was refused: {why}.\n\nAnswer again, following every rule below exactly.\n\n{}",
        prompt(feature)
    )
}

/// The JSON in an agent's answer: raw, or exactly one fenced block with
/// nothing outside it.
// model-facing: the reason goes back to the planning agent in `correction`.
pub fn extract(answer: &str) -> Result<Value, String> {
    let text = answer.trim();
    if text.is_empty() {
        return Err("the answer is empty".into());
    }
    let fences = text.matches("```").count();
    let body = match fences {
        0 => text,
        2 => {
            let Some(rest) = text.strip_prefix("```") else {
                return Err("the answer mixes prose with a code fence: give raw JSON or one JSON code fence with nothing outside it".into());
            };
            if !text.ends_with("```") {
                return Err("the answer mixes prose with a code fence: give raw JSON or one JSON code fence with nothing outside it".into());
            }
            let rest = &rest[..rest.len() - 3];
            let Some((lang, body)) = rest.split_once('\n') else {
                return Err("the code fence is on one line: put the JSON on its own lines".into());
            };
            if !matches!(lang.trim(), "" | "json" | "JSON") {
                return Err(format!("the code fence is `{}`, not json", lang.trim()));
            }
            body
        }
        _ => {
            return Err(format!(
                "the answer has {} code fences: give raw JSON or exactly one JSON code fence",
                fences / 2 + fences % 2
            ))
        }
    };
    serde_json::from_str(body).map_err(|e| format!("the answer is not valid JSON: {e}"))
}

/// The checkpoints of an answer (`{"checkpoints": […]}` or a bare list), each
/// rebuilt: pending, 0 attempts, no notes.
// model-facing: the reason goes back to the planning agent in `correction`.
pub fn normalize(data: &Value) -> Result<Vec<Value>, String> {
    let list = match data {
        Value::Object(o) => o.get("checkpoints"),
        Value::Array(_) => Some(data),
        _ => None,
    };
    let Some(Value::Array(list)) = list else {
        return Err("the answer must hold a `checkpoints` list".into());
    };
    if list.len() < MIN_CHECKPOINTS || list.len() > MAX_CHECKPOINTS {
        return Err(format!(
            "the answer has {} checkpoint(s); a plan has {MIN_CHECKPOINTS} to {MAX_CHECKPOINTS}",
            list.len()
        ));
    }
    let mut out = Vec::new();
    for (i, cp) in list.iter().enumerate() {
        let Some(o) = cp.as_object() else {
            return Err(format!("checkpoint #{i} is not an object"));
        };
        for f in ["id", "name", "scope", "exit_criteria"] {
            if !o.contains_key(f) {
                return Err(format!("checkpoint #{i} has no `{f}`"));
            }
        }
        out.push(json!({
            "id": o["id"],
            "name": o["name"],
            "status": "pending",
            "scope": o["scope"],
            "exit_criteria": o["exit_criteria"],
            "attempts": 0,
            "review_notes": "",
        }));
    }
    Ok(out)
}

/// The whole plan from an answer, validated by the same rules as a plan
/// file; the error says why, for the correction round.
// model-facing: the reason is the planning agent's correction (`correction`).
pub fn plan_from_answer(answer: &str, plan_file: &str, branch: &str) -> Result<Value, String> {
    let data = extract(answer)?;
    let checkpoints = normalize(&data)?;
    let plan = json!({
        "plan_file": plan_file,
        "branch": branch,
        "checkpoints": checkpoints,
    });
    schema::validate(&plan).map_err(|(at, why)| {
        let at: Vec<String> = at
            .iter()
            .map(|s| match s {
                Seg::Key(k) => k.clone(),
                Seg::Index(i) => format!("[{i}]"),
            })
            .collect();
        format!("{} ({})", why, at.join("."))
    })?;
    Ok(plan)
}

/// The plan document `plan_file` names, for a feature given as text: the
/// feature and the checkpoints, so that the file the agents are told to
/// read exists.
pub fn plan_doc(feature: &str, plan: &Value) -> String {
    let mut out = format!(
        "# Implementation plan\n\n## Feature\n\n{}\n\n## Checkpoints\n",
        feature.trim()
    );
    for c in plan["checkpoints"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n### {} — {}\n\n{}\n",
            c["id"].as_str().unwrap_or_default(),
            c["name"].as_str().unwrap_or_default(),
            c["scope"].as_str().unwrap_or_default()
        ));
        for e in c["exit_criteria"].as_array().into_iter().flatten() {
            out.push_str(&format!("- {}\n", e.as_str().unwrap_or_default()));
        }
    }
    if let Some(p) = plan.get("project").and_then(Value::as_object) {
        out.push_str("\n## The gate\n\nbelay runs these after every developer run:\n\n");
        for (k, v) in p {
            out.push_str(&format!("- {k}: `{}`\n", v.as_str().unwrap_or_default()));
        }
    }
    out
}

/// Write `plan` to `path`: to a temporary file in the same directory,
/// synced, then published in one step that fails if `path` exists (unless
/// `force`). A crash leaves the old file or the new one, never half of one.
pub fn write(path: &Path, plan: &Value, force: bool) -> Result<(), PlanError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs_err::create_dir_all(dir).map_err(|e| PlanError::io("create", dir, e))?;
    let mut text = serde_json::to_string_pretty(plan).unwrap_or_default();
    text.push('\n');
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("plan"),
        std::process::id()
    ));
    // A new file, never through a link someone left at that name.
    let _ = fs_err::remove_file(&tmp);
    let mut f = fs_err::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| PlanError::io("create", &tmp, e))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| PlanError::io("write", &tmp, e))?;
    drop(f);
    let published = if force {
        fs_err::rename(&tmp, path).map_err(|e| PlanError::io("replace", path, e))
    } else {
        let r = std::fs::hard_link(&tmp, path);
        let _ = fs_err::remove_file(&tmp);
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(PlanError::Usage(format!(
                    "{} already exists: pass --force to replace it",
                    path.display()
                )))
            }
            Err(e) => Err(PlanError::io("publish", path, e)),
        }
    };
    if published.is_err() {
        let _ = fs_err::remove_file(&tmp);
    }
    published
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    const TWO: &str = r#"{"checkpoints":[{"id":"a","name":"A","scope":"s","exit_criteria":["x"],"status":"approved","attempts":9},{"id":"b","name":"B","scope":"s","exit_criteria":["y"]}]}"#;

    #[test]
    fn slugs_transliterate_and_cut() {
        assert_eq!(
            slugify("Café au lait: add CSV export!", 40),
            "cafe-au-lait-add-csv-export"
        );
        assert_eq!(slugify("日本語", 40), "feature");
        assert_eq!(slugify(&"a-".repeat(40), 40).len(), 39);
        assert_eq!(default_branch("Ärger"), "feature/arger");
    }

    #[test]
    fn answers_raw_or_one_fence_only() {
        assert!(extract(TWO).is_ok());
        assert!(extract(&format!("```json\n{TWO}\n```")).is_ok());
        assert!(extract(&format!("```\n{TWO}\n```\n")).is_ok());
        let prose = extract(&format!("Here is the plan:\n```json\n{TWO}\n```")).unwrap_err();
        assert!(prose.contains("mixes prose"), "{prose}");
        let two = extract(&format!("```json\n{TWO}\n```\n```json\n{TWO}\n```")).unwrap_err();
        assert!(two.contains("2 code fences"), "{two}");
        assert!(extract("  ").unwrap_err().contains("empty"));
        assert!(extract("{nope").unwrap_err().contains("not valid JSON"));
    }

    #[test]
    fn checkpoints_are_normalised_and_counted() {
        let plan = plan_from_answer(TWO, "docs/p.md", "feature/x").unwrap();
        let a = &plan["checkpoints"][0];
        assert_eq!(a["status"], "pending");
        assert_eq!(a["attempts"], 0);
        assert_eq!(a["review_notes"], "");
        let one = r#"[{"id":"a","name":"A","scope":"s","exit_criteria":["x"]}]"#;
        assert!(plan_from_answer(one, "p", "feature/x")
            .unwrap_err()
            .contains("2 to 6"));
        let escape = TWO.replace("\"id\":\"b\"", "\"id\":\"a/../../../tmp/x\"");
        assert!(plan_from_answer(&escape, "p", "feature/x")
            .unwrap_err()
            .contains("is not allowed"));
        let dup = TWO.replace("\"id\":\"b\"", "\"id\":\"a\"");
        assert!(plan_from_answer(&dup, "p", "feature/x")
            .unwrap_err()
            .contains("used twice"));
    }

    #[test]
    fn the_write_is_exclusive_unless_forced() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("plan.json");
        let v = plan_from_answer(TWO, "p", "feature/x").unwrap();
        write(&p, &v, false).unwrap();
        let e = write(&p, &json!({}), false).unwrap_err().to_string();
        assert!(e.contains("already exists") && e.contains("--force"), "{e}");
        assert!(std::fs::read_to_string(&p).unwrap().contains("feature/x"));
        write(&p, &json!({"x": 1}), true).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().contains("\"x\": 1"));
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left");
    }

    proptest! {
        #[test]
        fn extract_never_panics(s in "\\PC{0,120}") {
            let _ = extract(&s);
        }

        #[test]
        fn slugs_are_branch_safe(s in "\\PC{0,80}") {
            let slug = slugify(&s, 40);
            prop_assert!(!slug.is_empty() && slug.len() <= 40);
            prop_assert!(slug.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
            let branch = format!("feature/{}", slug);
            prop_assert!(crate::schema::branch_problem(&branch).is_none());
        }
    }
}
