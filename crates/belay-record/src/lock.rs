use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use crate::RecordError;

/// An exclusive advisory lock on a file. The kernel releases it when the process
/// dies, so a `kill -9` never leaves a stale lock behind.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Take the lock, or fail at once with [`RecordError::Locked`].
    pub fn acquire(path: &Path) -> Result<Self, RecordError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| RecordError::io("cannot open lock file", path, e))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(TryLockError::WouldBlock) => Err(RecordError::Locked {
                path: path.to_path_buf(),
            }),
            Err(TryLockError::Error(e)) => Err(RecordError::io("cannot lock", path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_until_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("run.lock");
        let first = RunLock::acquire(&p).unwrap();
        let err = RunLock::acquire(&p).unwrap_err();
        assert!(matches!(err, RecordError::Locked { .. }));
        assert!(err.to_string().contains("run.lock"));
        drop(first);
        RunLock::acquire(&p).unwrap();
    }
}
