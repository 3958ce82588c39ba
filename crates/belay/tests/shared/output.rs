//! What a finished command said, for the integration tests' messages.

use std::process::Output;

/// Its stdout, then its stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Its exit code, its stdout and its stderr, each named.
pub fn show(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Fails the test, with [`show`], unless the command succeeded.
pub fn ok(o: &Output) {
    assert!(o.status.success(), "{}", show(o));
}
