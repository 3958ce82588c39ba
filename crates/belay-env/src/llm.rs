//! The model planner and model repair.
//!
//! Both send the model what the rules see (context.json with the runtime notes;
//! for repair, the failed block, its log tail, probe results and the rules'
//! hints) and ask for one JSON object. The answer is parsed strictly against a
//! schema and the safety filter; a bad answer gets one format-correction
//! retry, and after that the caller falls back to the rules, saying why.

use belay_model::{Message, ModelClient, Request};
use serde::Deserialize;

use crate::analyze::RepoContext;
use crate::plan::Block;
use crate::preflight::RuntimeNotes;
use crate::safety;

/// How much of context.json goes into the prompt.
const CONTEXT_MAX: usize = 24 * 1024;
/// How much of a failure log goes into a repair prompt.
const LOG_MAX: usize = 8 * 1024;
pub const MAX_BLOCKS: usize = 12;
pub const MAX_PROBES: usize = 3;
/// Output cap of a plan or repair answer (room for reasoning models to think);
/// `--llm-max-output-tokens` lowers it.
pub const MAX_OUTPUT_TOKENS: u32 = 16_000;

pub const PLAN_SYSTEM: &str = "You plan the setup of a software repository's development environment \
in a Debian container, as ordered blocks of shell commands. The repository is at /workspace/repo and \
commands run there as root with bash -euo pipefail. Python dependencies go into /workspace/repo/.venv. \
Never use docker, git push, mkfs or broad rm -rf, and never edit the repository's own files. \
Each block has a validation_command that exits 0 when the block worked. \
Answer with exactly one JSON object and nothing else, of this form:\n\
{\"blocks\": [{\"id\": \"10-system-packages\", \"title\": \"...\", \"goal\": \"...\", \
\"commands\": [\"...\"], \"validation_command\": \"...\"}]}\n\
Block ids are a two-digit order prefix and a kebab-case name (00-preflight, 10-system-packages, \
20-python-runtime, 30-python-deps, 40-native-build-config, 50-test-tooling), in increasing order, \
at most 12 blocks.";

pub const REPAIR_SYSTEM: &str = "You repair a failed environment setup block in a Debian container. \
You get the block, the tail of its log, the container's runtime notes and hints from error-pattern rules. \
Answer with exactly one JSON object and nothing else:\n\
{\"diagnosis\": \"...\", \"probes\": [\"...\"], \"fix\": \"...\", \"blame\": null}\n\
`probes`: up to 3 single-line read-only shell commands to run before deciding (no installs, no network, \
no writes); give probes and no fix when you need to look first. `fix`: shell commands that, run before the \
block is replayed, make it pass (installs and environment changes only; never edit the repository's own \
files, never docker, git push or broad rm -rf). `blame`: the id of an earlier block whose output causes \
the failure, to patch the fix there instead, or null.";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanAnswer {
    blocks: Vec<PlanBlock>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanBlock {
    id: String,
    title: String,
    #[serde(default)]
    goal: String,
    commands: Vec<String>,
    validation_command: String,
}

/// A repair the model proposed.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RepairAnswer {
    #[serde(default)]
    pub diagnosis: String,
    #[serde(default)]
    pub probes: Vec<String>,
    #[serde(default)]
    pub fix: Option<String>,
    #[serde(default)]
    pub blame: Option<String>,
}

/// The JSON object in a model answer: the whole text, or the inside of one
/// ```json fence. Nothing else is guessed at.
pub fn json_text(answer: &str) -> &str {
    let t = answer.trim();
    if let Some(rest) = t.strip_prefix("```") {
        let rest = rest.strip_prefix("json").unwrap_or(rest);
        if let Some(inner) = rest.trim_end().strip_suffix("```") {
            return inner.trim();
        }
    }
    t
}

fn valid_id(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() >= 4
        && b.len() <= 48
        && b[0].is_ascii_digit()
        && b[1].is_ascii_digit()
        && b[2] == b'-'
        && id[3..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !id.ends_with('-')
}

/// Parse and check a plan answer.
pub fn parse_plan(answer: &str) -> Result<Vec<Block>, String> {
    let a: PlanAnswer = serde_json::from_str(json_text(answer))
        .map_err(|e| format!("the answer is not the JSON object asked for: {e}"))?;
    if a.blocks.is_empty() || a.blocks.len() > MAX_BLOCKS {
        return Err(format!(
            "`blocks` must hold 1 to {MAX_BLOCKS} blocks, not {}",
            a.blocks.len()
        ));
    }
    let mut out: Vec<Block> = Vec::new();
    let mut last = -1i32;
    for (i, b) in a.blocks.iter().enumerate() {
        let n = i + 1;
        if !valid_id(&b.id) {
            return Err(format!("block {n}: id `{}` is not NN-kebab-name", b.id));
        }
        let prefix: i32 = b.id[..2].parse().unwrap_or(-1);
        if prefix <= last {
            return Err(format!(
                "block {n}: id `{}` is not after the block before it",
                b.id
            ));
        }
        last = prefix;
        if b.title.trim().is_empty() {
            return Err(format!("block {n} ({}): empty title", b.id));
        }
        if b.commands.is_empty() || b.commands.iter().all(|c| c.trim().is_empty()) {
            return Err(format!("block {n} ({}): no commands", b.id));
        }
        if b.validation_command.trim().is_empty() || b.validation_command.contains('\n') {
            return Err(format!(
                "block {n} ({}): validation_command must be one non-empty line",
                b.id
            ));
        }
        for c in b
            .commands
            .iter()
            .chain(std::iter::once(&b.validation_command))
        {
            if let Some(why) = safety::check_repair(c) {
                return Err(format!("block {n} ({}): {why}", b.id));
            }
        }
        let goal = if b.goal.trim().is_empty() {
            b.title.as_str()
        } else {
            b.goal.as_str()
        };
        let mut block = Block::planned(
            &b.id,
            b.title.trim(),
            goal.trim(),
            &b.commands,
            b.validation_command.trim(),
        );
        block.order = n as u32;
        out.push(block);
    }
    Ok(out)
}

/// Parse and check a repair answer. `earlier`: the ids of blocks before the failed one.
pub fn parse_repair(
    answer: &str,
    earlier: &[String],
    probes_allowed: bool,
) -> Result<RepairAnswer, String> {
    let mut a: RepairAnswer = serde_json::from_str(json_text(answer))
        .map_err(|e| format!("the answer is not the JSON object asked for: {e}"))?;
    a.probes.retain(|p| !p.trim().is_empty());
    if a.fix.as_deref().is_some_and(|f| f.trim().is_empty()) {
        a.fix = None;
    }
    if !probes_allowed && !a.probes.is_empty() && a.fix.is_none() {
        return Err("probes were already run: give a `fix` now".into());
    }
    if a.probes.len() > MAX_PROBES {
        return Err(format!(
            "at most {MAX_PROBES} probes, not {}",
            a.probes.len()
        ));
    }
    for p in &a.probes {
        if let Some(why) = safety::check_probe(p) {
            return Err(format!("probe `{p}` is not allowed: {why}"));
        }
    }
    match &a.fix {
        Some(f) => {
            if let Some(why) = safety::check_repair(f) {
                return Err(format!("the fix is not allowed: {why}"));
            }
        }
        None if a.probes.is_empty() => return Err("neither a `fix` nor `probes`".into()),
        None => {}
    }
    if let Some(b) = &a.blame {
        if b.trim().is_empty() || b == "null" {
            a.blame = None;
        } else if !earlier.iter().any(|e| e == b) {
            return Err(format!(
                "`blame` must be one of the earlier blocks ({}), not `{b}`",
                earlier.join(", ")
            ));
        }
    }
    Ok(a)
}

/// Ask, parse; on a bad answer ask once more with the reason; then give up.
/// `log` hears about each attempt.
async fn ask<T>(
    client: &ModelClient,
    purpose: &str,
    system: &str,
    user: String,
    parse: impl Fn(&str) -> Result<T, String>,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<T, String> {
    let mut messages = vec![Message::user(user)];
    for attempt in 1..=2 {
        let req = Request {
            instructions: Some(system.to_string()),
            messages: messages.clone(),
            json_output: true,
            max_output_tokens: Some(MAX_OUTPUT_TOKENS),
            ..Default::default()
        };
        let resp = client
            .complete(&req, purpose)
            .await
            .map_err(|e| format!("the model call failed: {e}"))?;
        match parse(&resp.text) {
            Ok(v) => return Ok(v),
            Err(why) => {
                log(format!("{purpose}: answer {attempt} rejected: {why}"));
                if attempt == 2 {
                    return Err(format!(
                        "the model's answer was rejected twice (last: {why})"
                    ));
                }
                messages.push(Message::Assistant {
                    content: resp.text,
                    tool_calls: vec![],
                });
                messages.push(Message::user(format!(
                    "Your answer could not be used: {why}. Answer again with only the JSON object, in the form the instructions give."
                )));
            }
        }
    }
    Err("unreachable".into())
}

fn capped_json<T: serde::Serialize>(v: &T, max: usize) -> String {
    let mut s = serde_json::to_string(v).unwrap_or_default();
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str(" …(cut)");
    }
    s
}

/// Plan with the model. `baseline`: the rules planner's plan, shown as a starting point.
pub async fn plan(
    client: &ModelClient,
    ctx: &RepoContext,
    notes: &RuntimeNotes,
    baseline: &[Block],
    log: &mut (dyn FnMut(String) + Send),
) -> Result<Vec<Block>, String> {
    let mut ctx = ctx.clone();
    ctx.runtime_notes = Some(notes.clone());
    let base: Vec<serde_json::Value> = baseline
        .iter()
        .map(|b| serde_json::json!({"id": b.id, "title": b.title, "validation_command": b.validation_command,
            "commands": b.script.lines().skip_while(|l| !l.starts_with("cd ")).skip(1).filter(|l| !l.trim().is_empty()).collect::<Vec<_>>()}))
        .collect();
    let user = format!(
        "Plan the environment setup for this repository.\n\ncontext.json (static analysis and runtime_notes from the container):\n{}\n\n\
         A deterministic rules planner proposes this plan; keep what is right and fix what is wrong:\n{}",
        capped_json(&ctx, CONTEXT_MAX),
        capped_json(&base, CONTEXT_MAX / 2)
    );
    ask(client, "plan", PLAN_SYSTEM, user, parse_plan, log).await
}

/// What a repair prompt is made of.
pub struct RepairInput<'a> {
    pub block: &'a Block,
    pub failure: &'a str,
    pub notes: Option<&'a RuntimeNotes>,
    /// Rules hints: (rule id, hint, proposed fix).
    pub hints: Vec<(String, String, String)>,
    pub tried: &'a [String],
    pub earlier: Vec<String>,
}

fn repair_prompt(i: &RepairInput, probe_results: &[(String, i64, String)]) -> String {
    let mut tail = i.failure.to_string();
    if tail.len() > LOG_MAX {
        let mut cut = tail.len() - LOG_MAX;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail.replace_range(..cut, "…");
    }
    let mut s = format!(
        "Block {} ({}) failed.\n\nIts script:\n{}\n\nIts validation command: {}\n\nThe end of its log:\n{}\n\n",
        i.block.id, i.block.title, i.block.script, i.block.validation_command, tail
    );
    if let Some(n) = i.notes {
        s.push_str(&format!("Runtime notes: {}\n\n", capped_json(n, 6 * 1024)));
    }
    if !i.earlier.is_empty() {
        s.push_str(&format!(
            "Earlier blocks (that `blame` may name): {}\n\n",
            i.earlier.join(", ")
        ));
    }
    if !i.hints.is_empty() {
        s.push_str("Hints from error-pattern rules:\n");
        for (id, hint, fix) in &i.hints {
            s.push_str(&format!("- {id}: {hint} (would run: {fix})\n"));
        }
        s.push('\n');
    }
    if !i.tried.is_empty() {
        s.push_str(&format!(
            "Fixes already tried that did not work:\n- {}\n\n",
            i.tried.join("\n- ")
        ));
    }
    if !probe_results.is_empty() {
        s.push_str("Probe results:\n");
        for (cmd, code, out) in probe_results {
            s.push_str(&format!("$ {cmd}\n(exit {code})\n{out}\n"));
        }
        s.push_str("\nNow give the fix.\n");
    }
    s
}

/// Ask the model for a repair. With `probe_results` empty the model may ask
/// for probes first; with results it must give a fix.
pub async fn repair(
    client: &ModelClient,
    input: &RepairInput<'_>,
    probe_results: &[(String, i64, String)],
    log: &mut (dyn FnMut(String) + Send),
) -> Result<RepairAnswer, String> {
    let earlier = input.earlier.clone();
    let first_round = probe_results.is_empty();
    ask(
        client,
        "repair",
        REPAIR_SYSTEM,
        repair_prompt(input, probe_results),
        |t| parse_repair(t, &earlier, first_round),
        log,
    )
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_good_plan_parses_and_fences_are_allowed() {
        let t = "```json\n{\"blocks\":[{\"id\":\"10-system-packages\",\"title\":\"System\",\"commands\":[\"apt-get install -y -q make\"],\"validation_command\":\"make --version\"},{\"id\":\"50-test-tooling\",\"title\":\"Tests\",\"goal\":\"g\",\"commands\":[\"true\"],\"validation_command\":\"true\"}]}\n```";
        let b = parse_plan(t).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].goal, "System");
        assert!(b[0].script.contains("apt-get install -y -q make"));
        assert_eq!(b[1].order, 2);
    }

    #[test]
    fn bad_plans_say_why() {
        let cases = [
            ("not json", "not the JSON object"),
            ("{\"blocks\":[]}", "1 to 12"),
            ("{\"blocks\":[{\"id\":\"x\",\"title\":\"t\",\"commands\":[\"true\"],\"validation_command\":\"true\"}]}", "NN-kebab"),
            ("{\"blocks\":[{\"id\":\"20-a\",\"title\":\"t\",\"commands\":[\"true\"],\"validation_command\":\"true\"},{\"id\":\"10-b\",\"title\":\"t\",\"commands\":[\"true\"],\"validation_command\":\"true\"}]}", "not after"),
            ("{\"blocks\":[{\"id\":\"10-a\",\"title\":\"t\",\"commands\":[\"docker run x\"],\"validation_command\":\"true\"}]}", "refused"),
            ("{\"blocks\":[{\"id\":\"10-a\",\"title\":\"t\",\"commands\":[\"true\"],\"validation_command\":\"true\",\"extra\":1}]}", "unknown field"),
            ("{\"blocks\":[{\"id\":\"10-a\",\"title\":\"t\",\"commands\":[],\"validation_command\":\"true\"}]}", "no commands"),
        ];
        for (text, want) in cases {
            let e = parse_plan(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn repairs_are_checked() {
        let earlier = vec!["10-system-packages".to_string()];
        let ok = parse_repair("{\"diagnosis\":\"d\",\"fix\":\"apt-get install -y libpq-dev\",\"blame\":\"10-system-packages\"}", &earlier, true).unwrap();
        assert_eq!(ok.blame.as_deref(), Some("10-system-packages"));
        assert!(parse_repair("{\"fix\":\"docker ps\"}", &earlier, true)
            .unwrap_err()
            .contains("not allowed"));
        assert!(
            parse_repair("{\"probes\":[\"apt-get install -y x\"]}", &earlier, true)
                .unwrap_err()
                .contains("probe")
        );
        assert!(
            parse_repair("{\"probes\":[\"ls /usr/include\"]}", &earlier, false)
                .unwrap_err()
                .contains("give a `fix`")
        );
        assert!(
            parse_repair("{\"fix\":\"true\",\"blame\":\"30-later\"}", &earlier, true)
                .unwrap_err()
                .contains("earlier blocks")
        );
        assert!(parse_repair("{}", &earlier, true)
            .unwrap_err()
            .contains("neither"));
        let probes = parse_repair(
            "{\"probes\":[\"ls /usr/include\"],\"fix\":null}",
            &earlier,
            true,
        )
        .unwrap();
        assert_eq!(probes.probes.len(), 1);
    }

    proptest! {
        /// Whatever the model writes, parsing returns a value or a reason.
        #[test]
        fn parsers_never_panic(s in ".{0,400}") {
            let _ = parse_plan(&s);
            let _ = parse_repair(&s, &[], true);
        }
    }
}
