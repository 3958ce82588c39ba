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
}

impl ExitClass {
    pub fn code(self) -> u8 {
        match self {
            ExitClass::Failed => 1,
            ExitClass::Usage => 2,
            ExitClass::Infra => 3,
        }
    }
}

/// Implemented by every library error.
pub trait Classify {
    fn exit_class(&self) -> ExitClass;
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
            E::Locked { .. } | E::InvalidRunId { .. } | E::BadState { .. } => ExitClass::Usage,
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
    }
}
