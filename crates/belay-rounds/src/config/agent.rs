//! The `[agent]` table: the peer's `command` + `prompt_arg_template` +
//! `prompt_delivery`, or a belay agent spec, and where it runs.

use std::path::PathBuf;

use belay_agent::cli::CliKind;
use belay_agent::{AgentKind, AgentSpec};
use belay_model::Api;

use super::raw::RawAgent;
use super::Src;
use crate::RoundsError;

/// Where a round's agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementKind {
    /// A container of the round's own (the default).
    Container,
    /// This machine: the documented opt-out of the sandbox.
    Host,
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// What runs, in the one spec syntax.
    pub spec: AgentSpec,
    /// The program's base name (what the presets and adapters key on).
    pub binary: String,
    /// Literal values from `[agent.env]`.
    pub env: Vec<(String, String)>,
    /// Host variables passed by name (their values are secrets).
    pub pass_env: Vec<String>,
    pub exec_prefix: Vec<String>,
    pub terminal_marker: Option<String>,
    pub sigterm_grace_s: f64,
    pub placement: PlacementKind,
    /// The image named in the config (an image or an env build's run id),
    /// else [`DEFAULT_IMAGE`]; the binary resolves it
    /// (`belay_env::sandbox_image`) before any round.
    pub image: String,
    /// Whether the config named `image` (else the repository's latest env
    /// build with git may take the default's place).
    pub image_named: bool,
    pub model_url: Option<String>,
    pub model_api: Api,
    pub model_key_env: Option<String>,
    /// Host directories mounted at the same place under the container's home.
    pub login_dirs: Vec<PathBuf>,
    pub login_write_back: bool,
    pub auto_approve: bool,
    pub name: Option<String>,
}

/// The default image round agents run in: the base image plus git, so that
/// they can commit (`./scripts/setup-host.sh --agents` builds it).
pub const DEFAULT_IMAGE: &str = belay_sandbox::bootstrap::AGENT_IMAGE;

/// Field-merge `over` onto `base` (a phase's `[phases.<name>.agent]`).
pub(crate) fn merge(base: &RawAgent, over: &RawAgent) -> RawAgent {
    macro_rules! pick {
        ($($f:ident),*) => { RawAgent { $($f: over.$f.clone().or_else(|| base.$f.clone()),)* } };
    }
    pick!(
        command,
        prompt_arg_template,
        prompt_delivery,
        name,
        env,
        exec_prefix,
        terminal_marker,
        sigterm_grace_s,
        agent,
        placement,
        image,
        model_url,
        model_api,
        model_key_env,
        pass_env,
        login_dirs,
        login_write_back,
        auto_approve
    )
}

fn default_login_dir(binary: &str) -> Option<&'static str> {
    match binary {
        "claude" => Some(".claude"),
        "codex" => Some(".codex"),
        "gemini" => Some(".gemini"),
        _ => None,
    }
}

impl AgentConfig {
    pub(crate) fn resolve(
        src: &Src<'_>,
        raw: &RawAgent,
        span: std::ops::Range<usize>,
        base: &std::path::Path,
        project: &str,
    ) -> Result<AgentConfig, RoundsError> {
        let spec = match (&raw.agent, &raw.command) {
            (Some(_), Some(_)) => {
                return Err(src.err(
                    span,
                    "[agent] has both `agent` (a belay spec) and `command`: keep one",
                ))
            }
            (None, None) => {
                return Err(src.err(
                    span,
                    "[agent] needs `command` (with `prompt_arg_template`) or `agent = \"codex@MODEL\"` (a belay spec)",
                ))
            }
            (Some(s), None) => {
                if raw.prompt_arg_template.is_some() || raw.prompt_delivery.is_some() {
                    return Err(src.err(
                        s.span(),
                        "a belay spec builds its own argv: remove prompt_arg_template and prompt_delivery",
                    ));
                }
                s.get_ref()
                    .parse::<AgentSpec>()
                    .map_err(|e| src.err(s.span(), e))?
            }
            (None, Some(cmd)) => peer_spec(src, raw, cmd, span.clone())?,
        };
        let binary = match &spec.kind {
            AgentKind::Command { program, .. } => std::path::Path::new(program)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| program.clone()),
            k => format!("{k:?}").to_lowercase(),
        };
        let placement = match raw
            .placement
            .as_ref()
            .map(|p| (p.get_ref().as_str(), p.span()))
        {
            None | Some(("container", _)) => PlacementKind::Container,
            Some(("host", _)) => PlacementKind::Host,
            Some((o, s)) => {
                return Err(src.err(
                    s,
                    format!("placement `{o}`: use \"container\" (the default) or \"host\""),
                ))
            }
        };
        let exec_prefix = raw.exec_prefix.clone().unwrap_or_default();
        if !exec_prefix.is_empty() && placement == PlacementKind::Container {
            return Err(src.err(
                span,
                "exec_prefix wraps the agent in your own container, and belay already runs it in one: remove exec_prefix, or set placement = \"host\" to keep your wrapper",
            ));
        }
        let (model_api, streams) = model_dialect(src, raw, &spec)?;
        let sigterm_grace_s = match &raw.sigterm_grace_s {
            None => 10.0,
            Some(g) if (1.0..=12.0).contains(g.get_ref()) => *g.get_ref(),
            Some(g) => {
                return Err(src.err(g.span(), "sigterm_grace_s must be between 1 and 12"));
            }
        };
        let login_dirs = match &raw.login_dirs {
            Some(d) => d.iter().map(|p| super::expand(p, base, project)).collect(),
            None => default_login_dir(&binary)
                .and_then(|d| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(d)))
                .filter(|p| p.is_dir())
                .into_iter()
                .collect(),
        };
        let mut env: Vec<(String, String)> =
            raw.env.clone().unwrap_or_default().into_iter().collect();
        env.sort();
        // A peer config names the model in [agent.env] (`ANTHROPIC_BASE_URL
        // = "http://127.0.0.1:PORT"`), an address belay's container cannot
        // reach: without `model_url` it becomes the endpoint, which belay
        // routes to the container like any other.
        let mut model_url = raw.model_url.clone();
        if model_url.is_none() {
            let var = streams.and_then(CliKind::endpoint_vars).map(|(url, _)| url);
            if let Some(i) = var.and_then(|v| env.iter().position(|(k, _)| k == v)) {
                model_url = Some(env.remove(i).1);
            }
        }
        Ok(AgentConfig {
            spec,
            binary,
            env,
            pass_env: raw.pass_env.clone().unwrap_or_default(),
            exec_prefix,
            terminal_marker: Some(
                raw.terminal_marker
                    .clone()
                    .unwrap_or_else(|| "\"type\":\"result\"".to_string()),
            )
            .filter(|m| !m.is_empty()),
            sigterm_grace_s,
            placement,
            image: raw
                .image
                .clone()
                .unwrap_or_else(|| DEFAULT_IMAGE.to_string()),
            image_named: raw.image.is_some(),
            model_url,
            model_api,
            model_key_env: raw.model_key_env.clone(),
            login_dirs,
            login_write_back: raw.login_write_back.unwrap_or(false),
            auto_approve: raw.auto_approve.unwrap_or(false),
            name: raw.name.clone(),
        })
    }
}

/// The peer's agent as a `cmd:` spec: the program, its arguments, then the
/// template; `{prompt}` in the template puts the prompt in argv, and stdin
/// delivery has none.
fn peer_spec(
    src: &Src<'_>,
    raw: &RawAgent,
    cmd: &[String],
    span: std::ops::Range<usize>,
) -> Result<AgentSpec, RoundsError> {
    let Some((program, args)) = cmd.split_first().filter(|(p, _)| !p.trim().is_empty()) else {
        return Err(src.err(
            span,
            "[agent] command is empty: give the program first, e.g. [\"claude\", \"-p\"]",
        ));
    };
    let Some(template) = &raw.prompt_arg_template else {
        return Err(src.err(
            span,
            "[agent] command needs prompt_arg_template (e.g. [\"-p\", \"{prompt}\"], or [\"-p\"] with prompt_delivery = \"stdin\")",
        ));
    };
    let has_prompt = template.iter().any(|a| a.contains("{prompt}"));
    match raw.prompt_delivery.as_deref().unwrap_or("argv") {
        "argv" if !has_prompt => {
            return Err(src.err(
                span,
                "prompt_delivery = \"argv\" needs `{prompt}` in prompt_arg_template (or set prompt_delivery = \"stdin\")",
            ))
        }
        "stdin" if has_prompt => {
            return Err(src.err(
                span,
                "prompt_delivery = \"stdin\" must not have `{prompt}` in prompt_arg_template",
            ))
        }
        "argv" | "stdin" => {}
        o => {
            return Err(src.err(
                span,
                format!("prompt_delivery `{o}`: use \"argv\" or \"stdin\""),
            ))
        }
    }
    let mut all: Vec<String> = raw.exec_prefix.clone().unwrap_or_default();
    let program = if all.is_empty() {
        program.clone()
    } else {
        all.push(program.clone());
        all.remove(0)
    };
    all.extend(args.iter().cloned());
    all.extend(template.iter().cloned());
    Ok(AgentSpec {
        kind: AgentKind::Command { program, args: all },
        model: None,
    })
}

/// The endpoint's dialect (unset: the one the agent speaks, a command's by
/// the CLI whose stream it prints; set: one it speaks), and the CLI whose
/// stream a command prints.
fn model_dialect(
    src: &Src<'_>,
    raw: &RawAgent,
    spec: &AgentSpec,
) -> Result<(Api, Option<CliKind>), RoundsError> {
    // Unset, the dialect is the one the agent speaks (a command's, by
    // the CLI whose stream it prints); set, it must be one.
    let streams = match &spec.kind {
        AgentKind::Command { program, args } => belay_agent::cli::stream_of(program, args),
        _ => None,
    };
    let native = spec
        .kind
        .native_dialect()
        .or(streams.and_then(CliKind::native_dialect));
    let model_api = match raw.model_api.as_ref() {
        None => native.unwrap_or(Api::Responses),
        Some(a) => {
            let api: Api = a.get_ref().parse().map_err(|_| {
                src.err(
                    a.span(),
                    format!(
                        "model_api `{}`: use responses, chat-completions, anthropic or gemini",
                        a.get_ref()
                    ),
                )
            })?;
            if let Some(url) = raw.model_url.as_deref() {
                spec.check_dialect("round", api, url, |native| {
                    format!("set model_api = \"{native}\" (or remove it: the agent's own dialect is the default)")
                })
                .map_err(|e| src.err(a.span(), e.to_string()))?;
            }
            api
        }
    };
    Ok((model_api, streams))
}
