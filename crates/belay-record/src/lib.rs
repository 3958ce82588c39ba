//! Records: the one module that writes run state.
//!
//! Everything belay persists about a run goes through here, so that resume, audit
//! and the progress display all read one truth:
//!
//! * [`atomic_write`] / [`write_json_atomic`]: write-to-temp, fsync, rename, fsync dir.
//!   A crash leaves either the old file or the new one, never a torn one.
//! * [`JsonlAppender`]: append-only event and execution logs, one whole line per write.
//! * [`RunLock`]: an advisory lock that refuses a second concurrent run.
//! * [`Redactor`]: scrubs secret values from everything written.
//! * [`ProcessIdentity`]: pid + start time + boot id, the only evidence the reaper
//!   trusts when it decides that an owner process is gone.
//! * [`run_id`]: run id generation and validation.
//! * [`ids`]: the one validator of ids that come from outside (chat, HTTP, files, CLI).
//! * [`control`]: the trusted copies of control files an agent could write.
//! * [`printable`]: untrusted text made safe to print on a terminal.
//! * [`is_loopback_host`]: the `Host` check of a local web server (DNS rebinding).
//! * [`Stop`]: the one cancellation token (SIGINT/SIGTERM for every command).

mod atomic;
pub mod control;
mod error;
pub mod events;
mod exit;
mod identity;
pub mod ids;
mod jsonl;
mod line;
mod lock;
mod loopback;
mod redact;
pub mod registry;
mod run;
pub mod run_id;
pub mod stop;
mod time;

pub use atomic::{atomic_write, read_regular, write_json_atomic};
pub use control::{ControlChanged, ControlStore};
pub use error::RecordError;
pub use events::{Envelope, EventSink, Mode, NoObserver, Observer};
pub use exit::{io_class, io_code, Classify, ErrorCode, ExitClass, ERROR_CODES};
pub use identity::ProcessIdentity;
pub use ids::{Id, IdError};
pub use jsonl::JsonlAppender;
pub use line::{line_col, printable, printable_line};
pub use lock::RunLock;
pub use loopback::{is_loopback_host, loopback_hosts};
pub use redact::{
    looks_secret, same_secret, secret_looking_env, without_userinfo, Redactor, SecretScanner,
    StreamRedactor,
};
pub use registry::{Registry, RunEnd, RunEntry, RunStatus};
pub use run::{
    end_open_runs_interrupted, no_hooks_dir, state_home, OpenRun, RunHandle, EVENTS_FILE,
    LOCK_FILE, STATE_FILE,
};
pub use stop::{SignalError, Stop, Stopped};
pub use time::{now_rfc3339, unix_millis};
