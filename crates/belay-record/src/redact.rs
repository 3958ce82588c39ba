//! Secret redaction: one set of patterns, used on strings, JSON values, byte
//! streams (logs) and files (the commit's secret check).
//!
//! A secret is matched in the forms a sandboxed process can easily turn it
//! into: the raw value; for a multi-line value, each of its lines; its JSON
//! string escaping; its URL (percent) encoding; its hex (both cases); and its
//! base64 (standard and URL-safe alphabets, at each of the three byte
//! alignments, so an encoding of a larger text that contains the secret is
//! caught too). All patterns are matched at once (Aho-Corasick, leftmost
//! longest), so a secret that contains another is scrubbed whole.

use std::borrow::Cow;
use std::io::Read;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;

/// Replaces secret values with `[REDACTED:<name>]`.
///
/// Values shorter than [`Redactor::MIN_LEN`] are ignored: scrubbing "1" or "on"
/// would mangle every log without protecting anything.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<(String, String)>,
    patterns: Arc<Patterns>,
}

#[derive(Default)]
struct Patterns {
    /// (secret name, pattern bytes), in the automaton's order.
    list: Vec<(String, Vec<u8>)>,
    ac: Option<AhoCorasick>,
    longest: usize,
    /// The bytes some pattern starts with: a stream's tail is compared with
    /// the patterns only from those (most output starts none).
    first: [u64; 4],
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.secrets.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Redactor")
            .field("secrets", &names)
            .field("patterns", &self.patterns.list.len())
            .finish()
    }
}

/// Shortest line of a multi-line secret that is matched on its own.
const MIN_FRAGMENT: usize = 12;
/// Shortest encoded form that is matched (shorter ones match too much).
const MIN_ENCODED: usize = 8;

/// The forms of one secret that are matched.
fn variants(value: &str) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut push = |v: Vec<u8>, min: usize| {
        if v.len() >= min && !out.contains(&v) {
            out.push(v);
        }
    };
    push(value.as_bytes().to_vec(), Redactor::MIN_LEN);
    if value.contains('\n') {
        for line in value.lines() {
            let line = line.trim_end_matches('\r').trim();
            // PEM armour lines (`-----BEGIN … KEY-----`) are public text.
            if !line.starts_with("-----") {
                push(line.as_bytes().to_vec(), MIN_FRAGMENT);
            }
        }
    }
    if let Ok(json) = serde_json::to_string(value) {
        let inner = &json[1..json.len() - 1];
        push(inner.as_bytes().to_vec(), Redactor::MIN_LEN);
        // Other encoders escape `/` and write non-ASCII as `\uXXXX`.
        push(inner.replace('/', "\\/").into_bytes(), Redactor::MIN_LEN);
        let ascii: String = inner
            .chars()
            .map(|c| {
                if c.is_ascii() {
                    c.to_string()
                } else {
                    c.encode_utf16(&mut [0; 2])
                        .iter()
                        .map(|u| format!("\\u{u:04x}"))
                        .collect()
                }
            })
            .collect();
        push(ascii.replace('/', "\\/").into_bytes(), Redactor::MIN_LEN);
        push(ascii.into_bytes(), Redactor::MIN_LEN);
    }
    // Percent-encoding, as RFC 3986 and as JavaScript's encodeURIComponent
    // leave characters alone, with either case of hex digits; and the form
    // encoding of spaces.
    for keep in [UNRESERVED, URI_COMPONENT] {
        let upper = percent_encode(value, keep);
        let lower = upper.to_ascii_lowercase_hex();
        push(lower.replace("%20", "+").into_bytes(), MIN_ENCODED);
        push(lower.into_bytes(), MIN_ENCODED);
        push(upper.replace("%20", "+").into_bytes(), MIN_ENCODED);
        push(upper.into_bytes(), MIN_ENCODED);
    }
    push(hex::encode(value.as_bytes()), MIN_ENCODED);
    push(hex::encode_upper(value.as_bytes()), MIN_ENCODED);
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for offset in 0..3usize {
            let core = base64_core(engine, value.as_bytes(), offset);
            // `base64` wraps at 76 columns and PEM at 64: the same core with
            // a newline at every position the wrap can fall.
            for width in [64usize, 76] {
                for phase in 0..width.min(core.len()) {
                    let mut wrapped = Vec::with_capacity(core.len() + core.len() / width + 1);
                    for (i, b) in core.iter().enumerate() {
                        if i > 0 && (i + width - phase) % width == 0 {
                            wrapped.push(b'\n');
                        }
                        wrapped.push(*b);
                    }
                    if wrapped.len() != core.len() {
                        push(wrapped, MIN_ENCODED);
                    }
                }
            }
            push(core, MIN_ENCODED);
        }
    }
    out
}

/// The base64 characters that depend only on `secret` when it starts
/// `offset` bytes into the encoded text (the characters shared with the
/// unknown neighbours are left out).
fn base64_core(engine: &base64::engine::GeneralPurpose, secret: &[u8], offset: usize) -> Vec<u8> {
    let mut buf = vec![0u8; offset];
    buf.extend_from_slice(secret);
    let enc = engine.encode(&buf);
    // Characters whose 6 bits include any prefix bit.
    let skip = (offset * 8).div_ceil(6);
    // The last character is partial when the bits do not fill it.
    let bits = buf.len() * 8;
    let full = bits / 6;
    if full <= skip {
        return Vec::new();
    }
    enc.as_bytes()[skip..full].to_vec()
}

/// What RFC 3986 leaves unencoded (besides letters and digits).
const UNRESERVED: &[u8] = b"-_.~";
/// What JavaScript's `encodeURIComponent` leaves unencoded.
const URI_COMPONENT: &[u8] = b"-_.!~*'()";

trait LowerHex {
    fn to_ascii_lowercase_hex(&self) -> String;
}

impl LowerHex for String {
    /// `%2F` → `%2f` (only the hex digits after a `%`).
    fn to_ascii_lowercase_hex(&self) -> String {
        let mut out = String::with_capacity(self.len());
        let mut left = 0;
        for c in self.chars() {
            if c == '%' {
                left = 2;
                out.push(c);
            } else if left > 0 {
                left -= 1;
                out.push(c.to_ascii_lowercase());
            } else {
                out.push(c);
            }
        }
        out
    }
}

fn percent_encode(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

mod hex {
    pub fn encode(b: &[u8]) -> Vec<u8> {
        b.iter()
            .flat_map(|x| format!("{x:02x}").into_bytes())
            .collect()
    }
    pub fn encode_upper(b: &[u8]) -> Vec<u8> {
        b.iter()
            .flat_map(|x| format!("{x:02X}").into_bytes())
            .collect()
    }
}

impl Patterns {
    fn build(secrets: &[(String, String)]) -> Patterns {
        let mut list: Vec<(String, Vec<u8>)> = Vec::new();
        for (name, value) in secrets {
            for v in variants(value) {
                if !list.iter().any(|(_, x)| *x == v) {
                    list.push((name.clone(), v));
                }
            }
        }
        let longest = list.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
        let ac = if list.is_empty() {
            None
        } else {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(list.iter().map(|(_, v)| v))
                .ok()
        };
        let mut first = [0u64; 4];
        for (_, v) in &list {
            if let Some(b) = v.first() {
                first[usize::from(*b / 64)] |= 1 << (b % 64);
            }
        }
        Patterns {
            list,
            ac,
            longest,
            first,
        }
    }
}

impl Redactor {
    pub const MIN_LEN: usize = 4;

    pub fn new(secrets: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut r = Self::default();
        r.push_all(secrets);
        r
    }

    /// Register a secret (with all its matched forms).
    pub fn add(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.push_all([(name.into(), value.into())]);
    }

    /// Keep each (name, value) whose value is long enough and not held yet
    /// (the first name of a value stays), then rebuild the automaton once.
    fn push_all(&mut self, secrets: impl IntoIterator<Item = (String, String)>) {
        let before = self.secrets.len();
        for (name, value) in secrets {
            if value.len() >= Self::MIN_LEN && !self.secrets.iter().any(|(_, v)| *v == value) {
                self.secrets.push((name, value));
            }
        }
        if self.secrets.len() != before {
            self.patterns = Arc::new(Patterns::build(&self.secrets));
        }
    }

    /// Register every secret of `other` whose value this one lacks, keeping
    /// this one's names for the values both hold (a mode's own secret keeps
    /// its name when the host policy also has its value). One rebuild.
    pub fn extend_from(&mut self, other: &Redactor) {
        self.push_all(other.secrets.iter().cloned());
    }

    /// Register the credentials embedded in a URL (`scheme://user:password@host`),
    /// as found in proxy settings and git remotes: the password and the whole
    /// userinfo, each as written and percent-decoded (what a client sends,
    /// e.g. in `Proxy-Authorization: Basic`, and prints). The userinfo is
    /// found as [`without_userinfo`] finds it.
    pub fn add_url_credentials(&mut self, name: &str, url: &str) {
        let Some((_, userinfo, _)) = split_userinfo(url) else {
            return;
        };
        let mut found: Vec<(String, String)> = Vec::new();
        if let Some((_, password)) = userinfo.split_once(':') {
            found.push((format!("{name}_PASSWORD"), password.to_string()));
            found.push((format!("{name}_PASSWORD"), percent_decode(password)));
        }
        found.push((format!("{name}_USERINFO"), userinfo.to_string()));
        found.push((format!("{name}_USERINFO"), percent_decode(userinfo)));
        self.push_all(found);
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The registered secrets (name, value).
    pub fn secrets(&self) -> &[(String, String)] {
        &self.secrets
    }

    /// The longest matched form, in bytes (what a stream must hold back).
    pub fn longest(&self) -> usize {
        self.patterns.longest
    }

    /// How many bytes at the end of `pending` a stream must hold back: the
    /// longest suffix that is a proper prefix of a secret form (so it may
    /// still become one). Output that cannot start a secret goes out at once,
    /// so a live log lags only where a secret may be in the making.
    fn held_back(&self, pending: &[u8]) -> usize {
        let window = self.patterns.longest.saturating_sub(1).min(pending.len());
        let start = pending.len() - window;
        (start..pending.len())
            .find(|&i| {
                let b = pending[i];
                if self.patterns.first[usize::from(b / 64)] & (1 << (b % 64)) == 0 {
                    return false;
                }
                let tail = &pending[i..];
                self.patterns
                    .list
                    .iter()
                    .any(|(_, p)| p.len() > tail.len() && p.starts_with(tail))
            })
            .map_or(0, |i| pending.len() - i)
    }

    fn replacement(&self, pattern: usize) -> String {
        format!("[REDACTED:{}]", self.patterns.list[pattern].0)
    }

    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(ac) = &self.patterns.ac else {
            return Cow::Borrowed(text);
        };
        let mut out = String::new();
        let mut last = 0;
        for m in ac.find_iter(text) {
            // Every pattern is valid UTF-8, so match bounds are char bounds.
            let (Some(before), true) = (text.get(last..m.start()), text.is_char_boundary(m.end()))
            else {
                continue;
            };
            out.push_str(before);
            out.push_str(&self.replacement(m.pattern().as_usize()));
            last = m.end();
        }
        if last == 0 {
            return Cow::Borrowed(text);
        }
        out.push_str(&text[last..]);
        Cow::Owned(out)
    }

    /// Redact bytes that need not be UTF-8.
    pub fn redact_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let Some(ac) = &self.patterns.ac else {
            return Cow::Borrowed(bytes);
        };
        let mut out = Vec::new();
        let mut last = 0;
        for m in ac.find_iter(bytes) {
            out.extend_from_slice(&bytes[last..m.start()]);
            out.extend_from_slice(self.replacement(m.pattern().as_usize()).as_bytes());
            last = m.end();
        }
        if last == 0 {
            return Cow::Borrowed(bytes);
        }
        out.extend_from_slice(&bytes[last..]);
        Cow::Owned(out)
    }

    /// Redact every string (and object key) of a JSON value in place, before
    /// it is serialised: escaping cannot hide a value from the match.
    pub fn redact_value(&self, v: &mut serde_json::Value) {
        if self.is_empty() {
            return;
        }
        match v {
            serde_json::Value::String(s) => {
                if let Cow::Owned(r) = self.redact(s) {
                    *s = r;
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.redact_value(x)),
            serde_json::Value::Object(m) => {
                let keys: Vec<String> = m.keys().cloned().collect();
                for k in keys {
                    if let Some(mut x) = m.remove(&k) {
                        self.redact_value(&mut x);
                        m.insert(self.redact(&k).into_owned(), x);
                    }
                }
            }
            _ => {}
        }
    }

    /// Also mask a start that is the end of a secret and an end that is the
    /// start of one (at least [`Redactor::MIN_LEN`] bytes): for a tail cut
    /// out of a longer stream, where a secret may be split at the cut.
    pub fn redact_fragment(&self, text: &str) -> String {
        let mut s = self.redact(text).into_owned();
        for (name, p) in &self.patterns.list {
            let Ok(p) = std::str::from_utf8(p) else {
                continue;
            };
            let max = p.len().saturating_sub(1).min(s.len());
            for k in (Self::MIN_LEN..=max).rev() {
                let (Some(head), Some(tail)) = (p.get(..k), p.get(p.len() - k..)) else {
                    continue;
                };
                if s.ends_with(head) {
                    s.truncate(s.len() - k);
                    s.push_str(&format!("[REDACTED:{name}]"));
                    break;
                }
                if s.starts_with(tail) {
                    s = format!("[REDACTED:{name}]{}", &s[k..]);
                    break;
                }
            }
        }
        s
    }

    /// A scanner for this redactor's patterns, for streamed content.
    pub fn scanner(&self) -> SecretScanner {
        SecretScanner {
            patterns: self.patterns.clone(),
        }
    }
}

/// `scheme://user:pass@host/…` without its userinfo (`scheme://host/…`), for
/// display; `None` when the URL has none.
pub fn without_userinfo(url: &str) -> Option<String> {
    let (scheme, _, rest) = split_userinfo(url)?;
    Some(format!("{scheme}://{rest}"))
}

/// A URL's scheme, userinfo and what follows the userinfo's `@`; `None`
/// when it has no userinfo. The authority runs to the first `/` after
/// `scheme://` and the userinfo to the last `@` in it. A `?` or `#` does not
/// end the authority here: a client may take `bob:Pa?ss#w0rd` in
/// `https://bob:Pa?ss#w0rd@host/` as the userinfo, so it is treated as one
/// (an `@` in a query without a `/` before it counts too: hiding too much
/// is the safe side). An `@` only after the first `/` is not userinfo.
fn split_userinfo(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find('/').unwrap_or(rest.len());
    let at = rest.get(..end)?.rfind('@')?;
    Some((scheme, rest.get(..at)?, rest.get(at + 1..)?))
}

/// `%XX` decoded (as bytes, then read as UTF-8, lossily); a `%` not
/// followed by two hex digits is kept as is.
fn percent_decode(s: &str) -> String {
    let digit = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
    let b = s.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            if let (Some(hi), Some(lo)) = (digit(b.get(i + 1)), digit(b.get(i + 2))) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Finds any secret form in streamed content with bounded memory.
pub struct SecretScanner {
    patterns: Arc<Patterns>,
}

impl SecretScanner {
    /// The name of the first secret found in `r`, reading it in chunks (the
    /// memory held is one chunk plus the longest pattern).
    pub fn scan(&self, mut r: impl Read) -> std::io::Result<Option<String>> {
        let Some(ac) = &self.patterns.ac else {
            std::io::copy(&mut r, &mut std::io::sink())?;
            return Ok(None);
        };
        const CHUNK: usize = 256 * 1024;
        let keep = self.patterns.longest.saturating_sub(1);
        let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + keep);
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let n = r.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(m) = ac.find(&buf) {
                // Drain the rest, so a writer on the other end never blocks.
                std::io::copy(&mut r, &mut std::io::sink())?;
                return Ok(Some(self.patterns.list[m.pattern().as_usize()].0.clone()));
            }
            if buf.len() > keep {
                buf.drain(..buf.len() - keep);
            }
        }
        Ok(None)
    }
}

/// Whether a presented secret (a bearer token) equals the expected one, in
/// time that depends only on their lengths.
pub fn same_secret(presented: &[u8], expected: &[u8]) -> bool {
    presented.len() == expected.len()
        && presented
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Redacts a byte stream written in pieces: a secret split across pieces (or
/// across stdout and stderr, merged into one log) is still scrubbed, because
/// a tail that may start a secret (at most `longest - 1` bytes) is held back
/// until it is known whether it does. Memory: at most one piece plus the longest pattern.
pub struct StreamRedactor {
    redactor: Redactor,
    pending: Vec<u8>,
}

impl StreamRedactor {
    pub fn new(redactor: Redactor) -> Self {
        StreamRedactor {
            redactor,
            pending: Vec::new(),
        }
    }

    /// Feed bytes; what can be emitted safely is appended to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let Some(ac) = self.redactor.patterns.ac.clone() else {
            out.extend_from_slice(bytes);
            return;
        };
        self.pending.extend_from_slice(bytes);
        let keep = self.redactor.held_back(&self.pending);
        let mut last = 0;
        let mut safe_end = self.pending.len().saturating_sub(keep);
        for m in ac.find_iter(&self.pending) {
            // A match that runs into the held-back region may still grow
            // (leftmost longest): wait for more bytes before deciding.
            if m.end() > safe_end && m.start() >= safe_end {
                break;
            }
            out.extend_from_slice(&self.pending[last..m.start()]);
            out.extend_from_slice(self.redactor.replacement(m.pattern().as_usize()).as_bytes());
            last = m.end();
            safe_end = safe_end.max(last);
        }
        let emit_to = safe_end.max(last);
        out.extend_from_slice(&self.pending[last..emit_to]);
        self.pending.drain(..emit_to);
    }

    /// Emit what is held back (the stream ended).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let rest = std::mem::take(&mut self.pending);
        out.extend_from_slice(&self.redactor.redact_bytes(&rest));
    }
}

/// Whether a variable's name says it holds a secret (`…KEY`, `…TOKEN`,
/// `…SECRET`, `…PASSWORD`, `…CREDENTIAL`).
pub fn looks_secret(name: &str) -> bool {
    let k = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"]
        .iter()
        .any(|w| k.contains(w))
}

/// The environment's variables whose names say they hold a secret (values
/// of 8 characters or more).
pub fn secret_looking_env() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, v)| v.len() >= 8 && looks_secret(k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn scrubs_longest_first_and_ignores_short_values() {
        let r = Redactor::new([
            ("A".to_string(), "abcd".to_string()),
            ("B".to_string(), "abcdefgh".to_string()),
            ("C".to_string(), "x".to_string()),
        ]);
        assert_eq!(r.redact("key=abcdefgh x"), "key=[REDACTED:B] x");
        assert_eq!(r.redact("abcd"), "[REDACTED:A]");
    }

    #[test]
    fn url_credentials() {
        let mut r = Redactor::default();
        r.add_url_credentials("HTTPS_PROXY", "http://bob:hunter22@proxy:3128");
        let out = r.redact("via http://bob:hunter22@proxy:3128");
        assert!(!out.contains("hunter22"), "{out}");
        assert!(!out.contains("bob:"), "{out}");
    }

    #[test]
    fn percent_encoded_url_credentials_are_scrubbed_decoded() {
        let mut r = Redactor::default();
        r.add_url_credentials(
            "HTTPS_PROXY",
            "http://corpuser:Pr0xy%40Pass%2Fword9@host:3128",
        );
        assert_eq!(
            r.redact("corpuser:Pr0xy@Pass/word9"),
            "[REDACTED:HTTPS_PROXY_USERINFO]"
        );
        assert_eq!(
            r.redact("password Pr0xy@Pass/word9"),
            "password [REDACTED:HTTPS_PROXY_PASSWORD]"
        );
        // As written, too.
        let out = r.redact("http://corpuser:Pr0xy%40Pass%2Fword9@host:3128");
        assert!(!out.contains("Pr0xy"), "{out}");
        // curl -v: the decoded userinfo in base64.
        let basic = base64::engine::general_purpose::STANDARD.encode("corpuser:Pr0xy@Pass/word9");
        let line = format!("Proxy-Authorization: Basic {basic}");
        let out = r.redact(&line);
        assert!(out.contains("[REDACTED:HTTPS_PROXY_USERINFO]"), "{out}");
        assert!(!out.contains(&basic[..basic.len() - 4]), "{out}");
        // Invalid sequences are kept as they are; bytes that are not UTF-8
        // are read lossily.
        assert_eq!(percent_decode("a%4"), "a%4");
        assert_eq!(percent_decode("%zz%41%2f%"), "%zzA/%");
        assert_eq!(percent_decode("%C3%A9%ff"), "\u{e9}\u{fffd}");
    }

    #[test]
    fn userinfo_runs_to_the_last_at_before_the_first_slash() {
        let url = "https://bob:Pa?ss#w0rdXYZ@example.com/r.git";
        assert_eq!(
            without_userinfo(url).as_deref(),
            Some("https://example.com/r.git")
        );
        let mut r = Redactor::default();
        r.add_url_credentials("PROJECT_URL", url);
        let line = format!("fatal: could not read from {url}");
        let out = r.redact(&line);
        assert!(!out.contains("w0rdXYZ"), "{out}");
        assert_eq!(r.redact("Pa?ss#w0rdXYZ"), "[REDACTED:PROJECT_URL_PASSWORD]");
        // The last `@` of the authority ends the userinfo.
        let url = "https://a@b:c@dXYZ@host:1/x@y";
        assert_eq!(without_userinfo(url).as_deref(), Some("https://host:1/x@y"));
        let mut r = Redactor::default();
        r.add_url_credentials("U", url);
        assert_eq!(r.redact("c@dXYZ"), "[REDACTED:U_PASSWORD]");
        assert_eq!(r.redact("a@b:c@dXYZ"), "[REDACTED:U_USERINFO]");
        // An `@` in the path or after it is not userinfo.
        for url in [
            "https://example.com/p?a=b@c",
            "https://example.com/a@b/c",
            "https://example.com",
            "user@host:repo.git",
        ] {
            assert_eq!(without_userinfo(url), None, "{url}");
            let mut r = Redactor::default();
            r.add_url_credentials("U", url);
            assert!(r.is_empty(), "{url}");
        }
    }

    #[test]
    fn encodings_and_lines_of_a_secret_are_scrubbed() {
        let secret = "tok-\"q\"\\b\nsecond-line-abcdef";
        let r = Redactor::new([("S".to_string(), secret.to_string())]);
        let json = serde_json::to_string(secret).unwrap();
        assert!(!r.redact(&json).contains("second-line-abcdef"));
        assert!(!r.redact(&json).contains(&json[1..json.len() - 1]));
        // A line printed alone.
        assert_eq!(r.redact("> second-line-abcdef"), "> [REDACTED:S]");
        // base64 of a larger text, at every alignment.
        for prefix in ["", "a", "ab", "abc"] {
            let enc = base64::engine::general_purpose::STANDARD
                .encode(format!("{prefix}{secret}!!").as_bytes());
            let core = base64_core(
                &base64::engine::general_purpose::STANDARD_NO_PAD,
                secret.as_bytes(),
                prefix.len() % 3,
            );
            let core = String::from_utf8(core).unwrap();
            assert!(enc.contains(&core), "{enc} {core}");
            assert!(r.redact(&enc).contains("[REDACTED:S]"), "{enc}");
        }
        let hex = hex::encode(secret.as_bytes());
        assert_eq!(r.redact(std::str::from_utf8(&hex).unwrap()), "[REDACTED:S]");
        assert!(r
            .redact(&percent_encode(secret, UNRESERVED))
            .contains("[REDACTED:S]"));
        // The forms the break-in review found missing.
        let s2 = "canary/value*7f3a9q";
        let r2 = Redactor::new([("S".to_string(), s2.to_string())]);
        for form in [
            "canary%2fvalue%2a7f3a9q",
            "canary%2Fvalue*7f3a9q",
            "canary\\/value*7f3a9q",
        ] {
            assert_eq!(r2.redact(form), "[REDACTED:S]", "{form}");
        }
        // Escapes combined (PHP's json_encode), lowercase hex with `+`.
        let s4 = "k9/\u{e9}-secret long-xyz";
        let r4 = Redactor::new([("S".to_string(), s4.to_string())]);
        for form in [
            "k9\\/\\u00e9-secret long-xyz",
            "k9%2f%c3%a9-secret+long-xyz",
        ] {
            assert_eq!(r4.redact(form), "[REDACTED:S]", "{form}");
        }
        // `base64` wraps at 76 columns, wherever the secret falls.
        let long = "L".repeat(70) + "-tail-of-a-long-secret";
        let r3 = Redactor::new([("L".to_string(), long.clone())]);
        for pad in 0..80 {
            let text = format!("{}{long}\n", "p".repeat(pad));
            let enc = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
            let wrapped: Vec<String> = enc
                .as_bytes()
                .chunks(76)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect();
            let wrapped = wrapped.join("\n");
            assert!(
                r3.redact(&wrapped).contains("[REDACTED:L]"),
                "pad {pad}: {wrapped}"
            );
        }
        let mut v = serde_json::json!({"a": [secret], secret: 1});
        r.redact_value(&mut v);
        assert!(!v.to_string().contains("second-line"), "{v}");
    }

    #[test]
    fn streams_hold_back_what_may_start_a_secret() {
        let r = Redactor::new([("K".to_string(), "supersecret".to_string())]);
        let mut s = StreamRedactor::new(r.clone());
        let mut out = Vec::new();
        for piece in ["key=sup", "ers", "ecret and supe", "rsecret", " end"] {
            s.push(piece.as_bytes(), &mut out);
        }
        s.finish(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "key=[REDACTED:K] and [REDACTED:K] end"
        );
        assert_eq!(
            r.redact_fragment("…tail ends with super"),
            "…tail ends with [REDACTED:K]"
        );
        assert_eq!(r.redact_fragment("cret starts"), "[REDACTED:K] starts");
    }

    #[test]
    fn the_scanner_finds_secrets_across_chunks() {
        let r = Redactor::new([("K".to_string(), "needle-in-a-haystack".to_string())]);
        let mut big = vec![b'x'; 256 * 1024 - 5];
        big.extend_from_slice(b"needle-in-a-haystack");
        big.extend(std::iter::repeat_n(b'y', 1000));
        assert_eq!(r.scanner().scan(&big[..]).unwrap().as_deref(), Some("K"));
        assert_eq!(r.scanner().scan(&b"clean"[..]).unwrap(), None);
    }

    /// `text` through a stream redactor, pushed in pieces cut at `cuts`.
    fn streamed(r: Redactor, text: &str, cuts: Vec<usize>) -> String {
        let bytes = text.as_bytes();
        let mut points: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
        points.sort();
        let mut s = StreamRedactor::new(r);
        let mut out = Vec::new();
        let mut last = 0;
        for p in points {
            s.push(&bytes[last..p], &mut out);
            last = p;
        }
        s.push(&bytes[last..], &mut out);
        s.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    proptest! {
        #[test]
        fn secret_never_survives(prefix in ".{0,40}", suffix in ".{0,40}", secret in "[a-zA-Z0-9]{4,24}") {
            let r = Redactor::new([("S".to_string(), secret.clone())]);
            let text = format!("{prefix}{secret}{suffix}");
            let out = r.redact(&text);
            prop_assert!(!out.contains(&secret));
        }

        #[test]
        fn a_stream_cut_anywhere_never_leaks(
            prefix in "[a-z ]{0,30}", suffix in "[a-z ]{0,30}",
            secret in "[A-Z0-9]{6,20}", cuts in proptest::collection::vec(0usize..80, 0..6)
        ) {
            let r = Redactor::new([("S".to_string(), secret.clone())]);
            let text = format!("{prefix}{secret}{suffix}{secret}");
            let out = streamed(r, &text, cuts);
            prop_assert!(!out.contains(&secret), "{}", out);
            prop_assert_eq!(out, format!("{prefix}[REDACTED:S]{suffix}[REDACTED:S]"));
        }

        /// Over a two-letter alphabet secrets overlap, repeat and share
        /// prefixes: the stream, cut anywhere, says exactly what the whole
        /// text redacted says.
        #[test]
        fn a_stream_says_what_the_whole_text_says(
            text in "[ab]{0,60}", s1 in "[ab]{4,9}", s2 in "[ab]{4,12}",
            cuts in proptest::collection::vec(0usize..60, 0..8)
        ) {
            let r = Redactor::new([("S".to_string(), s1), ("T".to_string(), s2)]);
            let out = streamed(r.clone(), &text, cuts);
            prop_assert_eq!(out, r.redact(&text));
        }
    }

    #[test]
    fn output_that_cannot_start_a_secret_is_not_held_back() {
        let r = Redactor::new([("K".to_string(), "supersecret".to_string())]);
        let mut s = StreamRedactor::new(r);
        let mut out = Vec::new();
        s.push(b"step 1 done\n", &mut out);
        assert_eq!(out, b"step 1 done\n", "a plain line waits for more output");
        out.clear();
        s.push(b"then sup", &mut out);
        assert_eq!(out, b"then ", "what may start the secret is held");
    }
}
