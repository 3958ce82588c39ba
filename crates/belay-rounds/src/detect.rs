//! What a round's output says about the outside: an auth failure, a network
//! failure, a rate limit and when it resets. Read from the tail of the round
//! log (bounded), after the round.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::LazyLock;

use jiff::Timestamp;
use regex::Regex;

/// How much of a round log's end is read.
pub const TAIL_BYTES: u64 = 64 * 1024;

/// The last [`TAIL_BYTES`] of a file, as text.
pub fn tail(path: &Path) -> String {
    // host-owned: a round log in the log dir, belay's own.
    let Ok(mut f) = fs_err::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
    let mut b = Vec::new();
    let _ = f.take(TAIL_BYTES).read_to_end(&mut b);
    String::from_utf8_lossy(&b).into_owned()
}

fn re(p: &str) -> Option<Regex> {
    Regex::new(p).ok()
}

static NETWORK: LazyLock<Option<Regex>> = LazyLock::new(|| {
    re(
        r"(?i)\b(ECONNREFUSED|ECONNRESET|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|ENETUNREACH|getaddrinfo|name resolution|dns|connection (reset|refused|closed)|bad gateway|service unavailable|gateway timeout|50[234])\b",
    )
});
static RATE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    re(
        r"(?i)(rate[ _-]?limit|too many requests|\b429\b|usage limit|quota (exceeded|exhausted)|overloaded|resource[_ ]exhausted)",
    )
});
static RESET_EPOCH: LazyLock<Option<Regex>> =
    LazyLock::new(|| re(r"(?i)(?:limit reached|reset[s_ ]?(?:at)?)\W{0,3}\|?\s*(\d{10})\b"));
static RESET_ISO: LazyLock<Option<Regex>> = LazyLock::new(|| {
    re(
        r"(?i)reset[s_ ]*(?:at)?\W{0,4}(\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d))",
    )
});
static RETRY_IN: LazyLock<Option<Regex>> = LazyLock::new(|| {
    re(
        r"(?i)(?:try again|retry|resets?) (?:in|after) (\d+(?:\.\d+)?)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)\b",
    )
});

/// The last line of `text` matching `re`, cut to 200 characters.
fn last_match(text: &str, re: &Regex) -> Option<String> {
    text.lines()
        .rev()
        .find(|l| re.is_match(l))
        .map(|l| l.chars().take(200).collect())
}

pub fn auth_failure(text: &str, re: &Regex) -> Option<String> {
    last_match(text, re)
}

pub fn network_failure(text: &str) -> Option<String> {
    NETWORK.as_ref().and_then(|r| last_match(text, r))
}

/// A rate limit: the line, and when it resets (if the CLI said).
pub fn rate_limit(text: &str, now: Timestamp) -> Option<(String, Option<Timestamp>)> {
    let line = RATE.as_ref().and_then(|r| last_match(text, r))?;
    Some((
        line.clone(),
        reset_time(&line, now).or_else(|| reset_time(text, now)),
    ))
}

/// The reset time a line gives: a unix time, an RFC 3339 time, or "try
/// again in N minutes".
pub fn reset_time(text: &str, now: Timestamp) -> Option<Timestamp> {
    if let Some(c) = RESET_EPOCH
        .as_ref()
        .and_then(|r| r.captures_iter(text).last())
    {
        if let Some(t) = c.get(1).and_then(|m| m.as_str().parse::<i64>().ok()) {
            return Timestamp::from_second(t).ok();
        }
    }
    if let Some(c) = RESET_ISO
        .as_ref()
        .and_then(|r| r.captures_iter(text).last())
    {
        if let Some(t) = c.get(1).and_then(|m| m.as_str().parse::<Timestamp>().ok()) {
            return Some(t);
        }
    }
    let c = RETRY_IN.as_ref()?.captures_iter(text).last()?;
    let n: f64 = c.get(1)?.as_str().parse().ok()?;
    let unit = c.get(2)?.as_str().to_ascii_lowercase();
    let secs = match unit.chars().next()? {
        'h' => n * 3600.0,
        'm' => n * 60.0,
        _ => n,
    };
    now.checked_add(jiff::SignedDuration::from_secs_f64(secs.min(7.0 * 86400.0)))
        .ok()
}

/// The most repeated command among the last `window` commands, when it
/// repeats at least `threshold` times (a stuck loop).
pub fn repetitive(commands: &[String], window: u32, threshold: u32) -> Option<(String, u32)> {
    if window == 0 || threshold == 0 {
        return None;
    }
    let recent = &commands[commands.len().saturating_sub(window as usize)..];
    let mut counts: std::collections::BTreeMap<&str, u32> = Default::default();
    for c in recent {
        *counts.entry(c.as_str()).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .filter(|(_, n)| *n >= threshold)
        .map(|(c, n)| (c.chars().take(200).collect(), n))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reset_times_in_the_forms_the_clis_print() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        assert_eq!(
            reset_time("Claude AI usage limit reached|1796119200", now)
                .unwrap()
                .as_second(),
            1796119200
        );
        assert_eq!(
            reset_time("rate limited; resets at 2026-12-01T11:30:00Z", now)
                .unwrap()
                .to_string(),
            "2026-12-01T11:30:00Z"
        );
        assert_eq!(
            reset_time("429 Too Many Requests: try again in 15 minutes", now)
                .unwrap()
                .to_string(),
            "2026-12-01T10:15:00Z"
        );
        assert!(reset_time("nothing here", now).is_none());
        let (line, at) = rate_limit(
            "ok\nError: 429 rate limit exceeded, retry after 30 seconds\n",
            now,
        )
        .unwrap();
        assert!(line.contains("429"));
        assert_eq!(at.unwrap().to_string(), "2026-12-01T10:00:30Z");
        assert!(rate_limit("all fine", now).is_none());
    }

    #[test]
    fn network_auth_and_loops() {
        assert!(network_failure("fetch failed: getaddrinfo ENOTFOUND api.example").is_some());
        assert!(network_failure("all good").is_none());
        let auth = Regex::new(crate::config::AUTH_FAIL_PATTERN).unwrap();
        assert!(auth_failure("Error: 401 Unauthorized", &auth).is_some());
        assert!(auth_failure("authored the file", &auth).is_none());
        let cmds: Vec<String> = (0..20)
            .map(|i| {
                if i % 4 == 0 {
                    "ls".into()
                } else {
                    "cat a".into()
                }
            })
            .collect();
        assert_eq!(repetitive(&cmds, 20, 15).unwrap().0, "cat a");
        assert!(repetitive(&cmds, 20, 16).is_none());
        assert!(repetitive(&cmds, 0, 1).is_none());
    }
}
