//! What can go wrong, by class: the class gives the exit code.

use std::path::{Path, PathBuf};

use belay_record::{Id, IdError};

#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    /// The config or a flag is wrong: fix it (exit 2).
    #[error("{0}")]
    Config(String),
    /// A job, a gate or a command names something that is not there, or
    /// asks for what its state does not allow (exit 2).
    #[error("{0}")]
    Refused(String),
    /// The machine is not ready: the engine, the disk, the chat server
    /// (exit 3).
    #[error("{0}")]
    Environment(String),
    /// An id from outside (a chat command, an HTTP route, a drop file's
    /// name, a job file, the command line) that is no id (exit 2).
    #[error(transparent)]
    Id(#[from] IdError),
    /// A gate or a command names a job the queue does not hold (exit 2).
    #[error("no job {id} in the queue")]
    UnknownJob { id: Id },
    /// A gate names a job that is not where the gate acts (exit 2).
    #[error("job {id} is in {at}/, not waiting in {want}/")]
    NotWaiting {
        id: Id,
        at: &'static str,
        want: &'static str,
    },
    /// A worker or another gate holds the job's lock (exit 2).
    #[error(
        "job {id} is being handled right now (a worker or another gate has it): try again in a moment"
    )]
    Busy { id: Id },
    /// A gate from someone who is not an owner (exit 2).
    #[error("only the owner may do that ({by} is not an owner)")]
    NotOwner { by: String },
    /// A new job whose id is in the queue already (exit 2).
    #[error("a job {id} is already in {at}/")]
    Queued { id: Id, at: &'static str },
    /// A new job whose id a finished job had (exit 2).
    #[error("the id {id} belongs to a job that ran already: give another (or none)")]
    Spent { id: Id },
    /// A file belay writes only when nothing is there (exit 2).
    #[error("{} exists already", path.display())]
    Exists { path: PathBuf },
    /// A held change whose file cannot be read (exit 2).
    #[error("the held change of job {id} cannot be read: {why}")]
    BadHeld { id: Id, why: String },
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Record(#[from] belay_record::RecordError),
    #[error(transparent)]
    Agent(#[from] belay_agent::AgentError),
    #[error(transparent)]
    Vcs(#[from] belay_vcs::VcsError),
    #[error(transparent)]
    Sandbox(#[from] belay_sandbox::SandboxError),
}

impl JobsError {
    pub fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        JobsError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The error as a reply to chat or HTTP shows it: ids and a short
    /// reason, never a host path (the queue, the state directory, a
    /// repository's checkout). The command line, the owner's own, prints
    /// the whole error.
    pub fn reply(&self) -> String {
        match self {
            JobsError::Io { action, source, .. } => {
                format!("cannot {action} a file of belay's ({})", source.kind())
            }
            JobsError::Record(belay_record::RecordError::Io { action, source, .. }) => {
                format!("{action} a file of belay's ({})", source.kind())
            }
            e => crate::public::without_paths(&e.to_string()).into_owned(),
        }
    }
}

impl belay_record::Classify for JobsError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            JobsError::Config(_)
            | JobsError::Refused(_)
            | JobsError::UnknownJob { .. }
            | JobsError::NotWaiting { .. }
            | JobsError::Busy { .. }
            | JobsError::NotOwner { .. }
            | JobsError::Queued { .. }
            | JobsError::Spent { .. }
            | JobsError::Exists { .. }
            | JobsError::BadHeld { .. } => ExitClass::Usage,
            JobsError::Id(e) => e.exit_class(),
            JobsError::Environment(_) => ExitClass::Infra,
            JobsError::Io { source, .. } => belay_record::io_class(source),
            JobsError::Record(e) => e.exit_class(),
            JobsError::Agent(e) => e.exit_class(),
            JobsError::Vcs(e) => e.exit_class(),
            JobsError::Sandbox(e) => e.exit_class(),
        }
    }
}
