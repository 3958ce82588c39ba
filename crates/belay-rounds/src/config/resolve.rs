//! From the raw tables to a checked [`Config`].

use std::path::{Path, PathBuf};

use belay_agent::AgentKind;

use super::agent::{merge, AgentConfig};
use super::raw::{
    RawAgent, RawConfig, RawLimits, RawMonitor, RawPhaseOverride, RawPhases, RawPrompt, RawRuntime,
    RawVcs,
};
use super::*;
use crate::schedule::Schedule;

fn positive(
    src: &Src<'_>,
    v: &Option<toml::Spanned<f64>>,
    name: &str,
    default: f64,
) -> Result<f64, RoundsError> {
    match v {
        None => Ok(default),
        Some(s) if *s.get_ref() > 0.0 && *s.get_ref() <= MAX_SECONDS => Ok(*s.get_ref()),
        Some(s) => Err(src.err(
            s.span(),
            format!("{name} must be above 0 and at most {MAX_SECONDS} (30 days)"),
        )),
    }
}

/// The longest span any seconds setting may name (30 days).
pub(crate) const MAX_SECONDS: f64 = 30.0 * 86400.0;

/// A seconds setting that may be 0 (off), at most [`MAX_SECONDS`].
fn seconds(src: &Src<'_>, v: Option<f64>, name: &str) -> Result<Option<f64>, RoundsError> {
    match v {
        Some(x) if !(0.0..=MAX_SECONDS).contains(&x) => Err(src.err_file(format!(
            "{name} must be between 0 and {MAX_SECONDS} seconds"
        ))),
        o => Ok(o),
    }
}

/// A `cmd:` program given with a slash is relative to the work dir (as the
/// peer resolves it), not to wherever belay was started.
fn anchor_program(agent: &mut AgentConfig, work_dir: &std::path::Path) {
    if let AgentKind::Command { program, .. } = &mut agent.spec.kind {
        let p = PathBuf::from(&*program);
        if p.is_relative() && p.components().count() > 1 {
            *program = work_dir.join(p).display().to_string();
        }
    }
}

pub(super) fn resolve(src: &Src<'_>, raw: RawConfig) -> Result<Config, RoundsError> {
    let base = src
        .path
        .parent()
        .unwrap_or(std::path::Path::new("/"))
        .to_path_buf();
    let rt = raw.runtime;
    let work_dir = expand(rt.work_dir.get_ref(), &base, "");
    let work_dir = fs_err::canonicalize(&work_dir).map_err(|e| {
        src.err(
            rt.work_dir.span(),
            format!("work_dir {}: {e}", work_dir.display()),
        )
    })?;
    let project = project_name(&work_dir);
    let log_dir = expand(rt.log_dir.get_ref(), &base, &project);
    refuse_removed_keys(src, &rt)?;
    let transient_error_action = transient_action(src, &rt)?;
    let notes = notes_of(&rt, &raw.monitor);
    let agent_span = raw.agent.span();
    let raw_agent = raw.agent.into_inner();
    let mut agent = AgentConfig::resolve(src, &raw_agent, agent_span.clone(), &base, &project)?;
    anchor_program(&mut agent, &work_dir);
    let round_budget_s = positive(src, &rt.round_budget_s, "round_budget_s", 1800.0)?;
    let restart_delay_s = positive(
        src,
        &rt.restart_delay_s,
        "restart_delay_s (0 is not allowed: a crash would spin)",
        3.0,
    )?;

    let prompt = resolve_prompt(src, raw.prompt, &work_dir, &project)?;
    let dirty_action = dirty_action_of(src, &raw.vcs)?;

    let schedule = Schedule::resolve(src, &raw.schedule)?;
    let places = Places {
        base: &base,
        work_dir: &work_dir,
        project: &project,
    };
    let (phases, phase_policy) = match raw.phases {
        None => (Vec::new(), PhasePolicy::Wait),
        Some(ph) => resolve_phases(src, &ph, &raw_agent, &places)?,
    };

    let l = raw.limits;
    check_limits(src, &l)?;
    let monitor = MonitorConfig::resolve(src, raw.monitor)?;
    Ok(Config {
        path: src.path.to_path_buf(),
        project: project.clone(),
        agent,
        runtime: Runtime {
            work_dir: work_dir.clone(),
            log_dir,
            round_budget_s,
            restart_delay_s,
            round_log_retention: rt.round_log_retention.unwrap_or(0),
            transient_error_action,
            max_rounds: rt.max_rounds,
            stop_file: rt.stop_file.map(|f| expand(&f, &work_dir, &project)),
            fresh_eyes_every_n: rt.fresh_eyes_every_n.filter(|n| *n > 0),
            dry_run: rt.dry_run.unwrap_or(false),
            grace_after_result_s: seconds(
                src,
                rt.max_grace_after_result_s,
                "max_grace_after_result_s",
            )?
            .filter(|g| *g > 0.0)
            .unwrap_or(0.0),
        },
        prompt,
        dirty_action,
        stash_idempotency_s: seconds(src, raw.vcs.stash_idempotency_s, "stash_idempotency_s")?
            .unwrap_or(5.0),
        phases,
        phase_policy,
        schedule,
        monitor,
        limits: Limits {
            round_cost_usd: l.round_cost_usd,
            day_cost_usd: l.day_cost_usd,
            round_turns: l.round_turns,
            day_turns: l.day_turns,
        },
        notes,
        source: src.text.to_string(),
    })
}

/// Where relative paths of the config resolve: the config's dir, the work dir, the project.
struct Places<'p> {
    base: &'p Path,
    work_dir: &'p Path,
    project: &'p str,
}

/// Refuse the `[runtime]` keys the peer removed and those belay does not support.
fn refuse_removed_keys(src: &Src<'_>, rt: &RawRuntime) -> Result<(), RoundsError> {
    for (name, v) in [
        ("round_timeout_per_phase", &rt.round_timeout_per_phase),
        ("rate_limit_action", &rt.rate_limit_action),
    ] {
        if let Some(v) = v {
            let hint = if name == "round_timeout_per_phase" {
                "set round_budget_s in [phases.<name>] instead"
            } else {
                "use transient_error_action = \"back_off\" | \"skip\" | \"stop\""
            };
            return Err(src.err(
                v.span(),
                format!("{name} was removed in cli-agent-runner 0.3: {hint}"),
            ));
        }
    }
    if let Some(n) = &rt.narrative_file {
        return Err(src.err(n.span(), "narrative_file is not supported: belay has no narrate mode (read `belay rounds events` or `monitor --mode events`). Remove the key."));
    }
    if let Some(s) = &rt.substrate_fingerprint_paths {
        if !s.get_ref().is_empty() {
            return Err(src.err(
                s.span(),
                "substrate_fingerprint_paths is not supported by belay. Remove the key.",
            ));
        }
    }
    Ok(())
}

/// `transient_error_action` (default `back_off`).
fn transient_action(src: &Src<'_>, rt: &RawRuntime) -> Result<TransientAction, RoundsError> {
    Ok(
        match rt
            .transient_error_action
            .as_ref()
            .map(|a| (a.get_ref().as_str(), a.span()))
        {
            None | Some(("back_off", _)) => TransientAction::BackOff,
            Some(("skip", _)) => TransientAction::Skip,
            Some(("stop", _)) => TransientAction::Stop,
            Some((o, s)) => {
                return Err(src.err(
                    s,
                    format!("transient_error_action `{o}`: use back_off, skip or stop"),
                ))
            }
        },
    )
}

/// The notes on keys that load but have no effect in belay.
fn notes_of(rt: &RawRuntime, monitor: &RawMonitor) -> Vec<String> {
    let mut notes = Vec::new();
    if rt
        .grace_kill_ignore_patterns
        .as_ref()
        .is_some_and(|p| !p.is_empty())
    {
        notes.push("grace_kill_ignore_patterns has no effect: belay ends every process a round started (the container, or on the host the round's process tree)".to_string());
    }
    if monitor.remote_failure_tolerance_s.is_some() {
        notes.push("[monitor] remote_failure_tolerance_s has no effect: belay has no ssh relay (run the monitor where serve runs)".to_string());
    }
    notes
}

/// `[prompt]`: its files (relative to the work dir) and how the context goes in.
fn resolve_prompt(
    src: &Src<'_>,
    raw: toml::Spanned<RawPrompt>,
    work_dir: &Path,
    project: &str,
) -> Result<PromptConfig, RoundsError> {
    let prompt_span = raw.span();
    let p = raw.into_inner();
    let files: Vec<String> = match (&p.file, &p.files) {
        (Some(f), None) => vec![f.clone()],
        (None, Some(fs)) if !fs.is_empty() => fs.clone(),
        (Some(_), Some(_)) => {
            return Err(src.err(
                prompt_span,
                "[prompt] has both `file` and `files`: keep one",
            ))
        }
        _ => {
            return Err(src.err(
                prompt_span,
                "[prompt] needs `file = \"./prompts/main.md\"` (or a non-empty `files` list)",
            ))
        }
    };
    let mode = match p
        .context_injection_mode
        .as_ref()
        .map(|m| (m.get_ref().as_str(), m.span()))
    {
        None | Some(("prepend", _)) => ContextMode::Prepend,
        Some(("file", _)) => ContextMode::File,
        Some(("none", _)) => ContextMode::None,
        Some((o, s)) => {
            return Err(src.err(
                s,
                format!("context_injection_mode `{o}`: use prepend, file or none"),
            ))
        }
    };
    Ok(PromptConfig {
        files: files.iter().map(|f| expand(f, work_dir, project)).collect(),
        inject_context: p.inject_context.unwrap_or(true),
        mode,
        separator: p.concat_separator.unwrap_or_else(|| "\n\n".into()),
        strip_frontmatter: p.strip_yaml_frontmatter.unwrap_or(true),
    })
}

/// `[vcs] dirty_action` (default `stash`).
fn dirty_action_of(src: &Src<'_>, vcs: &RawVcs) -> Result<DirtyAction, RoundsError> {
    Ok(
        match vcs
            .dirty_action
            .as_ref()
            .map(|a| (a.get_ref().as_str(), a.span()))
        {
            None | Some(("stash", _)) => DirtyAction::Stash,
            Some(("ignore", _)) => DirtyAction::Ignore,
            Some(("auto_commit", _)) => DirtyAction::AutoCommit,
            Some((o, s)) => {
                return Err(src.err(
                    s,
                    format!("dirty_action `{o}`: use stash, ignore or auto_commit"),
                ))
            }
        },
    )
}

/// `[phases]`: the phases of the list, in order, and the phase policy.
fn resolve_phases(
    src: &Src<'_>,
    ph: &RawPhases,
    raw_agent: &RawAgent,
    places: &Places<'_>,
) -> Result<(Vec<Phase>, PhasePolicy), RoundsError> {
    let policy = match ph
        .phase_policy
        .as_ref()
        .map(|a| (a.get_ref().as_str(), a.span()))
    {
        None | Some(("wait", _)) => PhasePolicy::Wait,
        Some(("skip", _)) => PhasePolicy::Skip,
        Some((o, s)) => return Err(src.err(s, format!("phase_policy `{o}`: use wait or skip"))),
    };
    for (name, o) in &ph.overrides {
        if !ph.list.contains(name) {
            return Err(src.err(
                o.span(),
                format!(
                    "[phases.{name}] names no phase in [phases] list ({})",
                    ph.list.join(", ")
                ),
            ));
        }
    }
    let mut out = Vec::new();
    for name in &ph.list {
        out.push(resolve_phase(
            src,
            name,
            ph.overrides.get(name),
            raw_agent,
            places,
        )?);
    }
    Ok((out, policy))
}

/// One phase: `[phases.<name>]` over the top-level `[agent]` and prompt.
fn resolve_phase(
    src: &Src<'_>,
    name: &str,
    o: Option<&toml::Spanned<RawPhaseOverride>>,
    raw_agent: &RawAgent,
    places: &Places<'_>,
) -> Result<Phase, RoundsError> {
    let (work_dir, project) = (places.work_dir, places.project);
    let span = o.map(|o| o.span()).unwrap_or(0..0);
    let o = o.map(|o| o.get_ref().clone()).unwrap_or_default();
    let agent = match &o.agent {
        Some(a) => {
            let mut merged = merge(raw_agent, a);
            // A phase that swaps the belay spec for a command (or back)
            // replaces the other.
            if a.command.is_some() {
                merged.agent = None;
            } else if a.agent.is_some() {
                merged.command = None;
                merged.prompt_arg_template = None;
                merged.prompt_delivery = None;
            }
            let mut c = AgentConfig::resolve(src, &merged, span.clone(), places.base, project)?;
            anchor_program(&mut c, work_dir);
            Some(c)
        }
        None => None,
    };
    let budget = o
        .round_budget_s
        .or(o.runtime.as_ref().and_then(|r| r.round_budget_s));
    if budget.is_some_and(|b| !(b > 0.0 && b <= MAX_SECONDS)) {
        return Err(src.err(
            span,
            format!("[phases.{name}] round_budget_s must be above 0"),
        ));
    }
    let prompt_files = o
        .prompt
        .as_ref()
        .and_then(|p| p.files.clone().or_else(|| p.file.clone().map(|f| vec![f])));
    Ok(Phase {
        name: name.to_string(),
        round_budget_s: budget,
        prompt_files: prompt_files
            .map(|fs| fs.iter().map(|f| expand(f, work_dir, project)).collect()),
        agent,
        schedule: match &o.schedule {
            Some(s) => Some(Schedule::resolve(src, s)?),
            None => None,
        },
    })
}

/// `[limits]`: a cost limit must be above 0.
fn check_limits(src: &Src<'_>, l: &RawLimits) -> Result<(), RoundsError> {
    for (n, v) in [
        ("round_cost_usd", l.round_cost_usd),
        ("day_cost_usd", l.day_cost_usd),
    ] {
        if v.is_some_and(|v| v <= 0.0 || !v.is_finite()) {
            return Err(src.err_file(format!("[limits] {n} must be above 0")));
        }
    }
    Ok(())
}
