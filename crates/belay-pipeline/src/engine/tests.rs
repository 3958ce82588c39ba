#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn missing_dependency_pins_are_read() {
    assert_eq!(
        missing_deps(
            "done.\n## Missing dependencies\n- requests==2.32.3\nflask==3.0\n\n## Notes\nx"
        ),
        vec!["requests==2.32.3", "flask==3.0"]
    );
    assert!(missing_deps("## Missing dependencies\nnone\n").is_empty());
    assert!(missing_deps("all good").is_empty());
}

#[test]
fn memory_sizes() {
    assert_eq!(parse_memory("2g"), Some(2 << 30));
    assert_eq!(parse_memory("512m"), Some(512 << 20));
    assert_eq!(parse_memory("x"), None);
}
