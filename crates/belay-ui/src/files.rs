//! Reading a run's files: only inside its directory, never through a
//! symbolic link, and never more than a bound at a time (a step's log can
//! be gigabytes).

use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::{Component, Path};

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
/// the way after a check cannot redirect the read.
pub(crate) fn inside(dir: &Path, rel: &str) -> Option<std::fs::File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let rel = Path::new(rel);
    if rel.as_os_str().is_empty()
        || rel.components().count() > 8
        || !rel.components().all(|c| matches!(c, Component::Normal(_)))
    {
        return None;
    }
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
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

/// A small record, or `None` when it is missing or too big to be one.
pub(crate) fn read_record(dir: &Path, name: &str, max: u64) -> Option<String> {
    let f = inside(dir, name)?;
    if f.metadata().ok()?.len() > max {
        return None;
    }
    let mut s = String::new();
    f.take(max).read_to_string(&mut s).ok()?;
    Some(s)
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

/// Every log of a run (`logs/` of the pipeline and the env builder, the plan
/// loop's `agents/` and `gate/`, a job's check and hook logs), four levels
/// deep at most, sorted.
pub(crate) fn logs(dir: &Path) -> Vec<LogFile> {
    fn walk(root: &Path, d: &Path, depth: u32, out: &mut Vec<LogFile>) {
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
            } else if t.is_file() && is_log(&rel) {
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
