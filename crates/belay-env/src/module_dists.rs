//! Python import names -> the distribution that provides them, from
//! `data/module-dists.tsv`. The table is data, built from the metadata
//! (`top_level.txt`, `RECORD`) of the most used wheels by
//! `scripts/gen-module-dists.py`; regenerate it there rather than editing it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

const TABLE: &str = include_str!("../data/module-dists.tsv");

fn table() -> &'static BTreeMap<&'static str, &'static str> {
    static T: OnceLock<BTreeMap<&'static str, &'static str>> = OnceLock::new();
    T.get_or_init(|| {
        TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.split_once('\t'))
            .map(|(m, d)| (m.trim(), d.trim()))
            .collect()
    })
}

/// The distribution that provides `module` (`xdist` -> `pytest-xdist`,
/// `google.protobuf.message` -> `protobuf`), when it is not the module's own
/// name. Dotted names are looked up from the longest prefix down.
pub fn distribution(module: &str) -> Option<&'static str> {
    let t = table();
    let mut name = module;
    loop {
        if let Some(d) = t.get(name) {
            return Some(d);
        }
        name = name.rsplit_once('.')?.0;
    }
}

/// The distribution for a missing namespace package (`No module named
/// 'google'`), from the dotted import the failure's traceback shows
/// (`from google.protobuf import …`).
pub fn distribution_in_text(module: &str, text: &str) -> Option<&'static str> {
    if let Some(d) = distribution(module) {
        return Some(d);
    }
    let prefix = format!("{module}.");
    if !table().keys().any(|k| k.starts_with(&prefix)) {
        return None;
    }
    let mut rest = text;
    while let Some(i) = rest.find(&prefix) {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(tail.len());
        let dotted = tail[..end].trim_end_matches('.');
        let at_word_start = i == 0
            || !rest[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        if at_word_start && dotted.len() > prefix.len() {
            if let Some(d) = distribution(dotted) {
                return Some(d);
            }
        }
        rest = &tail[end.max(1)..];
    }
    None
}

/// Whether `module` is a namespace that several distributions share
/// (`google`, `azure`): its own name is never the distribution to install.
pub fn is_namespace(module: &str) -> bool {
    let prefix = format!("{module}.");
    distribution(module).is_none() && table().keys().any(|k| k.starts_with(&prefix))
}

/// The distribution to install for a missing `module`: the table's, or the
/// module's own name (`_` -> `-`).
pub fn distribution_or_own(module: &str) -> String {
    distribution(module)
        .map(String::from)
        .unwrap_or_else(|| module.split('.').next().unwrap_or(module).replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_import_names_map_to_their_distributions() {
        for (m, d) in [
            ("xdist", "pytest-xdist"),
            ("yaml", "PyYAML"),
            ("cv2", "opencv-python-headless"),
            ("sklearn", "scikit-learn"),
            ("dateutil", "python-dateutil"),
            ("attr", "attrs"),
        ] {
            assert_eq!(distribution(m), Some(d), "{m}");
        }
        assert!(distribution("PIL").is_some_and(|d| d.eq_ignore_ascii_case("pillow")));
        assert_eq!(distribution("google.protobuf.message"), Some("protobuf"));
        assert_eq!(distribution("requests"), None);
        assert_eq!(distribution_or_own("pytest_cov"), "pytest-cov");
        assert_eq!(
            distribution_or_own("typing_extensions"),
            "typing-extensions"
        );
        assert_eq!(distribution_or_own("xdist.plugin"), "pytest-xdist");
        let tb = "tests/test_p.py:1: in <module>\n    from google.protobuf import descriptor\nE   ModuleNotFoundError: No module named 'google'";
        assert_eq!(distribution_in_text("google", tb), Some("protobuf"));
        assert_eq!(
            distribution_in_text("google", "No module named 'google'"),
            None
        );
        assert!(is_namespace("google") && !is_namespace("yaml") && !is_namespace("requests"));
    }

    #[test]
    fn the_table_is_well_formed() {
        let rows: Vec<&str> = TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .collect();
        assert!(rows.len() > 100, "{} rows", rows.len());
        for r in rows {
            let (m, d) = r
                .split_once('\t')
                .unwrap_or_else(|| panic!("no tab: {r:?}"));
            assert!(!m.is_empty() && !d.is_empty() && !d.contains(' '), "{r:?}");
        }
    }
}
