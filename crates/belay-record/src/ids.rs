//! Ids that come from outside belay: a chat command, an HTTP route, a job
//! file, a URL, a command-line argument. They are parsed here, by the one
//! validator, before anything uses them; a path is only ever joined onto an
//! [`Id`], never onto the raw text.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::{Classify, ExitClass};

/// The longest id belay takes.
pub const MAX_ID_LEN: usize = 128;

/// An id from outside belay: 1–128 characters of `[A-Za-z0-9._-]`, starting
/// with a letter or digit, without `..`. It is a single path component that
/// names nothing but itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Id(String);

/// Text that is not an id. `shown` is the input escaped and cut, so a reply
/// that quotes it carries no control characters and no long payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{kind} {shown} is not a valid id: use 1-128 letters, digits, '.', '_' or '-', \
     starting with a letter or digit"
)]
pub struct IdError {
    pub kind: &'static str,
    pub shown: String,
}

impl Classify for IdError {
    fn exit_class(&self) -> ExitClass {
        ExitClass::Usage
    }
}

impl Id {
    /// Parse `s` as an id of the given kind ("job", "run", …).
    pub fn parse(kind: &'static str, s: &str) -> Result<Id, IdError> {
        if is_valid(s) {
            Ok(Id(s.to_string()))
        } else {
            Err(IdError {
                kind,
                shown: shown(s),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// Whether `s` is an id (see [`Id`]).
pub fn is_valid(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        && !s.contains("..")
}

/// The input as a reply may quote it: escaped, at most 40 characters.
fn shown(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(40)
        .collect::<String>()
        .escape_debug()
        .collect();
    if s.chars().count() > 40 {
        out.push('…');
    }
    format!("\"{out}\"")
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Id {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<Path> for Id {
    fn as_ref(&self) -> &Path {
        Path::new(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Id {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Id::parse("id", &s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_and_not_ids() {
        for ok in ["a", "job-1", "20261204T032905-ab12", "x.y_z", "A9"] {
            assert!(Id::parse("job", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "..",
            "../x",
            "a/b",
            "/etc",
            ".hidden",
            "-flag",
            "a..b",
            "a b",
            "é",
            "a\0b",
            "a\\b",
            &"x".repeat(129),
        ] {
            assert!(Id::parse("job", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_error_quotes_the_input_escaped_and_short() {
        let e = Id::parse("job", &format!("../../{}\n", "y".repeat(80))).unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("job \"../../yyy"), "{m}");
        assert!(!m.contains('\n') && m.contains('…'), "{m}");
        assert_eq!(e.exit_class(), ExitClass::Usage);
    }

    proptest! {
        #[test]
        fn an_id_is_one_plain_path_component(s in "\\PC{0,140}") {
            if let Ok(id) = Id::parse("x", &s) {
                let p: &Path = id.as_ref();
                let comps: Vec<_> = p.components().collect();
                prop_assert_eq!(comps.len(), 1);
                prop_assert!(matches!(comps[0], std::path::Component::Normal(_)));
                prop_assert!(!s.starts_with('.'));
            }
        }
    }
}
