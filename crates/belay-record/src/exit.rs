//! What kind of failure an error is, for the process exit code. Every
//! library error implements [`Classify`]; the binary maps the class to 1, 2
//! or 3 and never guesses from a message.

/// The class of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitClass {
    /// The work itself failed (a gate, an agent, a build): exit 1.
    Failed,
    /// What the user gave belay is wrong (flags, paths, files): exit 2.
    Usage,
    /// The machine failed: the container engine, the disk, a service belay
    /// starts (the egress proxy, the model route): exit 3.
    Infra,
    /// Stopped by SIGINT or SIGTERM; the run can be resumed: exit 130.
    Interrupted,
}

impl ExitClass {
    pub fn code(self) -> u8 {
        match self {
            ExitClass::Failed => 1,
            ExitClass::Usage => 2,
            ExitClass::Infra => 3,
            ExitClass::Interrupted => 130,
        }
    }

    /// The class's general error code (each error may name a narrower one).
    pub fn error_code(self) -> &'static str {
        match self {
            ExitClass::Failed => "BELAY-E200",
            ExitClass::Usage => "BELAY-E100",
            ExitClass::Infra => "BELAY-E300",
            ExitClass::Interrupted => "BELAY-E130",
        }
    }
}

/// A stable error code: what `belay` prints as `error[BELAY-E…]`, and what
/// `docs/troubleshooting.md` explains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode {
    pub code: &'static str,
    pub class: ExitClass,
    pub title: &'static str,
}

/// Every code belay prints. A code is never reused for another meaning.
pub const ERROR_CODES: &[ErrorCode] = &[
    ErrorCode { code: "BELAY-E100", class: ExitClass::Usage, title: "bad input or configuration" },
    ErrorCode { code: "BELAY-E101", class: ExitClass::Usage, title: "a file belay reads is malformed (it names the file, line and column)" },
    ErrorCode { code: "BELAY-E102", class: ExitClass::Usage, title: "a secret or the model key is not in the environment" },
    ErrorCode { code: "BELAY-E103", class: ExitClass::Usage, title: "the workspace is not ready (tooling not committed, .env files, state inside the workspace, belay or an agent CLI inside the workspace)" },
    ErrorCode { code: "BELAY-E104", class: ExitClass::Usage, title: "the run cannot be resumed as asked" },
    ErrorCode { code: "BELAY-E105", class: ExitClass::Usage, title: "another belay run holds the lock" },
    ErrorCode { code: "BELAY-E106", class: ExitClass::Usage, title: "an image is not on the container engine" },
    ErrorCode { code: "BELAY-E107", class: ExitClass::Usage, title: "a control file (config, plan, prompt, stop file) changed while an agent could write it" },
    ErrorCode { code: "BELAY-E200", class: ExitClass::Failed, title: "the work failed (a gate, the attempts, a build)" },
    ErrorCode { code: "BELAY-E201", class: ExitClass::Failed, title: "an agent failed" },
    ErrorCode { code: "BELAY-E202", class: ExitClass::Failed, title: "a round supervisor's breaker tripped (a crash loop, rounds without progress): exit 75, systemd does not restart" },
    ErrorCode { code: "BELAY-E300", class: ExitClass::Infra, title: "the machine failed" },
    ErrorCode { code: "BELAY-E301", class: ExitClass::Infra, title: "the container engine is unreachable or refused a request" },
    ErrorCode { code: "BELAY-E302", class: ExitClass::Infra, title: "the sandbox failed under a running step (its container is gone, the engine failed an exec)" },
    ErrorCode { code: "BELAY-E303", class: ExitClass::Infra, title: "a service belay runs for the sandbox failed (egress proxy, model route, firewall)" },
    ErrorCode { code: "BELAY-E304", class: ExitClass::Infra, title: "the disk is full or the file system failed" },
    ErrorCode { code: "BELAY-E305", class: ExitClass::Infra, title: "the image registry failed a push, pull or lookup" },
    ErrorCode { code: "BELAY-E306", class: ExitClass::Infra, title: "the Kubernetes API server of `--executor kubernetes` failed or refused a request" },
    ErrorCode { code: "BELAY-E130", class: ExitClass::Interrupted, title: "interrupted by Ctrl-C or SIGTERM; the run can be resumed" },
];

/// Implemented by every library error.
pub trait Classify {
    fn exit_class(&self) -> ExitClass;
    /// The stable code (one of [`ERROR_CODES`]); the class's general one
    /// unless the error knows better.
    fn error_code(&self) -> &'static str {
        self.exit_class().error_code()
    }
}

/// An IO error's code: a full disk or failing file system is E304.
pub fn io_code(e: &std::io::Error) -> &'static str {
    match io_class(e) {
        ExitClass::Infra => "BELAY-E304",
        c => c.error_code(),
    }
}

/// An IO error that reached the binary bare (the error types of the
/// libraries name the path; this is the fallback).
impl Classify for std::io::Error {
    fn exit_class(&self) -> ExitClass {
        io_class(self)
    }

    fn error_code(&self) -> &'static str {
        io_code(self)
    }
}

/// An IO error's class: a full disk, a read-only or failing file system is
/// the machine's; a missing path or a permission is what the user gave.
pub fn io_class(e: &std::io::Error) -> ExitClass {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound
        | K::PermissionDenied
        | K::AlreadyExists
        | K::InvalidInput
        | K::NotADirectory
        | K::IsADirectory
        | K::InvalidData => ExitClass::Usage,
        _ => ExitClass::Infra,
    }
}

impl Classify for crate::RecordError {
    fn exit_class(&self) -> ExitClass {
        use crate::RecordError as E;
        match self {
            E::Io { source, .. } => io_class(source),
            E::Json { .. } => ExitClass::Failed,
            E::Locked { .. }
            | E::InvalidRunId { .. }
            | E::BadState { .. }
            | E::UnknownStatus { .. }
            | E::UnknownMode { .. } => ExitClass::Usage,
        }
    }

    fn error_code(&self) -> &'static str {
        use crate::RecordError as E;
        match self {
            E::Io { source, .. } => io_code(source),
            E::Locked { .. } => "BELAY-E105",
            E::BadState { .. } => "BELAY-E101",
            e => e.exit_class().error_code(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_the_machines_and_a_missing_file_the_users() {
        let full = std::io::Error::from_raw_os_error(28); // ENOSPC
        assert_eq!(io_class(&full), ExitClass::Infra);
        let eio = std::io::Error::from_raw_os_error(5);
        assert_eq!(io_class(&eio), ExitClass::Infra);
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(io_class(&missing), ExitClass::Usage);
        let locked = crate::RecordError::Locked { path: "/x".into() };
        assert_eq!(locked.exit_class().code(), 2);
        assert_eq!(locked.error_code(), "BELAY-E105");
        assert_eq!(io_code(&full), "BELAY-E304");
    }

    #[test]
    fn the_troubleshooting_page_lists_every_code() {
        let doc = include_str!("../../../docs/troubleshooting.md");
        for c in ERROR_CODES {
            let row = format!("| {} | {} |", c.code, c.class.code());
            assert!(
                doc.contains(&row),
                "docs/troubleshooting.md has no row `{row}`"
            );
        }
    }

    #[test]
    fn codes_are_unique_and_match_their_class() {
        let mut seen = std::collections::BTreeSet::new();
        for c in ERROR_CODES {
            assert!(seen.insert(c.code), "{} twice", c.code);
            assert!(c.code.starts_with("BELAY-E"), "{}", c.code);
        }
        for class in [
            ExitClass::Failed,
            ExitClass::Usage,
            ExitClass::Infra,
            ExitClass::Interrupted,
        ] {
            let c = ERROR_CODES
                .iter()
                .find(|c| c.code == class.error_code())
                .expect("listed");
            assert_eq!(c.class, class);
        }
    }
}
