//! The pipeline's console: one line per step start, verdict, route and
//! retry (with the first line of the feedback), and each step's duration and
//! cost, made from the run's events as they are written.

use std::collections::HashMap;

use belay_pipeline::events::Kind;
use serde_json::Value;

/// Turns events into console lines; keeps what a later line needs (an agent
/// step's cost, told before its end).
#[derive(Default)]
pub struct Console {
    cost: HashMap<String, f64>,
}

fn first_line(s: &str, max: usize) -> String {
    // The feedback starts with belay's own "Step `x` did not pass" line;
    // the gate's first words are more telling.
    let line = s
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("Step `"))
        .unwrap_or("");
    if line.chars().count() > max {
        let cut: String = line.chars().take(max).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    }
}

impl Console {
    /// The line for an event, if it gets one: one line, printable (a gate's
    /// feedback, a step's name and a reason are the pipeline's or its
    /// steps' text, shown with their control characters escaped).
    pub fn line(&mut self, kind: Kind, step: Option<&str>, d: &Value) -> Option<String> {
        self.text(kind, step, d)
            .map(|l| belay_record::printable_line(&l).into_owned())
    }

    fn text(&mut self, kind: Kind, step: Option<&str>, d: &Value) -> Option<String> {
        let step = step.unwrap_or("-");
        let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let n = |k: &str| d.get(k).and_then(Value::as_u64).unwrap_or(0);
        match kind {
            Kind::StepStart => {
                let what = d
                    .get("step_kind")
                    .and_then(|k| k.get("kind"))
                    .and_then(Value::as_str)
                    .unwrap_or("step");
                Some(format!("{step}: start ({what}, attempt {})", n("attempt")))
            }
            Kind::AgentReport => {
                let c = d.get("cost_usd").and_then(Value::as_f64).unwrap_or(0.0);
                *self.cost.entry(step.to_string()).or_default() += c;
                None
            }
            Kind::StepEnd => {
                let secs = d.get("duration_s").and_then(Value::as_f64).unwrap_or(0.0);
                let cost = self
                    .cost
                    .remove(step)
                    .filter(|c| *c > 0.0)
                    .map(|c| format!(", ${c:.4}"))
                    .unwrap_or_default();
                let exit = d
                    .get("exit_code")
                    .and_then(Value::as_i64)
                    .map(|c| format!(", exit {c}"))
                    .unwrap_or_default();
                Some(format!(
                    "{step}: {} in {secs:.1} s{exit}{cost}",
                    s("verdict")
                ))
            }
            Kind::Route => {
                let fb = d
                    .get("feedback")
                    .and_then(Value::as_str)
                    .map(|f| first_line(f, 160))
                    .filter(|f| !f.is_empty())
                    .map(|f| format!(": {f}"))
                    .unwrap_or_default();
                Some(format!("{step}: {} -> {}{fb}", s("verdict"), s("to")))
            }
            Kind::Attempt => Some(format!(
                "retry: attempt {} of {}",
                n("attempt"),
                n("max_attempts")
            )),
            Kind::Commit => match d.get("sha").and_then(Value::as_str) {
                Some(sha) => Some(format!(
                    "{step}: committed {} ({} file(s))",
                    &sha[..sha.len().min(12)],
                    n("files_total")
                )),
                None => Some(format!("{step}: {}", s("skipped"))),
            },
            Kind::CommitRefused => Some(format!("{step}: commit refused: {}", s("reason"))),
            Kind::StepInterrupted => Some(format!("{step}: interrupted ({})", s("reason"))),
            Kind::RunResumed => Some(format!(
                "resumed at {} (attempt {} of {})",
                s("current"),
                n("attempt"),
                n("max_attempts")
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_retry_route_names_the_target_and_the_feedback() {
        let mut c = Console::default();
        let fb = "Step `test` did not pass (verdict: Fail, exit code 1).\nFAILED tests/test_x.py::test_y - assert 1 == 2\n...";
        let l = c.line(
            Kind::Route,
            Some("test"),
            &json!({"verdict": "fail", "to": "dev (retry)", "feedback": fb}),
        );
        assert_eq!(
            l.as_deref(),
            Some("test: fail -> dev (retry): FAILED tests/test_x.py::test_y - assert 1 == 2")
        );
    }

    #[test]
    fn feedback_cannot_drive_the_terminal() {
        let mut c = Console::default();
        let fb = "Step `test` did not pass.\nok\r\x1b[2K\x1b]52;c;cHduZWQ=\x07all good";
        let l = c.line(
            Kind::Route,
            Some("te\x1b[1Ast"),
            &json!({"verdict": "fail", "to": "dev", "feedback": fb}),
        );
        assert_eq!(
            l.as_deref(),
            Some("te\\x1b[1Ast: fail -> dev: ok\\r\\x1b[2K\\x1b]52;c;cHduZWQ=\\x07all good")
        );
        let l = c.line(
            Kind::CommitRefused,
            Some("dev"),
            &json!({"reason": "two\nlines"}),
        );
        assert_eq!(l.as_deref(), Some("dev: commit refused: two\\nlines"));
    }

    #[test]
    fn a_step_end_has_its_duration_and_its_agent_cost() {
        let mut c = Console::default();
        assert_eq!(
            c.line(Kind::AgentReport, Some("dev"), &json!({"cost_usd": 0.0123})),
            None
        );
        let l = c.line(
            Kind::StepEnd,
            Some("dev"),
            &json!({"verdict": "pass", "duration_s": 12.34}),
        );
        assert_eq!(l.as_deref(), Some("dev: pass in 12.3 s, $0.0123"));
        let l = c.line(
            Kind::StepEnd,
            Some("test"),
            &json!({"verdict": "fail", "duration_s": 1.0, "exit_code": 1}),
        );
        assert_eq!(l.as_deref(), Some("test: fail in 1.0 s, exit 1"));
    }
}
