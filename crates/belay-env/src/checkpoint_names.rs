//! Checkpoint naming: the names and labels a build gives its images, and the
//! parsing of those names back into runs (for `belay env gc`, the registry's
//! gc and `--resume-from`).
//!
//! A leaf: it imports nothing of this crate, so that the builder, the
//! registry store and gc all name checkpoints the same way without importing
//! each other.

/// Label on checkpoint images: the base image the run started from.
pub const BASE_LABEL: &str = "belay.base";
/// Label on checkpoint images: success | repaired | clean-replay.
pub const CHECKPOINT_KIND_LABEL: &str = "belay.checkpoint";
/// The `belay.kind` of toolchain checkpoints.
pub const TOOLCHAIN_KIND: &str = "toolchain";

/// `<prefix>:<run>-<NNN>-<block>-<kind>`
pub fn checkpoint_ref(prefix: &str, run: &str, seq: u32, block: &str, kind: &str) -> String {
    format!("{prefix}:{run}-{seq:03}-{block}-{kind}")
}

/// A checkpoint's id in the manifest: `<NNN>-<block>`.
pub fn checkpoint_id(seq: u32, block: &str) -> String {
    format!("{seq:03}-{block}")
}

/// The final image of a run: `<prefix>:<run>-final`.
pub fn final_ref(prefix: &str, run: &str) -> String {
    format!("{prefix}:{run}-final")
}

/// The base image a run built from `--base-dockerfile`: `<prefix>:<run>-base`.
pub fn base_ref(prefix: &str, run: &str) -> String {
    format!("{prefix}:{run}-base")
}

/// The shared name of the toolchain checkpoint of `block` under `key`: one
/// repository for every project (a batch's image prefixes are per project),
/// in the registry of `prefix` when it has one.
pub fn toolchain_ref(prefix: &str, block: &str, key: &str) -> String {
    let repo = match prefix.rsplit_once('/') {
        Some((registry, _)) => format!("{registry}/belay-toolchain"),
        None => "belay-toolchain".to_string(),
    };
    format!("{repo}:{block}-{}", &key[..key.len().min(24)])
}

/// Parse `<run-id>-<NNN>-<block-id>-<success|repaired|clean-replay>` from a
/// checkpoint tag: returns (run id, NNN, block id).
pub fn parse_checkpoint_tag(tag: &str) -> Option<(String, u32, String)> {
    let rest = ["-success", "-repaired", "-clean-replay"]
        .iter()
        .find_map(|s| tag.strip_suffix(s))?;
    // Run ids may contain "-NNN-" too; planned block ids never do, so the
    // rightmost "-NNN-" is the sequence number.
    let bytes = rest.as_bytes();
    for i in (0..rest.len()).rev() {
        if bytes[i] == b'-'
            && i + 5 <= rest.len()
            && bytes[i + 1..i + 4].iter().all(|b| b.is_ascii_digit())
            && bytes.get(i + 4) == Some(&b'-')
        {
            let n = rest[i + 1..i + 4].parse().ok()?;
            return Some((rest[..i].to_string(), n, rest[i + 5..].to_string()));
        }
    }
    None
}

/// The run a tag belongs to, and whether it is a final image.
pub fn run_of_tag(tag: &str) -> Option<(String, bool)> {
    let t = tag.rsplit_once(':').map(|(_, t)| t).unwrap_or(tag);
    if let Some(run) = t.strip_suffix("-final") {
        return Some((run.to_string(), true));
    }
    if let Some(run) = t.strip_suffix("-base") {
        return Some((run.to_string(), false));
    }
    parse_checkpoint_tag(t).map(|(run, _, _)| (run, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checkpoint_tags() {
        assert_eq!(
            parse_checkpoint_tag("myrun-1-003-30-python-deps-success"),
            Some(("myrun-1".into(), 3, "30-python-deps".into()))
        );
        assert_eq!(
            parse_checkpoint_tag("r-000-workspace-success"),
            Some(("r".into(), 0, "workspace".into()))
        );
        assert_eq!(
            parse_checkpoint_tag("r-20261129-104400-ab12-002-10-system-packages-repaired"),
            Some((
                "r-20261129-104400-ab12".into(),
                2,
                "10-system-packages".into()
            ))
        );
        assert_eq!(
            parse_checkpoint_tag("run-123-x-006-50-test-tooling-clean-replay"),
            Some(("run-123-x".into(), 6, "50-test-tooling".into()))
        );
        assert_eq!(parse_checkpoint_tag("r-final"), None);
        assert_eq!(parse_checkpoint_tag("latest"), None);
    }

    #[test]
    fn tags_to_runs() {
        assert_eq!(
            run_of_tag("belay:r1-003-30-python-deps-success"),
            Some(("r1".into(), false))
        );
        assert_eq!(run_of_tag("belay:r1-final"), Some(("r1".into(), true)));
        assert_eq!(run_of_tag("belay:r1-base"), Some(("r1".into(), false)));
        assert_eq!(run_of_tag("belay-base:bookworm"), None);
        assert_eq!(run_of_tag("debian:latest"), None);
    }

    #[test]
    fn names_round_trip() {
        let r = checkpoint_ref("reg:5000/belay", "r-1", 7, "30-python-deps", "repaired");
        assert_eq!(r, "reg:5000/belay:r-1-007-30-python-deps-repaired");
        assert_eq!(run_of_tag(&r), Some(("r-1".into(), false)));
        assert_eq!(
            run_of_tag(&final_ref("belay", "r-1")),
            Some(("r-1".into(), true))
        );
        assert_eq!(
            run_of_tag(&base_ref("belay", "r-1")),
            Some(("r-1".into(), false))
        );
        assert_eq!(checkpoint_id(0, "workspace"), "000-workspace");
        assert_eq!(
            toolchain_ref("reg:5000/belay", "10-system", "abcdef"),
            "reg:5000/belay-toolchain:10-system-abcdef"
        );
        assert_eq!(
            toolchain_ref("belay", "10-system", &"k".repeat(40)),
            format!("belay-toolchain:10-system-{}", "k".repeat(24))
        );
    }
}
