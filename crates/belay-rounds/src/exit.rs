//! The peer's exit codes, which systemd units and scripts already key on.

/// A clean end: the rounds ran, or the loop was stopped on purpose.
pub const OK: u8 = 0;
/// The agent failed (crashed, exited non-zero, ran over its budget).
pub const AGENT_FAILED: u8 = 1;
/// A breaker tripped: a crash loop, or rounds that make no progress.
pub const BREAKER: u8 = 75;
/// The environment is not ready (lock held, directory unwritable, no engine).
pub const ENVIRONMENT: u8 = 76;
/// The config is broken.
pub const CONFIG: u8 = 78;
/// Interrupted by SIGINT or SIGTERM mid-round.
pub const INTERRUPTED: u8 = 130;

/// A class in the peer's numbers.
pub fn peer_code(class: belay_record::ExitClass) -> u8 {
    use belay_record::ExitClass as C;
    match class {
        C::Usage => CONFIG,
        C::Failed => BREAKER,
        C::Infra => ENVIRONMENT,
        C::Interrupted => INTERRUPTED,
    }
}
