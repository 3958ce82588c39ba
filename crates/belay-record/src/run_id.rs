//! Run ids double as Docker tag components, so they use the tag alphabet.

use crate::RecordError;

/// Longest run id: a checkpoint tag is `<run-id>-NNN-<block-id>-clean-replay`
/// and Docker tags stop at 128 characters.
pub const MAX_LEN: usize = 64;

/// Validate a user-supplied run id.
pub fn validate(id: &str) -> Result<(), RecordError> {
    let bad = |reason| {
        Err(RecordError::InvalidRunId {
            id: id.to_string(),
            reason,
        })
    };
    if id.is_empty() {
        return bad("it is empty");
    }
    if id.len() > MAX_LEN {
        return bad("it is longer than 64 characters");
    }
    if !id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
        return bad("it must start with a letter or digit");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return bad("only letters, digits, '-', '_' and '.' are allowed");
    }
    Ok(())
}

/// Turn an arbitrary name (a repository directory, say) into a run id prefix.
pub fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    out = out
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    out.truncate(32);
    if out.is_empty() {
        out.push_str("run");
    }
    out
}

/// A fresh run id: `<prefix>-<YYYYmmdd-HHMMSS>-<4 hex>`.
pub fn generate(prefix: &str) -> String {
    let now = jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::UTC);
    let nanos = now.timestamp().subsec_nanosecond() as u32;
    let salt = (nanos ^ std::process::id().rotate_left(16)) & 0xffff;
    format!(
        "{}-{}-{salt:04x}",
        sanitize(prefix),
        now.strftime("%Y%m%d-%H%M%S")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn generated_ids_are_valid() {
        let id = generate("My Repo!");
        validate(&id).unwrap();
        assert!(id.starts_with("my-repo-"), "{id}");
    }

    #[test]
    fn rejects_bad_ids() {
        assert!(validate("").is_err());
        assert!(validate("-x").is_err());
        assert!(validate("a/b").is_err());
        assert!(validate(&"a".repeat(65)).is_err());
        validate("run-1.2_x").unwrap();
    }

    proptest! {
        #[test]
        fn sanitize_always_gives_a_valid_prefix(name in ".{0,80}") {
            let s = sanitize(&name);
            prop_assert!(validate(&s).is_ok(), "{s:?}");
        }
    }
}
