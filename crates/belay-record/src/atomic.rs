use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::RecordError;

/// Write `bytes` to `path` atomically: a temporary file in the same directory is
/// written and fsynced, renamed over `path`, and the directory is fsynced. Readers
/// (and a resume after `kill -9`) see the old content or the new, never a mix.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), RecordError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".to_string());
    // A fresh name, created exclusively and never through a link: a
    // directory a sandbox can write (a work tree) may hold a planted
    // `.name.tmp.PID -> /elsewhere`.
    use std::os::unix::fs::OpenOptionsExt;
    let mut attempt = 0;
    let (tmp, mut f) = loop {
        let tmp = dir.join(format!(
            ".{name}.tmp.{}.{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                attempt += 1;
            }
            Err(e) => return Err(RecordError::io("cannot create", &tmp, e)),
        }
    };
    let result = (|| {
        f.write_all(bytes)
            .map_err(|e| RecordError::io("cannot write", &tmp, e))?;
        f.sync_all()
            .map_err(|e| RecordError::io("cannot sync", &tmp, e))?;
        fs_err::rename(&tmp, path).map_err(|e| RecordError::io("cannot replace", path, e))?;
        // Make the rename itself durable. Not every filesystem allows fsync on a
        // directory; the rename is still atomic there, so that error is ignored.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs_err::remove_file(&tmp);
    }
    result
}

/// Serialise `value` as pretty JSON (with a trailing newline) and write it atomically.
/// Read `path` only when it is a regular file: not through a link (the last
/// component), never blocking on a FIFO, at most `max` bytes. `Ok(None)`: it
/// is missing, or it is something else (a link, a FIFO, a device, a
/// directory), which the caller then does not read. For a file someone else
/// may have planted (a `.env` in a work tree an agent writes).
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // ELOOP: the name is a link.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    if !f.metadata()?.is_file() {
        return Ok(None);
    }
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out)?;
    Ok(Some(out))
}

pub fn write_json_atomic<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), RecordError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| RecordError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    atomic_write(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        atomic_write(&p, b"one").unwrap();
        atomic_write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "temp files left behind: {names:?}");
    }

    #[test]
    fn error_names_the_path() {
        let err = atomic_write(Path::new("/nonexistent-dir/x/state.json"), b"x").unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir/x/"), "{err}");
    }
}
