//! Control files: a config, a plan file, a prompt file, a stop file, a
//! verdict: a file that tells belay what to do, which an agent may have been
//! able to write.
//!
//! The rule every mode follows: belay keeps the trusted copy in its own state
//! (never in a tree an agent can write) from the moment a run starts. After an
//! agent had write access, the file on disk is only compared with that copy;
//! a file that changed is refused with a message that says what changed and
//! how to accept the change. Nothing is read from the changed file before
//! the user accepted it.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{atomic_write, Classify, ExitClass, RecordError};

/// The trusted copies of one run's (or one repository's) control files.
#[derive(Debug, Clone)]
pub struct ControlStore {
    dir: PathBuf,
}

/// A control file differs from the copy belay trusted.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{} changed since belay last trusted it, while an agent could write it; refused. \
     What changed: {what}. If you made this change, accept it: {accept}",
    path.display()
)]
pub struct ControlChanged {
    /// The file as the user knows it.
    pub path: PathBuf,
    /// The first differing lines, or "the file was removed".
    pub what: String,
    /// How to accept the change (a command or a flag).
    pub accept: String,
}

impl Classify for ControlChanged {
    fn exit_class(&self) -> ExitClass {
        ExitClass::Usage
    }
    fn error_code(&self) -> &'static str {
        "BELAY-E107"
    }
}

impl ControlStore {
    /// Trusted copies kept under `dir`: belay's own state, never a work tree.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ControlStore { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        let h = Sha256::digest(key.as_bytes());
        self.dir.join(format!("{}.trusted", hex::encode(&h[..16])))
    }

    /// Record `bytes` as the trusted content of the control file `key`.
    pub fn trust(&self, key: &str, bytes: &[u8]) -> Result<(), RecordError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| RecordError::io("create", &self.dir, e))?;
        atomic_write(&self.path(key), bytes)
    }

    /// The trusted copy, if one was recorded.
    pub fn trusted(&self, key: &str) -> Result<Option<Vec<u8>>, RecordError> {
        let p = self.path(key);
        match std::fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RecordError::io("read", p, e)),
        }
    }

    /// Forget the trusted copy (the user accepted the file as it is).
    pub fn forget(&self, key: &str) -> Result<(), RecordError> {
        let p = self.path(key);
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RecordError::io("remove", p, e)),
        }
    }

    /// `Ok` when `current` (`None`: the file is gone) equals the trusted copy,
    /// or when none was recorded; otherwise what changed.
    ///
    /// A trusted copy that cannot be read counts as a change: the check fails
    /// closed.
    pub fn verify(
        &self,
        key: &str,
        shown: &Path,
        current: Option<&[u8]>,
        accept: &str,
    ) -> Result<(), ControlChanged> {
        let changed = |what: String| ControlChanged {
            path: shown.to_path_buf(),
            what,
            accept: accept.to_string(),
        };
        let trusted = match self.trusted(key) {
            Ok(None) => return Ok(()),
            Ok(Some(t)) => t,
            Err(e) => return Err(changed(format!("the trusted copy cannot be read ({e})"))),
        };
        match current {
            Some(c) if c == trusted.as_slice() => Ok(()),
            Some(c) => Err(changed(describe_change(&trusted, c))),
            None => Err(changed("the file was removed".to_string())),
        }
    }
}

/// The first differing lines of two texts, as `line N: "new" (was "old")`.
pub fn describe_change(old: &[u8], new: &[u8]) -> String {
    let old = String::from_utf8_lossy(old);
    let new = String::from_utf8_lossy(new);
    let (o, n): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut out = Vec::new();
    for i in 0..o.len().max(n.len()) {
        let (a, b) = (o.get(i), n.get(i));
        if a == b {
            continue;
        }
        let line = match (a, b) {
            (Some(a), Some(b)) => format!("line {}: {} (was {})", i + 1, quote(b), quote(a)),
            (None, Some(b)) => format!("line {} added: {}", i + 1, quote(b)),
            (Some(a), None) => format!("line {} removed: {}", i + 1, quote(a)),
            (None, None) => continue,
        };
        out.push(line);
        if out.len() == 3 {
            out.push("…".to_string());
            break;
        }
    }
    if out.is_empty() {
        "line endings or invisible bytes".to_string()
    } else {
        out.join("; ")
    }
}

fn quote(s: &str) -> String {
    let cut: String = s.chars().take(100).collect();
    let more = if s.chars().count() > 100 { "…" } else { "" };
    format!("\"{}{more}\"", cut.escape_debug())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_changed_file_is_refused_with_what_changed_and_how_to_accept() {
        let d = tempfile::tempdir().unwrap();
        let s = ControlStore::new(d.path().join("control"));
        let shown = Path::new("/repo/agent-runner.toml");
        // Nothing trusted yet: anything passes.
        s.verify("cfg", shown, Some(b"x"), "--accept").unwrap();
        s.trust("cfg", b"[agent]\nplacement = \"container\"\n")
            .unwrap();
        s.verify(
            "cfg",
            shown,
            Some(b"[agent]\nplacement = \"container\"\n"),
            "--accept",
        )
        .unwrap();
        let e = s
            .verify(
                "cfg",
                shown,
                Some(b"[agent]\nplacement = \"host\"\ncommand = \"sh\"\n"),
                "belay rounds trust",
            )
            .unwrap_err();
        let m = e.to_string();
        assert!(m.contains("/repo/agent-runner.toml"), "{m}");
        assert!(m.contains(r#"line 2: "placement = \"host\"""#), "{m}");
        assert!(m.contains("line 3 added"), "{m}");
        assert!(m.contains("belay rounds trust"), "{m}");
        assert_eq!(e.exit_class().code(), 2);
        let gone = s.verify("cfg", shown, None, "x").unwrap_err();
        assert!(gone.to_string().contains("removed"));
        s.forget("cfg").unwrap();
        s.verify("cfg", shown, Some(b"anything"), "x").unwrap();
    }

    #[test]
    fn keys_do_not_collide_and_never_name_a_path() {
        let d = tempfile::tempdir().unwrap();
        let s = ControlStore::new(d.path());
        s.trust("../../etc/passwd", b"a").unwrap();
        s.trust("b", b"b").unwrap();
        assert_eq!(s.trusted("../../etc/passwd").unwrap().unwrap(), b"a");
        assert_eq!(s.trusted("b").unwrap().unwrap(), b"b");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }
}
