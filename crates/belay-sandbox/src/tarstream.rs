//! Directories streamed into containers as tar, built on a blocking thread and
//! handed over in chunks: the archive is never held whole in memory.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::SandboxError;

/// Which paths of a directory are copied.
#[derive(Debug, Clone, Default)]
pub struct TarFilter {
    /// Paths relative to the copied directory that are left out, with everything below them.
    pub exclude: Vec<PathBuf>,
    /// `.dockerignore` rules of a build context.
    pub ignore: Option<DockerIgnore>,
}

impl TarFilter {
    fn excluded(&self, rel: &Path) -> bool {
        self.exclude.iter().any(|e| rel.starts_with(e))
            || self.ignore.as_ref().is_some_and(|i| i.ignored(rel))
    }
}

/// `.dockerignore` rules: glob patterns (`*`, `?`, `**`) relative to the
/// context root, later rules winning, `!` re-including. A directory that is
/// ignored is left out with everything below it.
#[derive(Debug, Clone, Default)]
pub struct DockerIgnore {
    rules: Vec<(regex::Regex, bool)>,
}

impl DockerIgnore {
    /// Read `<context>/.dockerignore`, if there is one.
    pub fn read(context: &Path) -> Option<Self> {
        let text = fs_err::read_to_string(context.join(".dockerignore")).ok()?;
        Some(Self::parse(&text))
    }

    pub fn parse(text: &str) -> Self {
        let mut rules = Vec::new();
        for line in text.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (negate, pat) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            let pat = pat
                .trim_start_matches("./")
                .trim_start_matches('/')
                .trim_end_matches('/');
            if let Ok(re) = regex::Regex::new(&glob_to_regex(pat)) {
                rules.push((re, negate));
            }
        }
        Self { rules }
    }

    pub fn ignored(&self, rel: &Path) -> bool {
        let p = rel.to_string_lossy();
        let mut ignored = false;
        for (re, negate) in &self.rules {
            if re.is_match(&p) {
                ignored = !negate;
            }
        }
        ignored
    }
}

fn glob_to_regex(glob: &str) -> String {
    let mut re = String::from("^");
    let chars: Vec<char> = glob.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' if chars.get(i + 1) == Some(&'*') => {
                re.push_str(".*");
                i += 1;
                if chars.get(i + 1) == Some(&'/') {
                    i += 1;
                    re.push_str("/?");
                }
            }
            '*' => re.push_str("[^/]*"),
            '?' => re.push_str("[^/]"),
            c => re.push_str(&regex::escape(&c.to_string())),
        }
        i += 1;
    }
    re.push_str("(/.*)?$");
    re
}

/// A `Write` that sends fixed-size chunks down a channel.
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

const CHUNK: usize = 256 * 1024;

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "tar consumer went away")
        })
    }
}

/// A tar stream being produced: chunks, and the producer's result (entry count).
pub type TarStream = (
    mpsc::Receiver<Result<Bytes, std::io::Error>>,
    tokio::task::JoinHandle<Result<u64, SandboxError>>,
);

/// Stream `dir` as a tar archive whose entries are rooted at `prefix`
/// (e.g. `workspace/repo`). Symlinks are archived as symlinks, never followed.
pub fn tar_dir_stream(dir: &Path, prefix: &str, filter: &TarFilter) -> TarStream {
    let (tx, rx) = mpsc::channel(8);
    let dir = dir.to_path_buf();
    let prefix = prefix.trim_matches('/').to_string();
    let filter = filter.clone();
    let handle = tokio::task::spawn_blocking(move || {
        let err_tx = tx.clone();
        let writer = ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        };
        let result = write_tar(&dir, &prefix, &filter, writer);
        if let Err(e) = &result {
            let _ = err_tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
        result
    });
    (rx, handle)
}

fn write_tar(
    dir: &Path,
    prefix: &str,
    filter: &TarFilter,
    writer: ChannelWriter,
) -> Result<u64, SandboxError> {
    let mut builder = tar::Builder::new(writer);
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Complete);
    // The Docker engine refuses GNU sparse entries ("unhandled tar header
    // type 83"), and a file with holes (a linker's output, a disk image in a
    // repository) would be written as one: every file goes whole.
    builder.sparse(false);
    let mut count = 0u64;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        let name = if rel.as_os_str().is_empty() {
            PathBuf::from(prefix)
        } else {
            Path::new(prefix).join(&rel)
        };
        let meta =
            fs_err::symlink_metadata(&abs).map_err(|e| SandboxError::io("cannot read", &abs, e))?;
        // With an empty prefix (a build context) the root itself has no entry.
        if !name.as_os_str().is_empty() {
            builder
                .append_path_with_name(&abs, &name)
                .map_err(|e| SandboxError::io("cannot archive", &abs, e))?;
            count += 1;
        }
        if meta.is_dir() {
            let mut entries: Vec<_> = fs_err::read_dir(&abs)
                .map_err(|e| SandboxError::io("cannot list", &abs, e))?
                .filter_map(|e| e.ok())
                .map(|e| rel.join(e.file_name()))
                .filter(|r| !filter.excluded(r))
                .collect();
            entries.sort();
            entries.reverse();
            stack.extend(entries);
        }
    }
    let mut w = builder
        .into_inner()
        .map_err(|e| SandboxError::io("cannot finish archive of", dir, e))?;
    w.flush()
        .map_err(|e| SandboxError::io("cannot stream archive of", dir, e))?;
    Ok(count)
}

/// A small in-memory tar of files: (path, content, mode).
pub fn tar_files(files: &[(String, Vec<u8>, u32)]) -> Result<Vec<u8>, std::io::Error> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, content, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(
            &mut header,
            path.trim_start_matches('/'),
            content.as_slice(),
        )?;
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerignore_rules() {
        let d = DockerIgnore::parse("# comment\n.env\n*.log\nsecrets/\n**/tmp\n!keep.log\n");
        assert!(d.ignored(Path::new(".env")));
        assert!(d.ignored(Path::new("build.log")));
        assert!(!d.ignored(Path::new("keep.log")));
        assert!(d.ignored(Path::new("secrets/key.pem")));
        assert!(d.ignored(Path::new("a/b/tmp/x")));
        assert!(!d.ignored(Path::new("src/main.rs")));
        assert!(!d.ignored(Path::new(".envrc")));
    }
}
