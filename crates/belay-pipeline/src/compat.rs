//! `belay run --explain-compat FILE`: how each key of an agentic-dev-loop
//! pipeline file maps onto belay. It reads the file as plain YAML, so that it
//! explains a file that does not load too (the refused keys say what to use).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use serde_saphyr::Spanned;

use crate::schema::LoadError;

/// How one key maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// The same key with the same meaning.
    Same(&'static str),
    /// Accepted, and turned into belay's form.
    Mapped(&'static str),
    /// Refused at load: what to write instead.
    Refused(&'static str),
    /// belay's own key (the peer does not have it).
    Belay(&'static str),
}

const TOP: &[(&str, Mapping)] = &[
    ("name", Mapping::Same("the pipeline's name (run ids start with it)")),
    ("extensions", Mapping::Refused("belay loads no Python plugins: document loaders become `additional_files`, consumer actions become `action: NAME` + `params.script` (run in the sandbox), tools become agent CLIs (`runner:` in the agent file)")),
    ("extensions_dir", Mapping::Refused("no plugins, so no plugin directory: remove it (see `extensions`)")),
    ("additional_files", Mapping::Same("shared context for every agent step, read through no link, git-clean at start")),
    ("llm", Mapping::Same("the model of the built-in agent and the endpoint of agent CLIs")),
    ("max_attempts", Mapping::Same("the retry budget; `--max-attempts` overrides it, and `--resume ID --max-attempts N` continues an exhausted run")),
    ("agents_dir", Mapping::Same("`<name>.agent.md` files (front matter `name`, `tools`; belay adds `runner`, `model`)")),
    ("steps", Mapping::Same("the steps, in order")),
    ("secrets", Mapping::Same("refs only (`from: env`, `key: VAR`), resolved host-side at start, scrubbed from every file belay writes")),
    ("isolation", Mapping::Same("the sandbox's image, caps and profile; it can never turn the sandbox off")),
    ("state_dir", Mapping::Same("where the runs live; default ~/.local/state/belay/pipelines/<name>-<hash>, outside the workspace")),
    ("deps_policy", Mapping::Same("locked (default) or open, injected into every agent's context")),
    ("lockfiles", Mapping::Same("the lockfiles a locked policy names")),
    ("caches", Mapping::Mapped("each entry (a path string, or {path, name}) is a rw mount from <state_dir>/caches/; a relative path is inside the workspace and is never committed")),
    ("sync_excludes", Mapping::Mapped("pathspec globs the commit leaves out; the clean-at-start check ignores them too")),
    ("egress", Mapping::Same("`presets: [package-registries]` (allowlisting proxy) or `class: browser` (any public host on 80/443, logged), for steps with `network: true`")),
];

const STEP: &[(&str, Mapping)] = &[
    ("name", Mapping::Same("the step's name")),
    ("agent", Mapping::Same("an agent step (built-in agent, or the CLI its agent file names)")),
    ("command", Mapping::Same("a command step in the sandbox; exit code is the verdict")),
    ("action", Mapping::Same("`commit` (host side, the single commit point) or a sandbox script (`params.script`)")),
    ("params", Mapping::Same("template values: {subject}, {pipeline}, {run_id}, {<param>}")),
    ("produces", Mapping::Mapped("written under /workspace/artifacts (a per-run directory outside the worktree, rw even for a ro step); an agent's final answer becomes the first file when it wrote none")),
    ("artifact", Mapping::Mapped("read from /workspace/artifacts (outside the worktree, so a `mounts: {workspace: ro}` reviewer can write it and the next run's worktree stays clean); the last `VERDICT:` line wins")),
    ("verdicts", Mapping::Same("pass / fail / unverifiable words of the artifact's VERDICT line")),
    ("on_pass", Mapping::Same("a step, success or failure")),
    ("on_fail", Mapping::Same("a step, success, failure or {goto, retry}")),
    ("on_unverifiable", Mapping::Same("the route of an UNVERIFIABLE verdict (default: on_fail's)")),
    ("env", Mapping::Same("the step's variables, on a fixed safe base")),
    ("setup", Mapping::Mapped("provisioning with the network, stamp-cached; without the step's secrets unless the step sets `setup_secrets: true`")),
    ("network", Mapping::Same("egress for this step (default none)")),
    ("egress", Mapping::Same("this step's egress policy (overrides the pipeline's)")),
    ("timeout", Mapping::Same("seconds of wall time for the step")),
    ("secrets", Mapping::Same("the refs this step gets in its exec env")),
    ("max_iterations", Mapping::Same("an agent's tool-call cap; uncapped by default, as the peer (bounded by the step's timeout)")),
    ("mounts", Mapping::Same("`workspace: rw|ro`")),
    ("setup_secrets", Mapping::Belay("give the step's secrets to its setup")),
];

const LLM: &[(&str, Mapping)] = &[
    ("model", Mapping::Mapped("a provider prefix (`openai/`, `anthropic/`, `deepseek/`...) chooses the dialect and is not sent; without one, `api` (default responses)")),
    ("base_url", Mapping::Same("the endpoint (never taken from the environment)")),
    ("api_key_env", Mapping::Same("the variable with the key; unset fails at start, naming it")),
    ("timeout", Mapping::Same("seconds per model call (default none)")),
    ("api", Mapping::Belay("the dialect: responses, chat-completions or anthropic")),
    ("scrub_requests", Mapping::Belay("scrub secrets from what is sent to the model (default on)")),
];

const ISOLATION: &[(&str, Mapping)] = &[
    ("image", Mapping::Same("the step containers' image (an image from `belay env build` works)")),
    ("memory", Mapping::Same("memory cap")),
    ("pids", Mapping::Same("process cap")),
    ("cpus", Mapping::Same("CPU cap")),
    ("allow_git_mutations", Mapping::Same(".git writable by steps (default read-only)")),
    ("seccomp_profile", Mapping::Mapped("a JSON file relative to the pipeline, or `bundled:chromium-userns` (shipped with belay); checked at load, so --dry-run fails on a bad one")),
    ("log_limit", Mapping::Belay("cap of each step log (default 64m)")),
];

#[derive(Deserialize)]
struct Nested {
    #[serde(default)]
    steps: Vec<BTreeMap<String, Spanned<Value>>>,
    #[serde(default)]
    llm: Option<BTreeMap<String, Spanned<Value>>>,
    #[serde(default)]
    isolation: Option<BTreeMap<String, Spanned<Value>>>,
}

struct Line {
    line: u64,
    column: u64,
    key: String,
    text: String,
}

fn describe(table: &[(&str, Mapping)], key: &str) -> String {
    match table.iter().find(|(k, _)| *k == key).map(|(_, m)| *m) {
        Some(Mapping::Same(t)) => format!("same: {t}"),
        Some(Mapping::Mapped(t)) => format!("mapped: {t}"),
        Some(Mapping::Refused(t)) => format!("REFUSED: {t}"),
        Some(Mapping::Belay(t)) => format!("belay's own: {t}"),
        None => "unknown to both agentic-dev-loop and belay: the load refuses it".into(),
    }
}

/// The line of a top-level `key:` (no indentation), for keys whose value
/// starts on the next line.
fn top_key_line(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .position(|l| {
            l.strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with(':'))
        })
        .map(|i| i as u64 + 1)
}

/// Every key of the file, in file order, with how belay maps it.
pub fn explain(text: &str, path: &Path) -> Result<String, LoadError> {
    let err = |line, column, message| LoadError {
        path: path.to_path_buf(),
        line,
        column,
        message,
    };
    let top: BTreeMap<String, Spanned<Value>> = serde_saphyr::from_str(text)
        .map_err(|e| err(1, 1, format!("not a YAML mapping of pipeline keys: {e}")))?;
    let nested: Nested = serde_saphyr::from_str(text).map_err(|e| {
        err(
            1,
            1,
            format!("`steps`, `llm` or `isolation` has the wrong shape: {e}"),
        )
    })?;
    let mut lines = Vec::new();
    for (k, v) in &top {
        lines.push(Line {
            line: top_key_line(text, k).unwrap_or(v.referenced.line()),
            column: 1,
            key: k.clone(),
            text: describe(TOP, k),
        });
    }
    for (table, map, prefix) in [
        (LLM, &nested.llm, "llm"),
        (ISOLATION, &nested.isolation, "isolation"),
    ] {
        for (k, v) in map.iter().flatten() {
            let mut text = describe(table, k);
            if prefix == "llm" && k == "model" {
                if let Some(model) = v.value.as_str() {
                    match belay_model::provider::split(model) {
                        Some((p, rest)) => {
                            let _ = write!(
                                text,
                                " [here: provider `{}` -> dialect {}, model `{rest}`]",
                                p.prefix, p.api
                            );
                        }
                        None => text.push_str(" [here: no provider prefix]"),
                    }
                }
            }
            lines.push(Line {
                line: v.referenced.line(),
                column: v.referenced.column(),
                key: format!("{prefix}.{k}"),
                text,
            });
        }
    }
    for (i, step) in nested.steps.iter().enumerate() {
        let name = step
            .get("name")
            .and_then(|v| v.value.as_str())
            .map(String::from)
            .unwrap_or_else(|| format!("#{}", i + 1));
        for (k, v) in step {
            let text = describe(STEP, k);
            lines.push(Line {
                line: v.referenced.line(),
                column: v.referenced.column(),
                key: format!("steps[{name}].{k}"),
                text,
            });
        }
        let is_agent = step.contains_key("agent");
        if is_agent && !step.contains_key("max_iterations") {
            let at = step
                .get("agent")
                .map(|v| (v.referenced.line(), v.referenced.column()));
            let (line, column) = at.unwrap_or((1, 1));
            lines.push(Line {
                line,
                column,
                key: format!("steps[{name}].max_iterations"),
                text: "not given: uncapped, as the peer (the step's timeout bounds it)".into(),
            });
        }
    }
    lines.sort_by_key(|l| (l.line, l.column));
    let width = lines.iter().map(|l| l.key.len()).max().unwrap_or(0);
    let mut out = String::new();
    for l in &lines {
        let _ = writeln!(
            out,
            "{}:{}:{}  {:width$}  {}",
            path.display(),
            l.line,
            l.column,
            l.key,
            l.text
        );
    }
    let refused = lines
        .iter()
        .filter(|l| l.text.starts_with("REFUSED"))
        .count();
    let unknown = lines
        .iter()
        .filter(|l| l.text.starts_with("unknown"))
        .count();
    let _ = writeln!(
        out,
        "{} key(s): {} refused, {} unknown{}",
        lines.len(),
        refused,
        unknown,
        if refused + unknown == 0 {
            "; the file loads as it is (`belay run --dry-run` shows the plan)"
        } else {
            "; change those lines, then `belay run --dry-run`"
        }
    );
    Ok(out)
}
