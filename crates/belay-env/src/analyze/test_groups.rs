//! The test requirements a `pyproject.toml` declares outside the project's
//! metadata: PEP 735 `[dependency-groups]`, PDM's
//! `[tool.pdm.dev-dependencies]` and uv's `[tool.uv] dev-dependencies`.
//! Neither pip nor `-e .[test]` installs them, and a suite that needs them
//! fails at collection in ways no repair names: cattrs's tests subclass a
//! `typing_extensions` class that its `_compat` sets to `None` when the module
//! is missing ("NoneType takes no arguments").

use serde::{Deserialize, Serialize};

use super::{normalise_name as normalise, requirement_name};

/// Group names that hold what the tests need, normalised as PEP 735 does.
const TEST_GROUPS: [&str; 3] = ["test", "tests", "testing"];
/// Taken only when no test group exists: "dev" often holds the tests' needs.
const DEV_GROUP: &str = "dev";
/// At most this many groups are expanded for one project.
const MAX_GROUPS: usize = 64;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TestGroups {
    /// Where the requirements were read: `[dependency-groups] test`.
    pub source: String,
    /// PEP 508 requirements, in file order, without the project itself.
    pub requirements: Vec<String>,
    /// Extras of the project itself the groups ask for (`pdm[pytest]`):
    /// installed as `.[pytest]`, since the index's release is not the checkout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_extras: Vec<String>,
}

/// The test groups of a parsed `pyproject.toml`, if it declares any. `own`
/// is the project's normalised distribution name.
pub fn read(t: &toml::Table, own: Option<&str>) -> Option<TestGroups> {
    let tool = t.get("tool").and_then(|x| x.as_table());
    let tables = [
        ("[dependency-groups]", t.get("dependency-groups")),
        (
            "[tool.pdm.dev-dependencies]",
            tool.and_then(|x| x.get("pdm"))
                .and_then(|x| x.get("dev-dependencies")),
        ),
    ];
    for (label, table) in tables {
        let Some(groups) = table.and_then(|g| g.as_table()) else {
            continue;
        };
        let mut names: Vec<&String> = groups
            .keys()
            .filter(|k| TEST_GROUPS.contains(&normalise(k).as_str()))
            .collect();
        if names.is_empty() {
            names = groups
                .keys()
                .filter(|k| normalise(k) == DEV_GROUP)
                .collect();
        }
        if names.is_empty() {
            continue;
        }
        let mut out = TestGroups {
            source: format!(
                "{label} {}",
                names
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ..TestGroups::default()
        };
        let mut seen = std::collections::BTreeSet::new();
        for n in names {
            collect(groups, n, own, &mut out, &mut seen);
        }
        return (!out.requirements.is_empty() || !out.own_extras.is_empty()).then_some(out);
    }
    // uv's older form: one list, the "dev" group.
    let uv = tool
        .and_then(|x| x.get("uv"))
        .and_then(|x| x.get("dev-dependencies"))
        .and_then(|x| x.as_array())?;
    let mut out = TestGroups {
        source: "[tool.uv] dev-dependencies".to_string(),
        ..TestGroups::default()
    };
    for item in uv {
        if let Some(req) = item.as_str() {
            push(req, own, &mut out);
        }
    }
    (!out.requirements.is_empty() || !out.own_extras.is_empty()).then_some(out)
}

/// One group's requirements, its includes followed once each: a cycle (an
/// error in PEP 735) or a group included many times adds nothing twice.
fn collect(
    groups: &toml::Table,
    name: &str,
    own: Option<&str>,
    out: &mut TestGroups,
    seen: &mut std::collections::BTreeSet<String>,
) {
    if seen.len() >= MAX_GROUPS || !seen.insert(normalise(name)) {
        return;
    }
    // PEP 735 compares names normalised: `include-group = "Type_Stubs"`.
    let Some(items) = groups
        .iter()
        .find(|(k, _)| normalise(k) == normalise(name))
        .and_then(|(_, v)| v.as_array())
    else {
        return;
    };
    for item in items {
        if let Some(req) = item.as_str() {
            push(req, own, out);
        } else if let Some(inc) = item.get("include-group").and_then(|g| g.as_str()) {
            collect(groups, inc, own, out, seen);
        }
    }
}

fn push(req: &str, own: Option<&str>, out: &mut TestGroups) {
    let req = req.trim();
    // PDM's `-e file:///${PROJECT_ROOT}/…` and other installer options, a
    // variable only PDM expands, and control characters: not a requirement
    // the installer can take as one argument.
    if req.contains("${") || req.chars().any(char::is_control) || req.len() > 500 {
        return;
    }
    let Some(name) = requirement_name(req) else {
        return;
    };
    if own.is_some_and(|o| normalise(o) == normalise(&name)) {
        if let Some(extras) = req
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(e, _)| e)
        {
            for e in extras.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                if !out.own_extras.iter().any(|x| x == e) {
                    out.own_extras.push(e.to_string());
                }
            }
        }
        return;
    }
    if !out.requirements.iter().any(|r| r == req) {
        out.requirements.push(req.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(text: &str, own: Option<&str>) -> Option<TestGroups> {
        read(&text.parse::<toml::Table>().unwrap(), own)
    }

    #[test]
    fn pdm_test_group_of_cattrs() {
        let g = groups(
            "[tool.pdm.dev-dependencies]\nlint = [\"black>=23.3.0\"]\ntest = [\"hypothesis>=6.79.4\", \"typing-extensions>=4.7.1\", \"-e file:///${PROJECT_ROOT}/x\"]\n",
            Some("cattrs"),
        )
        .unwrap();
        assert_eq!(g.source, "[tool.pdm.dev-dependencies] test");
        assert_eq!(
            g.requirements,
            ["hypothesis>=6.79.4", "typing-extensions>=4.7.1"]
        );
    }

    #[test]
    fn pep735_includes_resolve_and_the_project_itself_becomes_extras() {
        let g = groups(
            "[dependency-groups]\nTests = [\"pytest>=8\", {include-group = \"Type_Stubs\"}, \"pdm[pytest, keyring]\"]\ntype-stubs = [\"types-requests\", {include-group = \"tests\"}]\ndocs = [\"sphinx\"]\n",
            Some("pdm"),
        )
        .unwrap();
        assert_eq!(g.source, "[dependency-groups] Tests");
        // The cycle back to "tests" adds nothing twice, and docs is not taken.
        assert_eq!(g.requirements, ["pytest>=8", "types-requests"]);
        assert_eq!(g.own_extras, ["pytest", "keyring"]);
    }

    #[test]
    fn dev_only_without_a_test_group_and_uv_dev_dependencies() {
        let g = groups(
            "[dependency-groups]\ndev = [\"pytest\"]\nlint = [\"ruff\"]\n",
            None,
        )
        .unwrap();
        assert_eq!(g.requirements, ["pytest"]);
        let g = groups(
            "[dependency-groups]\ndev = [\"mypy\"]\ntest = [\"pytest\"]\n",
            None,
        )
        .unwrap();
        assert_eq!(g.requirements, ["pytest"]);
        let g = groups(
            "[tool.uv]\ndev-dependencies = [\"pytest-asyncio>=0.23\"]\n",
            None,
        )
        .unwrap();
        assert_eq!(g.source, "[tool.uv] dev-dependencies");
        assert_eq!(g.requirements, ["pytest-asyncio>=0.23"]);
        assert!(groups("[dependency-groups]\nlint = [\"ruff\"]\n", None).is_none());
        // A group included many times, in a cycle, is expanded once.
        let many = format!(
            "[dependency-groups]\ntest = [\"pytest\", {}]\n",
            vec!["{include-group = \"test\"}"; 40].join(", ")
        );
        assert_eq!(groups(&many, None).unwrap().requirements, ["pytest"]);
        let g = groups(
            "[tool.pdm.dev-dependencies]\ntest = [\"sub @ file:///${PROJECT_ROOT}/sub\", \"a\\nb\", \"mock\"]\n",
            None,
        )
        .unwrap();
        assert_eq!(g.requirements, ["mock"]);
        assert!(groups("[project]\nname = \"x\"\n", None).is_none());
    }
}
