//! Which Debian suite a Python project's default base image is built from.
//!
//! bookworm ships Python 3.11 and trixie 3.13. `requires-python` (or Poetry's
//! `python` constraint) is a hard bound: a suite whose Python it excludes is
//! never chosen. `.python-version`, the classifiers and tox's envlist are
//! hints: when they leave 3.11 out, the suite whose Python they name (or the
//! nearest newer one) is chosen. The choice and its reason are recorded.

use std::str::FromStr;

use pep440_rs::{Version, VersionSpecifiers};
use serde::{Deserialize, Serialize};

use crate::analyze::PythonFacts;
use crate::EnvError;

/// A suite belay can build a base image of, and its Python.
#[derive(Debug, Clone, Copy)]
pub struct Suite {
    pub name: &'static str,
    pub python: &'static str,
}

/// In order of preference: the first that fits is chosen.
pub const SUITES: &[Suite] = &[
    Suite {
        name: "bookworm",
        python: "3.11.2",
    },
    Suite {
        name: "trixie",
        python: "3.13.5",
    },
];

/// The suite chosen, and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SuiteChoice {
    pub suite: String,
    pub python: String,
    pub reason: String,
}

impl SuiteChoice {
    pub fn image(&self) -> String {
        format!("belay-base:{}", self.suite)
    }
}

fn minor(v: &str) -> Option<(u64, u64)> {
    let mut it = v.trim().trim_start_matches('v').split('.');
    let a = it.next()?.parse().ok()?;
    let b = it
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()?;
    Some((a, b))
}

/// Poetry's `^3.12` / `~3.12` as a PEP 440 specifier.
fn poetry_to_pep440(c: &str) -> String {
    let c = c.trim();
    if let Some(v) = c.strip_prefix('^') {
        if let Some((a, _)) = minor(v) {
            return format!(">={v},<{}", a + 1);
        }
    }
    if let Some(v) = c.strip_prefix('~').filter(|v| !v.starts_with('=')) {
        if let Some((a, b)) = minor(v) {
            return format!(">={v},<{a}.{}", b + 1);
        }
    }
    c.to_string()
}

/// The hard bound: requires-python, else Poetry's python constraint.
fn bound(py: &PythonFacts) -> Option<(String, String)> {
    if let Some(r) = &py.requires_python {
        return Some(("requires-python".into(), r.clone()));
    }
    py.version_hints.iter().find_map(|h| {
        h.strip_prefix("poetry python ")
            .map(|v| ("Poetry's python".to_string(), poetry_to_pep440(v)))
    })
}

/// The minor versions the hints name (`.python-version 3.12`, `tox envlist =
/// py311, py312`, `classifier 3.12`, `Pipfile python_version 3.12`).
fn hinted(py: &PythonFacts) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for h in &py.version_hints {
        if h.starts_with("poetry python ") {
            continue;
        }
        if let Some(list) = h.strip_prefix("tox ") {
            for tok in list.split(|c: char| !c.is_ascii_alphanumeric() && c != '.') {
                if let Some(d) = tok.strip_prefix("py3") {
                    if let Ok(m) = d.parse::<u64>() {
                        out.push((3, m));
                    }
                }
            }
            continue;
        }
        if let Some(v) = h.rsplit(' ').next().and_then(minor) {
            out.push(v);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The suite for `py` (bookworm when nothing says otherwise).
pub fn choose(py: Option<&PythonFacts>) -> Result<SuiteChoice, EnvError> {
    let pick = |s: &Suite, reason: String| SuiteChoice {
        suite: s.name.to_string(),
        python: s.python.to_string(),
        reason,
    };
    let Some(py) = py else {
        return Ok(pick(&SUITES[0], "the default suite".into()));
    };
    let bound = bound(py);
    let spec = match &bound {
        Some((what, s)) => Some(VersionSpecifiers::from_str(s).map_err(|e| {
            EnvError::Plan(format!(
                "{what} `{s}` is not a valid version specifier ({e}); fix it, or pass --base-image"
            ))
        })?),
        None => None,
    };
    let allowed = |s: &Suite| {
        spec.as_ref()
            .is_none_or(|sp| Version::from_str(s.python).is_ok_and(|v| sp.contains(&v)))
    };
    let fitting: Vec<&Suite> = SUITES.iter().filter(|s| allowed(s)).collect();
    let Some(first) = fitting.first() else {
        let (what, s) = bound.unwrap_or_default();
        let have: Vec<String> = SUITES
            .iter()
            .map(|s| format!("{} (Python {})", s.name, s.python))
            .collect();
        return Err(EnvError::Plan(format!(
            "{what} `{s}` excludes the Python of every suite belay builds base images of: {}. \
             Pass --base-image with an image whose python3 satisfies it",
            have.join(", ")
        )));
    };
    let hints = hinted(py);
    let bound_text = bound
        .as_ref()
        .map(|(w, s)| format!("{w} `{s}`"))
        .unwrap_or_default();
    let py_minor = |s: &Suite| minor(s.python).unwrap_or((3, 0));
    if !hints.is_empty() && !hints.iter().any(|h| *h == py_minor(first)) {
        // The hints leave the first fitting suite's Python out: the suite whose
        // Python they name, else the nearest one newer than their lowest.
        let lowest = hints[0];
        let by_name = fitting.iter().find(|s| hints.contains(&py_minor(s)));
        let newer = fitting.iter().find(|s| py_minor(s) >= lowest);
        if let Some(s) = by_name.or(newer) {
            let named: Vec<String> = hints.iter().map(|(a, b)| format!("{a}.{b}")).collect();
            let mut reason = format!(
                "the project names Python {} ({}), not {}.{}",
                named.join(", "),
                py.version_hints.join("; "),
                py_minor(first).0,
                py_minor(first).1
            );
            if !bound_text.is_empty() {
                reason.push_str(&format!("; {bound_text} allows {}", s.python));
            }
            return Ok(pick(s, reason));
        }
    }
    let reason = if std::ptr::eq(*first, &SUITES[0]) {
        if bound_text.is_empty() {
            "the default suite".to_string()
        } else {
            format!("the default suite; {bound_text} allows {}", first.python)
        }
    } else {
        format!(
            "{bound_text} excludes {} (Python {}); {} has {}",
            SUITES[0].name, SUITES[0].python, first.name, first.python
        )
    };
    Ok(pick(first, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(requires: Option<&str>, hints: &[&str]) -> PythonFacts {
        PythonFacts {
            requires_python: requires.map(String::from),
            version_hints: hints.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn requires_python_above_3_11_chooses_trixie() {
        let c = choose(Some(&facts(Some(">=3.12"), &[]))).unwrap();
        assert_eq!(c.suite, "trixie");
        assert_eq!(c.image(), "belay-base:trixie");
        assert_eq!(
            c.reason,
            "requires-python `>=3.12` excludes bookworm (Python 3.11.2); trixie has 3.13.5"
        );
    }

    #[test]
    fn the_default_stays_when_3_11_is_allowed() {
        for r in [None, Some(">=3.8"), Some(">=3.9,<4"), Some("~=3.10")] {
            assert_eq!(
                choose(Some(&facts(r, &[]))).unwrap().suite,
                "bookworm",
                "{r:?}"
            );
        }
        assert_eq!(choose(None).unwrap().suite, "bookworm");
    }

    #[test]
    fn hints_that_leave_3_11_out_choose_the_newer_suite() {
        let c = choose(Some(&facts(None, &[".python-version 3.13"]))).unwrap();
        assert_eq!(c.suite, "trixie");
        assert!(c.reason.contains("names Python 3.13"), "{}", c.reason);
        let c = choose(Some(&facts(
            Some(">=3.10"),
            &["tox envlist = py312, py313"],
        )))
        .unwrap();
        assert_eq!(c.suite, "trixie");
        // 3.12 is on no suite: the nearest newer one.
        let c = choose(Some(&facts(None, &["classifier 3.12"]))).unwrap();
        assert_eq!(c.suite, "trixie");
        // Hints that include 3.11 keep bookworm.
        let c = choose(Some(&facts(None, &["tox envlist = py310, py311, py312"]))).unwrap();
        assert_eq!(c.suite, "bookworm");
    }

    #[test]
    fn poetry_constraints_are_bounds() {
        let c = choose(Some(&facts(None, &["poetry python ^3.12"]))).unwrap();
        assert_eq!(c.suite, "trixie");
        let c = choose(Some(&facts(None, &["poetry python ^3.9"]))).unwrap();
        assert_eq!(c.suite, "bookworm");
    }

    #[test]
    fn a_bound_no_suite_satisfies_fails_at_planning_with_the_reason() {
        let e = choose(Some(&facts(Some("<3.10"), &[])))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("requires-python `<3.10` excludes the Python of every suite"),
            "{e}"
        );
        assert!(
            e.contains("bookworm (Python 3.11.2), trixie (Python 3.13.5)"),
            "{e}"
        );
        let e = choose(Some(&facts(Some(">=3.11 and banana"), &[])))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a valid version specifier"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn choosing_never_panics(r in ".{0,30}", h in ".{0,30}") {
            let _ = choose(Some(&facts(Some(&r), &[&h])));
        }
    }
}
