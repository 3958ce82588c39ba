//! `belay run --dry-run`: the resolved plan, from the file alone (no Docker,
//! no model, no state).

use std::fmt::Write;

use crate::engine::{state_dir_for, ARTIFACTS, DEFAULT_IMAGE, WORKDIR};
use crate::schema::{Access, DepsPolicy, Pipeline, Step, StepKind};

pub fn plan(p: &Pipeline, state_dir: Option<&std::path::Path>) -> String {
    let mut s = String::new();
    let image = p
        .isolation
        .image
        .clone()
        .unwrap_or_else(|| DEFAULT_IMAGE.into());
    let _ = writeln!(s, "pipeline {} ({})", p.name, p.path.display());
    let _ = writeln!(s, "max attempts: {}", p.max_attempts);
    let _ = writeln!(s, "state dir: {}", state_dir_for(p, state_dir).display());
    write_model(&mut s, p);
    let _ = writeln!(
        s,
        "dependency policy: {}{}",
        match p.deps_policy {
            DepsPolicy::Locked => "locked",
            DepsPolicy::Open => "open",
        },
        if p.lockfiles.is_empty() {
            String::new()
        } else {
            format!(" (lockfiles: {})", p.lockfiles.join(", "))
        }
    );
    let _ = writeln!(
        s,
        "sandbox: image {image}, root filesystem read-only, capabilities dropped, no-new-privileges, /tmp tmpfs emptied and processes ended after every step, memory {}, pids {}, log cap {}{}{}{}",
        p.isolation.memory.clone().unwrap_or_else(|| format!("{} MiB (default)", belay_sandbox::default_memory() >> 20)),
        p.isolation.pids.map(|n| n.to_string()).unwrap_or_else(|| format!("{} (default)", belay_sandbox::DEFAULT_PIDS)),
        p.isolation.log_limit.clone().unwrap_or_else(|| "64m (default)".into()),
        p.isolation.cpus.map(|c| format!(", cpus {c}")).unwrap_or_default(),
        if p.isolation.allow_git_mutations { ", git mutations ALLOWED" } else { ", .git read-only" },
        p.isolation.seccomp_profile.as_ref().map(|f| format!(", seccomp {f}")).unwrap_or_default(),
    );
    if !p.caches.is_empty() {
        let _ = writeln!(
            s,
            "caches (rw, shared across runs, never committed): {}",
            p.caches
                .iter()
                .map(|c| match c.in_workspace() {
                    Some(rel) => format!("{WORKDIR}/{rel}"),
                    None => c.path.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        s,
        "artifacts: {ARTIFACTS} in every step (the run's own directory, rw, outside the worktree)"
    );
    let _ = writeln!(
        s,
        "commit excludes: the tooling, the artifacts, .venv-sandbox{}{}",
        if p.caches.iter().any(|c| c.in_workspace().is_some()) {
            ", the workspace caches"
        } else {
            ""
        },
        if p.sync_excludes.is_empty() {
            String::new()
        } else {
            format!(", sync_excludes {}", p.sync_excludes.join(", "))
        }
    );
    write_secrets(&mut s, p);
    let _ = writeln!(s, "steps:");
    for (i, st) in p.steps.iter().enumerate() {
        write_step(&mut s, p, i, st);
    }
    s
}

/// The model lines: endpoint, dialect, key and call timeout (or none).
fn write_model(s: &mut String, p: &Pipeline) {
    match &p.llm {
        Some(l) => {
            let key = l
                .api_key_env
                .clone()
                .unwrap_or_else(|| "OPENAI_API_KEY".into());
            let _ = writeln!(
                s,
                "model: {} via {} ({}{}), key from ${key}{}",
                l.model,
                l.base_url.as_deref().unwrap_or("the vendor's endpoint"),
                l.api
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "responses".into()),
                p.llm_provider
                    .as_ref()
                    .map(|pr| format!(", from the provider prefix `{pr}/`"))
                    .unwrap_or_default(),
                if l.api_key_env.is_some() {
                    " (must be set)"
                } else {
                    ""
                },
            );
            let _ = writeln!(
                s,
                "model call timeout: {}",
                l.timeout
                    .map(|t| format!("{t}s"))
                    .unwrap_or_else(|| "none (agent runs are long)".into())
            );
        }
        None => {
            let _ = writeln!(s, "model: none");
        }
    }
}

/// The secrets (refs only) and the steps that use each.
fn write_secrets(s: &mut String, p: &Pipeline) {
    if !p.secrets.is_empty() {
        let _ = writeln!(s, "secrets (refs only):");
        for (name, r) in &p.secrets {
            let users: Vec<&str> = p
                .steps
                .iter()
                .filter(|st| st.secrets.contains(name))
                .map(|st| st.name.as_str())
                .collect();
            let _ = writeln!(
                s,
                "  {name}: from {} key {} -> steps {}",
                r.from,
                r.key,
                if users.is_empty() {
                    "(none)".to_string()
                } else {
                    users.join(", ")
                }
            );
        }
    }
}

/// Step `i` (0-based): what it does, its sandbox, setup, limits, gate and routes.
fn write_step(s: &mut String, p: &Pipeline, i: usize, st: &Step) {
    let what = match &st.kind {
        StepKind::Agent { agent } => format!("agent {agent}"),
        StepKind::Command { command } => format!("command `{command}`"),
        StepKind::Action { action } if action == "commit" => {
            "action commit (host side, hooks off)".to_string()
        }
        StepKind::Action { action } => format!("action {action} (script in the sandbox)"),
    };
    let _ = writeln!(s, "  {}. {} [{what}]", i + 1, st.name);
    if !matches!(&st.kind, StepKind::Action { action } if action == "commit") {
        let _ = writeln!(
            s,
            "     sandbox: network {}, workspace {} at {WORKDIR}{}",
            if !st.network {
                "none"
            } else {
                st.egress.describe()
            },
            match st.workspace {
                Access::Rw => "rw",
                Access::Ro => "ro",
            },
            if st.secrets.is_empty() {
                String::new()
            } else {
                format!(", secrets {}", st.secrets.join(", "))
            },
        );
    }
    if let Some(setup) = &st.setup {
        let _ = writeln!(
            s,
            "     setup (network on, stamp-cached, {}): {setup}",
            if st.setup_secrets && !st.secrets.is_empty() {
                "with the step's secrets"
            } else {
                "no secrets"
            }
        );
    }
    let timeout = st
        .timeout_s
        .map(|t| format!("timeout {t}s"))
        .unwrap_or_else(|| "timeout none".into());
    match &st.kind {
        StepKind::Agent { .. } => {
            let _ = writeln!(
                s,
                "     limits: max_iterations {}, {timeout}, attempts {}{}",
                st.max_iterations
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "uncapped".into()),
                p.max_attempts,
                if st.max_iterations.is_none() && st.timeout_s.is_none() {
                    " (nothing bounds this agent but its own end: consider a timeout)"
                } else {
                    ""
                }
            );
        }
        StepKind::Action { action } if action == "commit" => {}
        _ => {
            let _ = writeln!(s, "     limits: {timeout}");
        }
    }
    if let (Some(a), Some(v)) = (&st.artifact, &st.verdicts) {
        let _ = writeln!(
            s,
            "     gate: VERDICT in {a}: pass {} / fail {}{}",
            v.pass,
            v.fail,
            v.unverifiable
                .as_ref()
                .map(|u| format!(" / unverifiable {u}"))
                .unwrap_or_default()
        );
    } else if matches!(st.kind, StepKind::Command { .. } | StepKind::Action { .. }) {
        let _ = writeln!(s, "     gate: exit code");
    }
    if !st.produces.is_empty() {
        let _ = writeln!(s, "     produces: {}", st.produces.join(", "));
    }
    let _ = writeln!(
        s,
        "     on pass -> {}; on fail -> {}; unverifiable -> {}",
        st.on_pass.describe(),
        st.on_fail.describe(),
        st.on_unverifiable.describe()
    );
}
