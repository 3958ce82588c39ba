//! The one agent spec syntax, parsed here and nowhere else, for every flag
//! and config file that names an agent:
//!
//! ```text
//! builtin | codex | claude | gemini | grok | antigravity (agy) | cmd:PROGRAM ARG…
//!     then optionally @MODEL
//! ```
//!
//! * `codex@gpt-5-codex`: a named agent with its model;
//! * `cmd:./agent.sh --task {prompt}`: any program; an argument `{prompt}`
//!   receives the prompt, and without one the prompt goes on stdin. Arguments
//!   are split on white space; single or double quotes keep one together. A
//!   last word `@MODEL` sets the model (`cmd:./a.sh {prompt} @small`);
//! * the program of a `cmd:` agent is mounted read-only into the container at
//!   the same path, so any script can be an agent.

use std::fmt;

use crate::cli::CliKind;

/// Which agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentKind {
    Builtin,
    Codex,
    Claude,
    Gemini,
    Grok,
    /// Google's Antigravity CLI, `agy`.
    Antigravity,
    /// `cmd:`: the program, then its arguments.
    Command {
        program: String,
        args: Vec<String>,
    },
}

/// A parsed agent spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    pub kind: AgentKind,
    pub model: Option<String>,
}

/// Why a spec does not parse; the message says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agent spec `{spec}`: {why}. Use builtin, codex, claude, gemini, grok, antigravity (agy) or cmd:PROGRAM ARG… (each optionally followed by @MODEL)")]
pub struct SpecError {
    pub spec: String,
    pub why: String,
}

impl belay_record::Classify for SpecError {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Usage
    }
}

/// Split `s` into words: white space separates, quotes group. The error is
/// the quote left open.
fn words(s: &str) -> Result<Vec<String>, char> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(q);
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

fn valid_model(m: &str) -> bool {
    !m.is_empty()
        && m.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/'))
}

impl std::str::FromStr for AgentSpec {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, SpecError> {
        let err = |why: &str| SpecError {
            spec: spec.to_string(),
            why: why.to_string(),
        };
        let s = spec.trim();
        if let Some(rest) = s.strip_prefix("cmd:") {
            let mut w = words(rest).map_err(|q| err(&format!("an unclosed {q} quote")))?;
            let mut model = None;
            if w.len() > 1 && w.last().is_some_and(|l| l.starts_with('@')) {
                let m = w.pop().unwrap_or_default()[1..].to_string();
                if !valid_model(&m) {
                    return Err(err(
                        "the model after @ is empty or has characters a model name cannot have",
                    ));
                }
                model = Some(m);
            }
            let Some((program, args)) = w.split_first() else {
                return Err(err("cmd: needs a program"));
            };
            return Ok(AgentSpec {
                kind: AgentKind::Command {
                    program: program.clone(),
                    args: args.to_vec(),
                },
                model,
            });
        }
        let (name, model) = match s.split_once('@') {
            Some((n, m)) => {
                if !valid_model(m) {
                    return Err(err(
                        "the model after @ is empty or has characters a model name cannot have",
                    ));
                }
                (n, Some(m.to_string()))
            }
            None => (s, None),
        };
        let kind = match name {
            "builtin" => AgentKind::Builtin,
            "codex" => AgentKind::Codex,
            "claude" => AgentKind::Claude,
            "gemini" => AgentKind::Gemini,
            "grok" => AgentKind::Grok,
            "antigravity" | "agy" => AgentKind::Antigravity,
            "" => return Err(err("it is empty")),
            _ => return Err(err(&format!("`{name}` is not an agent"))),
        };
        Ok(AgentSpec { kind, model })
    }
}

impl AgentSpec {
    /// The CLI adapter this spec runs with, or `None` for the built-in agent.
    pub fn cli_kind(&self) -> Option<CliKind> {
        match &self.kind {
            AgentKind::Builtin => None,
            AgentKind::Codex => Some(CliKind::Codex),
            AgentKind::Claude => Some(CliKind::Claude),
            AgentKind::Gemini => Some(CliKind::Gemini),
            AgentKind::Grok => Some(CliKind::Grok),
            AgentKind::Antigravity => Some(CliKind::Antigravity),
            AgentKind::Command { .. } => Some(CliKind::Plain),
        }
    }

    pub fn is_builtin(&self) -> bool {
        self.kind == AgentKind::Builtin
    }
}

fn quoted(w: &str) -> String {
    if !w.is_empty() && !w.contains(char::is_whitespace) && !w.contains(['\'', '"']) {
        return w.to_string();
    }
    if w.contains('\'') {
        format!("\"{w}\"")
    } else {
        format!("'{w}'")
    }
}

impl fmt::Display for AgentSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            AgentKind::Builtin => f.write_str("builtin")?,
            AgentKind::Codex => f.write_str("codex")?,
            AgentKind::Claude => f.write_str("claude")?,
            AgentKind::Gemini => f.write_str("gemini")?,
            AgentKind::Grok => f.write_str("grok")?,
            AgentKind::Antigravity => f.write_str("antigravity")?,
            AgentKind::Command { program, args } => {
                write!(f, "cmd:{}", quoted(program))?;
                for a in args {
                    write!(f, " {}", quoted(a))?;
                }
                if let Some(m) = &self.model {
                    return write!(f, " @{m}");
                }
                return Ok(());
            }
        }
        if let Some(m) = &self.model {
            write!(f, "@{m}")?;
        }
        Ok(())
    }
}

/// An agent pointed at an endpoint whose wire dialect it does not speak
/// (Claude Code at an OpenAI Responses address, codex at an Anthropic one):
/// refused before any work, since every call would fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {role} agent `{agent}` speaks {speaks}, but its endpoint {base_url} is set to `{api}`: {fix}")]
pub struct DialectError {
    /// `developer`, `reviewer`, `planner`, `round`, `job`, a step's name…
    pub role: String,
    pub agent: String,
    /// What it speaks, in words.
    pub speaks: &'static str,
    pub api: belay_model::Api,
    pub base_url: String,
    /// How to fix it, in the mode's own flags.
    pub fix: String,
}

impl belay_record::Classify for DialectError {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Usage
    }
}

impl AgentKind {
    /// The wire dialects this agent can be pointed at, with their words;
    /// `None` where belay does not choose: the built-in agent calls any
    /// through belay's own client, a `cmd:` program is given the address and
    /// the dialect, and grok and agy are not wired to an endpoint.
    pub fn dialects(&self) -> Option<(&'static [belay_model::Api], &'static str)> {
        use belay_model::Api;
        match self {
            AgentKind::Claude => Some((
                &[Api::Anthropic],
                "the Anthropic Messages API (`anthropic`)",
            )),
            AgentKind::Codex => Some((
                &[Api::Responses, Api::ChatCompletions],
                "the OpenAI Responses or Chat Completions API (`responses`, `chat-completions`)",
            )),
            AgentKind::Gemini => Some((&[Api::Gemini], "Google's Gemini API (`gemini`)")),
            AgentKind::Builtin
            | AgentKind::Grok
            | AgentKind::Antigravity
            | AgentKind::Command { .. } => None,
        }
    }

    /// The first dialect this agent speaks (what a fix should name).
    pub fn native_dialect(&self) -> Option<belay_model::Api> {
        self.dialects().and_then(|(d, _)| d.first().copied())
    }
}

impl AgentSpec {
    /// Refuse an endpoint this agent cannot talk to, before any work.
    /// `fix` is told the dialect to name and says how, in the mode's flags.
    pub fn check_dialect(
        &self,
        role: &str,
        api: belay_model::Api,
        base_url: &str,
        fix: impl FnOnce(belay_model::Api) -> String,
    ) -> Result<(), DialectError> {
        let Some((accepted, speaks)) = self.kind.dialects() else {
            return Ok(());
        };
        if accepted.contains(&api) {
            return Ok(());
        }
        Err(DialectError {
            role: role.to_string(),
            agent: self.to_string(),
            speaks,
            api,
            base_url: base_url.to_string(),
            fix: fix(accepted[0]),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> Result<AgentSpec, SpecError> {
        s.parse()
    }

    #[test]
    fn every_form_parses() {
        assert_eq!(p("builtin").unwrap().kind, AgentKind::Builtin);
        let c = p("codex@gpt-5-codex").unwrap();
        assert_eq!(c.kind, AgentKind::Codex);
        assert_eq!(c.model.as_deref(), Some("gpt-5-codex"));
        assert_eq!(p("claude").unwrap().model, None);
        assert_eq!(p("agy@gemini-3").unwrap().kind, AgentKind::Antigravity);
        assert_eq!(p("grok").unwrap().to_string(), "grok");
        let g = p("gemini@models/gemini-2.5-pro").unwrap();
        assert_eq!(g.model.as_deref(), Some("models/gemini-2.5-pro"));
        let cmd = p("cmd:./agent.sh --task '{prompt}' \"two words\" @small").unwrap();
        assert_eq!(
            cmd.kind,
            AgentKind::Command {
                program: "./agent.sh".into(),
                args: vec!["--task".into(), "{prompt}".into(), "two words".into()]
            }
        );
        assert_eq!(cmd.model.as_deref(), Some("small"));
        // An address in an argument is not a model.
        let mail = p("cmd:notify user@example.invalid").unwrap();
        assert_eq!(mail.model, None);
    }

    #[test]
    fn bad_specs_say_what_is_accepted() {
        for bad in [
            "",
            "aider",
            "codex@",
            "codex@a b",
            "cmd:",
            "cmd:'open",
            "cmd:x @",
        ] {
            let e = p(bad).unwrap_err().to_string();
            assert!(e.contains("cmd:PROGRAM"), "{bad}: {e}");
        }
    }

    proptest! {
        /// Whatever a spec says, parsing its display gives it back, and no
        /// input makes the parser panic.
        #[test]
        fn display_round_trips(
            prog in "[a-z./_-]{1,12}",
            args in proptest::collection::vec("[ -~]{0,10}", 0..4),
            model in proptest::option::of("[a-z0-9.-]{1,10}"),
        ) {
            let args: Vec<String> = args
                .into_iter()
                .filter(|a| !(a.contains('\'') && a.contains('"')))
                .collect();
            // A last argument that starts with @ reads as a model, by the rule.
            prop_assume!(!args.last().is_some_and(|a| a.starts_with('@')));
            let spec = AgentSpec { kind: AgentKind::Command { program: prog, args }, model };
            let text = spec.to_string();
            let back: AgentSpec = text.parse().unwrap();
            prop_assert_eq!(back, spec);
        }

        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<AgentSpec>();
        }
    }

    #[test]
    fn each_cli_is_checked_against_the_one_dialect_table() {
        use belay_model::Api;
        let fix = |a: Api| format!("use {a}");
        let claude = p("claude@m").unwrap();
        assert!(claude
            .check_dialect("reviewer", Api::Anthropic, "u", fix)
            .is_ok());
        let e = claude
            .check_dialect("reviewer", Api::Responses, "http://x/v1", fix)
            .unwrap_err();
        assert_eq!(e.fix, "use anthropic");
        assert!(
            e.to_string()
                .starts_with("the reviewer agent `claude@m` speaks the Anthropic Messages API"),
            "{e}"
        );
        let codex = p("codex").unwrap();
        assert!(codex.check_dialect("d", Api::Responses, "u", fix).is_ok());
        assert!(codex
            .check_dialect("d", Api::ChatCompletions, "u", fix)
            .is_ok());
        assert_eq!(
            codex
                .check_dialect("d", Api::Anthropic, "u", fix)
                .unwrap_err()
                .fix,
            "use responses"
        );
        assert!(p("gemini")
            .unwrap()
            .check_dialect("d", Api::Responses, "u", fix)
            .is_err());
        assert!(p("gemini")
            .unwrap()
            .check_dialect("d", Api::Gemini, "u", fix)
            .is_ok());
        // Not checked: the built-in agent, grok, agy and commands.
        for s in ["builtin", "grok", "agy", "cmd:./a.sh"] {
            assert!(
                p(s).unwrap()
                    .check_dialect("d", Api::Anthropic, "u", fix)
                    .is_ok(),
                "{s}"
            );
        }
        assert_eq!(AgentKind::Claude.native_dialect(), Some(Api::Anthropic));
        assert_eq!(AgentKind::Builtin.native_dialect(), None);
    }
}
