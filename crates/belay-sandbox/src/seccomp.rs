//! seccomp profiles belay ships (`seccomp_profile: bundled:NAME`), so that a
//! pipeline can name one without carrying the JSON.

use crate::SandboxError;

/// The prefix of a bundled profile's name.
pub const PREFIX: &str = "bundled:";

const CHROMIUM_USERNS: &str = include_str!("../seccomp/chromium-userns.json");

/// The bundled profiles: (name, JSON text).
pub const BUNDLED: &[(&str, &str)] = &[("chromium-userns", CHROMIUM_USERNS)];

/// What a `seccomp_profile` value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileRef<'a> {
    /// One of [`BUNDLED`]: its name and text.
    Bundled(&'a str, &'static str),
    /// A file (relative to the pipeline file).
    File(&'a str),
}

/// The bundled profiles as a `seccomp_profile` names them, comma-separated.
pub fn bundled_names() -> String {
    BUNDLED
        .iter()
        .map(|(n, _)| format!("{PREFIX}{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Read a `seccomp_profile` value; `Err` names the known bundled profiles.
pub fn parse(value: &str) -> Result<ProfileRef<'_>, SandboxError> {
    match value.strip_prefix(PREFIX) {
        Some(name) => BUNDLED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, text)| ProfileRef::Bundled(n, text))
            .ok_or_else(|| SandboxError::UnknownSeccompProfile {
                name: name.to_string(),
            }),
        None => Ok(ProfileRef::File(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_profile_is_valid_json_that_allows_namespaces_and_denies_mounts() {
        let Ok(ProfileRef::Bundled(_, text)) = parse("bundled:chromium-userns") else {
            panic!("not bundled");
        };
        let v: serde_json::Value = serde_json::from_str(text).expect("json");
        assert_eq!(v["defaultAction"], "SCMP_ACT_ALLOW");
        let denied: Vec<&str> = v["syscalls"][0]["names"]
            .as_array()
            .expect("names")
            .iter()
            .filter_map(|n| n.as_str())
            .collect();
        for s in [
            "mount",
            "bpf",
            "kexec_load",
            "init_module",
            "keyctl",
            "setns",
        ] {
            assert!(denied.contains(&s), "{s} is not denied");
        }
        for s in ["unshare", "clone", "clone3", "chroot"] {
            assert!(!denied.contains(&s), "{s} is denied, Chromium needs it");
        }
    }

    #[test]
    fn an_unknown_bundled_name_lists_the_known_ones() {
        let e = parse("bundled:nope").expect_err("unknown").to_string();
        assert!(
            e.starts_with("unknown bundled seccomp profile `nope`: belay ships ")
                && e.contains("bundled:chromium-userns"),
            "{e}"
        );
        assert!(matches!(
            parse("policy/sc.json"),
            Ok(ProfileRef::File("policy/sc.json"))
        ));
    }
}
