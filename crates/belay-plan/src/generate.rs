//! `belay plan init`'s agent call: the planning prompt, the answer judged by
//! [`crate::init::plan_from_answer`], one correction round. Nothing is
//! written here: the caller writes the plan only when this succeeds.

use std::time::Duration;

use belay_agent::{AgentSpec, Limits};
use serde_json::Value;

use crate::PlanError;
use belay_agent::runner::{Call, Runner};

pub struct Generate<'a> {
    pub runner: &'a Runner<'a>,
    pub spec: &'a AgentSpec,
    pub feature: &'a str,
    pub plan_file: &'a str,
    pub branch: &'a str,
    pub timeout: Duration,
    /// Where the calls' logs go.
    pub logs: std::path::PathBuf,
}

/// Why `init` failed, for its exit code.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The agent's answers were refused twice: bad input (exit 2).
    #[error("the agent's plan was refused twice: {0}. Nothing was written")]
    Refused(String),
    /// The agent itself failed or hit its limit (exit 1).
    #[error("the planning agent {0}. Nothing was written")]
    AgentFailed(String),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

impl belay_record::Classify for GenerateError {
    fn exit_class(&self) -> belay_record::ExitClass {
        match self {
            GenerateError::Refused(_) => belay_record::ExitClass::Usage,
            GenerateError::AgentFailed(_) => belay_record::ExitClass::Failed,
            GenerateError::Plan(e) => e.exit_class(),
        }
    }
}

/// Ask, judge, ask once more if refused.
pub async fn generate(g: Generate<'_>) -> Result<Value, GenerateError> {
    let mut prompt = crate::init::prompt(g.feature);
    let mut last = String::new();
    for round in 0..2 {
        let report = g
            .runner
            .run(Call {
                spec: g.spec,
                kind: "plan-init".into(),
                prompt: &prompt,
                limits: Limits {
                    wall_time: Some(g.timeout),
                    ..Limits::default()
                },
                events: None,
                logs: g.logs.join(format!("round-{round}")),
                pid_file: None,
                process: Default::default(),
                prepared: None,
            })
            .await
            .map_err(|e| GenerateError::Plan(e.into()))?
            .report;
        if !report.ok() {
            return Err(GenerateError::AgentFailed(format!(
                "{}{}",
                report.stop.describe(),
                report
                    .exit_code
                    .map(|c| format!(" (exit {c})"))
                    .unwrap_or_default()
            )));
        }
        match crate::init::plan_from_answer(&report.final_text, g.plan_file, g.branch) {
            Ok(plan) => return Ok(plan),
            Err(why) => {
                (g.runner.warn)(&format!("the plan was refused: {why}"));
                prompt = crate::init::correction(g.feature, &why);
                last = why;
            }
        }
    }
    Err(GenerateError::Refused(last))
}
