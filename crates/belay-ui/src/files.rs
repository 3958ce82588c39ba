//! Reading a run's files: only inside its directory, never through a
//! symbolic link, and never more than a bound at a time (a step's log can
//! be gigabytes).
//!
//! What is served is an allowlist, not "any file of the run": the logs
//! ([`log_path`]: under the run's log directories or a top-level `*.log`,
//! every name parsed by the one validator of ids) and the named records
//! ([`RECORDS`], read whole through `belay_sandbox::hostfs`). The run's
//! lock, its git config copy, its artifacts (which a sandbox writes) and
//! anything else are never served.

use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::{Component, Path};

use belay_record::{Id, IdError};
use serde::Serialize;

/// The records of a run the page may read whole (small, written by belay).
pub(crate) const RECORDS: &[&str] = &[
    "state.json",
    "summary.json",
    "manifest.json",
    "report.json",
    "published.json",
    "llm-usage.json",
    "Dockerfile",
    "answer.md",
];

/// A run's directory: a directory (not a link to one) holding the run's lock
/// or its event log, as every `RunHandle` leaves.
pub(crate) fn is_run_dir(dir: &Path) -> bool {
    let plain = |p: &Path, file: bool| {
        std::fs::symlink_metadata(p).is_ok_and(|m| if file { m.is_file() } else { m.is_dir() })
    };
    dir.is_absolute()
        && plain(dir, false)
        && (plain(&dir.join(belay_record::LOCK_FILE), true)
            || plain(&dir.join(belay_record::EVENTS_FILE), true))
}

/// `rel` inside `dir`, opened: plain components only, a regular file at the
/// end. It is opened once, beneath `dir` and through no symbolic link
/// (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so a link put on
/// the way after a check cannot redirect the read; non-blocking, so a FIFO
/// is refused at once instead of holding the request. A log is opened here
/// (not read whole through `hostfs`) because it is read a piece at a time.
pub(crate) fn inside(dir: &Path, rel: &str) -> Option<std::fs::File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let rel = Path::new(rel);
    if rel.as_os_str().is_empty()
        || rel.components().count() > 8
        || !rel.components().all(|c| matches!(c, Component::Normal(_)))
    {
        return None;
    }
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
    let base = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let fd = rustix::fs::openat2(
        &base,
        rel,
        flags,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .ok()?;
    let f = std::fs::File::from(fd);
    f.metadata().ok().filter(|m| m.is_file()).map(|_| f)
}

/// A small record, or `None` when it is missing, no regular file, reached
/// through a link, or too big to be one: read whole through
/// `belay_sandbox::hostfs` (no link at any level, a regular file, capped).
pub(crate) fn read_record(dir: &Path, name: &str, max: u64) -> Option<String> {
    let bytes = belay_sandbox::hostfs::read(dir, name, max.saturating_add(1)).ok()??;
    if bytes.len() as u64 > max {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// The first event of `kind` in the head (`max` bytes) of a run's log.
pub(crate) fn first_event(dir: &Path, kind: &str, max: u64) -> Option<serde_json::Value> {
    let f = inside(dir, belay_record::EVENTS_FILE)?;
    std::io::BufReader::new(f.take(max))
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .find(|v| v["kind"] == kind)
}

#[derive(Debug, Serialize)]
pub(crate) struct LogFile {
    pub path: String,
    pub size: u64,
}

/// The directories of a run that hold logs: the pipeline's and the env
/// builder's `logs/`, the plan loop's `agents/` and `gate/`, a job's
/// `checks/`.
const LOG_DIRS: &[&str] = &["logs", "agents", "gate", "checks"];

/// Whether `rel` is a log of a run: under one of its log directories, or a
/// `.log` file at its top (a job's `on-commit.log`). Nothing else of a run
/// directory is served as a log.
pub(crate) fn is_log(rel: &str) -> bool {
    match rel.split_once('/') {
        Some((top, _)) => LOG_DIRS.contains(&top),
        None => rel.ends_with(".log"),
    }
}

/// Why the log endpoint refuses a path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogRefused {
    /// A name of the path is no id (`..`, a leading dot, a space, …).
    #[error(transparent)]
    Name(#[from] IdError),
    #[error("a log path has at most 8 names")]
    TooDeep,
    #[error(
        "{rel} is not a log of the run: logs are under logs/, agents/, gate/ or checks/, or a top-level *.log"
    )]
    NotALog { rel: String },
}

/// The most names a log path has.
const MAX_LOG_DEPTH: usize = 8;

/// A path the log endpoint serves: every name an id (the one validator),
/// at most [`MAX_LOG_DEPTH`] of them, and a log ([`is_log`]).
pub(crate) fn log_path(rel: &str) -> Result<(), LogRefused> {
    let names: Vec<&str> = rel.split('/').collect();
    if names.len() > MAX_LOG_DEPTH {
        return Err(LogRefused::TooDeep);
    }
    for n in &names {
        Id::parse("log name", n)?;
    }
    if !is_log(rel) {
        return Err(LogRefused::NotALog {
            rel: rel.to_string(),
        });
    }
    Ok(())
}

/// Every log of a run (`logs/` of the pipeline and the env builder, the plan
/// loop's `agents/` and `gate/`, a job's check and hook logs), four levels
/// deep at most, sorted.
pub(crate) fn logs(dir: &Path) -> Vec<LogFile> {
    fn walk(root: &Path, d: &Path, depth: u32, out: &mut Vec<LogFile>) {
        // host-owned: the run's log directories, which belay writes (a sandbox writes only artifacts/, never walked); entries are typed without following links.
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            if out.len() >= 5000 {
                return;
            }
            let Ok(t) = e.file_type() else { continue };
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            if t.is_dir() && depth < 4 && (depth > 0 || LOG_DIRS.contains(&rel.as_str())) {
                walk(root, &p, depth + 1, out);
            } else if t.is_file() && log_path(&rel).is_ok() {
                out.push(LogFile {
                    path: rel,
                    size: e.metadata().map(|m| m.len()).unwrap_or(0),
                });
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, 0, &mut out);
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The least a piece of a log holds (a smaller one would cut lines, and the
/// redactor sees a piece at a time).
pub(crate) const MIN_PIECE: u64 = 64 << 10;

/// A piece of a log: from `from` (the tail when `None`, from its first whole
/// line), at most `max` bytes, ending at a line end when it holds one, cut
/// back to whole UTF-8 characters. Its start and end offsets.
pub(crate) fn slice(
    mut f: std::fs::File,
    from: Option<u64>,
    max: u64,
) -> std::io::Result<(u64, u64, String)> {
    let max = max.max(MIN_PIECE);
    let size = f.metadata()?.len();
    let mut start = from.unwrap_or(size.saturating_sub(max)).min(size);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf)?;
    if from.is_none() && start > 0 {
        if let Some(i) = buf.iter().position(|b| *b == b'\n') {
            buf.drain(..=i);
            start += i as u64 + 1;
        }
    }
    if let Some(i) = buf.iter().rposition(|b| *b == b'\n') {
        buf.truncate(i + 1);
    }
    // A piece may end inside a character; the rest comes with the next one.
    let end = match std::str::from_utf8(&buf) {
        Ok(_) => buf.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => buf.len(),
    };
    buf.truncate(end);
    Ok((
        start,
        start + end as u64,
        String::from_utf8_lossy(&buf).into_owned(),
    ))
}

#[derive(Debug, Serialize)]
pub(crate) struct Hit {
    pub line: u64,
    pub text: String,
}

/// The lines of a file that hold `needle` (case-insensitive), streamed, at
/// most `limit` of them, each cut to 2,000 characters.
/// Lines are matched as redacted: a search cannot find a secret out.
pub(crate) fn search(
    f: std::fs::File,
    needle: &str,
    limit: usize,
    redactor: &belay_record::Redactor,
) -> std::io::Result<(Vec<Hit>, bool)> {
    let mut r = std::io::BufReader::new(f);
    let needle = needle.to_lowercase();
    let mut hits = Vec::new();
    let mut buf = Vec::new();
    let mut n = 0u64;
    loop {
        buf.clear();
        // A line is read at most 1 MiB at a time: a log without newlines
        // cannot make this hold it whole.
        let got = (&mut r).take(1 << 20).read_until(b'\n', &mut buf)?;
        if got == 0 {
            return Ok((hits, false));
        }
        n += 1;
        let raw = String::from_utf8_lossy(&buf);
        let line = redactor.redact(&raw);
        if line.to_lowercase().contains(&needle) {
            if hits.len() == limit {
                return Ok((hits, true));
            }
            hits.push(Hit {
                line: n,
                text: line.trim_end().chars().take(2000).collect(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_plain_paths_inside_the_run_and_no_links() {
        let top = tempfile::tempdir().unwrap();
        let d = top.path().join("run");
        let d = &d;
        std::fs::create_dir_all(d.join("logs")).unwrap();
        std::fs::write(d.join("logs/a.log"), "one\nTwo two\nthree\n").unwrap();
        std::fs::write(top.path().join("outside-belay-ui-test"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join("logs/link.log")).unwrap();
        std::os::unix::fs::symlink("/etc", d.join("logs/etc")).unwrap();
        assert!(inside(d, "logs/a.log").is_some());
        for bad in [
            "../outside-belay-ui-test",
            "/etc/passwd",
            "logs/link.log",
            "logs/etc/passwd",
            "logs",
            "",
            "logs/./a.log/..",
        ] {
            assert!(inside(d, bad).is_none(), "{bad}");
        }
        assert!(is_log("logs/a.log") && is_log("on-commit.log") && is_log("gate/x/y"));
        assert!(!is_log("state.json") && !is_log("scripts/00.sh") && !is_log("run.lock"));
        for ok in [
            "logs/a.log",
            "on-commit.log",
            "checks/site-check1.log",
            "gate/001-x/y",
        ] {
            assert!(log_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "state.json",
            "run.lock",
            "git-config.sandbox",
            "artifacts/out.log",
            "logs/../state.json",
            "logs/./a.log",
            "/etc/passwd",
            "logs//a.log",
            "logs/.hidden.log",
            "",
            "logs/a/b/c/d/e/f/g/h.log",
        ] {
            assert!(log_path(bad).is_err(), "{bad}");
        }
        // A FIFO is refused at once, not waited on.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.join("logs/fifo.log"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(inside(d, "logs/fifo.log").is_none());
        std::fs::remove_file(d.join("logs/fifo.log")).unwrap();
        // A record is read whole, not through a link, and not past its cap.
        std::fs::write(d.join("summary.json"), "{\"ok\":true}").unwrap();
        std::os::unix::fs::symlink(
            top.path().join("outside-belay-ui-test"),
            d.join("report.json"),
        )
        .unwrap();
        assert_eq!(
            read_record(d, "summary.json", 100).as_deref(),
            Some("{\"ok\":true}")
        );
        assert!(read_record(d, "summary.json", 3).is_none());
        assert!(read_record(d, "report.json", 100).is_none());
        std::fs::write(d.join("state.json"), "{}").unwrap();
        let listed: Vec<String> = logs(d).into_iter().map(|l| l.path).collect();
        // Links (to a file, to a directory) are not listed; records are not logs.
        assert_eq!(listed, ["logs/a.log"]);
        let red = belay_record::Redactor::new([("K".to_string(), "Two two".to_string())]);
        let (hits, _) = search(inside(d, "logs/a.log").unwrap(), "TWO", 10, &red).unwrap();
        assert!(hits.is_empty(), "a search found a secret out: {hits:?}");
        let (hits, more) = search(inside(d, "logs/a.log").unwrap(), "thr", 10, &red).unwrap();
        assert_eq!((hits.len(), hits[0].line, more), (1, 3, false));
        // A tail starts at a whole line, and a piece ends at one.
        let big: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(d.join("logs/big.log"), &big).unwrap();
        let (from, to, text) = slice(inside(d, "logs/big.log").unwrap(), None, 1).unwrap();
        assert_eq!(to, big.len() as u64);
        assert!(text.starts_with("line ") && text.ends_with('\n'));
        assert_eq!(&big[from as usize..], text);
        let (_, to, text) = slice(inside(d, "logs/big.log").unwrap(), Some(0), 1).unwrap();
        assert!(text.ends_with('\n') && to <= MIN_PIECE && to > MIN_PIECE - 20);
        // A cut inside a character waits for the rest.
        let mut u = "a".repeat(MIN_PIECE as usize - 1);
        u.push('é');
        std::fs::write(d.join("logs/u.log"), &u).unwrap();
        let (_, to, _) = slice(inside(d, "logs/u.log").unwrap(), Some(0), 2).unwrap();
        assert_eq!(to, MIN_PIECE - 1);
    }
}
