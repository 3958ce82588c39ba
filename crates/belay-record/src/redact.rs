use std::borrow::Cow;

/// Replaces secret values with `[REDACTED:<name>]`.
///
/// Values shorter than [`Redactor::MIN_LEN`] are ignored: scrubbing "1" or "on"
/// would mangle every log without protecting anything.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<(String, String)>,
}

impl Redactor {
    pub const MIN_LEN: usize = 4;

    pub fn new(secrets: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut r = Self::default();
        for (name, value) in secrets {
            r.add(name, value);
        }
        r
    }

    /// Register a secret. Longer values are matched first, so a secret that
    /// contains another is scrubbed whole.
    pub fn add(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let value = value.into();
        if value.len() < Self::MIN_LEN || self.secrets.iter().any(|(_, v)| *v == value) {
            return;
        }
        self.secrets.push((name.into(), value));
        self.secrets.sort_by_key(|s| std::cmp::Reverse(s.1.len()));
    }

    /// Register the credentials embedded in a URL (`scheme://user:password@host`),
    /// as found in proxy settings.
    pub fn add_url_credentials(&mut self, name: &str, url: &str) {
        let Some(rest) = url.split_once("://").map(|(_, r)| r) else {
            return;
        };
        let Some((userinfo, _)) = rest.split_once('@') else {
            return;
        };
        if let Some((_, password)) = userinfo.split_once(':') {
            self.add(format!("{name}_PASSWORD"), password);
        }
        self.add(format!("{name}_USERINFO"), userinfo);
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (name, value) in &self.secrets {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), &format!("[REDACTED:{name}]")));
            }
        }
        out
    }
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

    proptest! {
        #[test]
        fn secret_never_survives(prefix in ".{0,40}", suffix in ".{0,40}", secret in "[a-zA-Z0-9]{4,24}") {
            let r = Redactor::new([("S".to_string(), secret.clone())]);
            let text = format!("{prefix}{secret}{suffix}");
            let out = r.redact(&text);
            prop_assert!(!out.contains(&secret));
        }
    }
}
