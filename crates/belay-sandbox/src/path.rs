//! Finding a host program on `PATH`, the one way: the first regular file of
//! that name, canonicalized (what the host would run, links resolved).

use std::path::PathBuf;

/// The canonical path of `name` on `PATH`, if any.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|c| c.is_file())
        .and_then(|c| fs_err::canonicalize(c).ok())
}
