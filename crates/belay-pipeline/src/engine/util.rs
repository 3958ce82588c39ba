//! Small helpers of the engine: sizes, tails, the agent spec of an agent file, and
//! the missing-dependency list of an agent's answer.

use super::*;

pub(super) fn parse_memory(s: &str) -> Option<i64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1i64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s.as_str(), 1),
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .map(|n| (n * mult as f64) as i64)
}

/// `64m`, `1g`, `0`: a size in bytes, for `isolation.log_limit`.
pub(super) fn parse_size(s: &str) -> Option<u64> {
    parse_memory(s).and_then(|n| u64::try_from(n).ok())
}

/// This process's peak resident memory (VmHWM), in bytes.
pub(super) fn peak_rss_bytes() -> Option<u64> {
    // host-owned: /proc of belay's own process.
    let status = fs_err::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

pub(super) fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("[…]\n{}", &s[cut..])
}

/// The last `max` bytes of a file (the log is written redacted). Only for
/// belay's own logs: the run dir's `logs/` (never mounted into a step).
pub(super) fn read_tail(path: &Path, max: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    // host-owned: an exec log belay's log sink wrote in the run dir (outside the workspace, not mounted).
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max))).ok()?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// At most 200 entries of a list, for an event (a commit of 200,000 files
/// must not make one event line of 50 MB).
pub(super) fn cap_list(v: &[String]) -> &[String] {
    &v[..v.len().min(200)]
}

/// An agent file's spec: its `runner` (the one agent spec syntax), with the
/// file's `model` when the runner names none.
pub(super) fn agent_spec(def: &crate::schema::AgentDef) -> Result<AgentSpec, PipelineError> {
    let mut spec: AgentSpec = def
        .runner
        .parse()
        .map_err(|e| PipelineError::Config(format!("{}: runner: {e}", def.path.display())))?;
    if spec.model.is_none() {
        spec.model = def.model.clone();
    }
    Ok(spec)
}

/// The pins under a `## Missing dependencies` header.
pub fn missing_deps(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') {
            inside = t
                .trim_start_matches('#')
                .trim()
                .eq_ignore_ascii_case("missing dependencies");
            continue;
        }
        if inside {
            let pin = t.trim_start_matches(['-', '*', ' ']).trim();
            if !pin.is_empty() && !pin.eq_ignore_ascii_case("none") {
                out.push(pin.to_string());
            }
        }
    }
    out
}
