//! Exit codes. Every library error says its class ([`belay_record::Classify`]),
//! and a [`Failure`] takes it when the error is converted: there is no list of
//! error types here. The binary's own messages say their class by the
//! constructor they use ([`usage`], [`infra`]).

use belay_record::{Classify, ExitClass};

/// The work failed (documented in `belay --help`); the other codes come
/// from [`ExitClass::code`].
pub const EXIT_FAILED: u8 = 1;

/// An error with the exit code and the stable error code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    error_code: &'static str,
    pub error: anyhow::Error,
}

impl<E: Classify + std::error::Error + Send + Sync + 'static> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            code: e.exit_class().code(),
            error_code: e.error_code(),
            error: anyhow::Error::new(e),
        }
    }
}

impl Failure {
    /// A failure of `class` with the class's general code.
    pub fn new(class: ExitClass, error: impl Into<anyhow::Error>) -> Self {
        Failure {
            code: class.code(),
            error_code: class.error_code(),
            error: error.into(),
        }
    }

    /// A failure with an exit code of its own (the round supervisor's peer
    /// codes), classified by `e`.
    pub fn with_code<E: Classify + std::error::Error + Send + Sync + 'static>(
        code: u8,
        e: E,
    ) -> Self {
        Failure {
            code,
            error_code: e.error_code(),
            error: anyhow::Error::new(e),
        }
    }

    /// The stable code (`BELAY-E…`, `docs/troubleshooting.md`).
    pub fn error_code(&self) -> &'static str {
        self.error_code
    }
}

/// A failure of what the user gave belay (exit 2), with the message that says
/// how to fix it.
pub fn usage(msg: impl Into<String>) -> Failure {
    Failure::new(ExitClass::Usage, anyhow::anyhow!(msg.into()))
}

/// A failure of the machine (exit 3): the message says what failed.
pub fn infra(msg: impl Into<String>) -> Failure {
    Failure::new(ExitClass::Infra, anyhow::anyhow!(msg.into()))
}

/// An IO failure of the binary's own: `cannot {what}: {e}`, classed by the
/// error's kind (a missing path is the user's, a full disk the machine's).
pub fn io(what: impl std::fmt::Display, e: std::io::Error) -> Failure {
    Failure {
        code: belay_record::io_class(&e).code(),
        error_code: belay_record::io_code(&e),
        error: anyhow::Error::new(e).context(format!("cannot {what}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::PathBuf;

    use crate::lint_tests::sources;

    /// The names of the public error types (`thiserror` derives), and of the
    /// types with an `impl Classify`.
    fn error_types(srcs: &[(PathBuf, String)]) -> (Vec<(String, PathBuf)>, Vec<String>) {
        let derive = regex::Regex::new(
            r"#\[derive\(([^)]*)\)\]\s*(?:#\[[^\]]*\]\s*)*pub\s+(?:enum|struct)\s+(\w+)",
        )
        .unwrap();
        let imp =
            regex::Regex::new(r"impl\s+(?:[\w:]*::)?Classify\s+for\s+(?:[\w:]*::)?(\w+)").unwrap();
        let mut types = Vec::new();
        let mut classified = Vec::new();
        for (p, s) in srcs {
            for c in derive.captures_iter(s) {
                if c[1].split(',').any(|d| d.trim().ends_with("Error")) {
                    types.push((c[2].to_string(), p.clone()));
                }
            }
            for c in imp.captures_iter(s) {
                classified.push(c[1].to_string());
            }
        }
        (types, classified)
    }

    /// Every public error type of every crate says its class (so that a
    /// [`super::Failure`] takes it on conversion, with no list here), and no
    /// `exit_class` hides a variant behind a wildcard arm.
    #[test]
    fn every_error_type_is_classified_variant_by_variant() {
        let srcs = sources();
        let (types, classified) = error_types(&srcs);
        assert!(types.len() > 20, "{types:?}");
        let missing: Vec<_> = types
            .iter()
            .filter(|(t, _)| !classified.contains(t))
            .collect();
        assert!(
            missing.is_empty(),
            "error types without `impl Classify`: {missing:?}"
        );
        let wildcard = regex::Regex::new(r"(?m)^\s*(_|other)\s*=>").unwrap();
        for (p, s) in &srcs {
            for (i, _) in s.match_indices("fn exit_class(") {
                let body = &s[i..];
                let end = body.find("\n    }\n").unwrap_or(body.len());
                assert!(
                    !wildcard.is_match(&body[..end]),
                    "{}: an exit_class with a wildcard arm: name every variant",
                    p.display()
                );
            }
        }
    }

    /// Every code the sources can print is in `ERROR_CODES` (so in
    /// `docs/troubleshooting.md`, which a belay-record test checks).
    #[test]
    fn every_code_in_the_sources_is_listed() {
        let code = regex::Regex::new(r"BELAY-E\d{3}").unwrap();
        let doc = include_str!("../../../docs/troubleshooting.md");
        for (p, s) in sources() {
            for m in code.find_iter(&s) {
                assert!(
                    belay_record::ERROR_CODES
                        .iter()
                        .any(|c| c.code == m.as_str()),
                    "{}: {} is not in ERROR_CODES",
                    p.display(),
                    m.as_str()
                );
                assert!(
                    doc.contains(m.as_str()),
                    "{} is not in docs/troubleshooting.md",
                    m.as_str()
                );
            }
        }
    }

    /// What the user sees: a library error keeps its own class and code
    /// through `?`, and an IO failure of the binary is classed by its kind.
    #[test]
    fn a_failure_takes_the_class_and_code_of_its_error() {
        let f: super::Failure = belay_record::ControlChanged {
            path: "a.toml".into(),
            what: String::new(),
            accept: "belay rounds trust".into(),
        }
        .into();
        assert_eq!((f.code, f.error_code()), (2, "BELAY-E107"));
        let full = super::io("write x", std::io::Error::from_raw_os_error(28));
        assert_eq!((full.code, full.error_code()), (3, "BELAY-E304"));
        let stopped: super::Failure = belay_record::Stopped("SIGINT".into()).into();
        assert_eq!((stopped.code, stopped.error_code()), (130, "BELAY-E130"));
    }
}
