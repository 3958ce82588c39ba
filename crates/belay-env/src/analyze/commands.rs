//! The project's own build, test and lint commands, as a developer would
//! type them in the env builder's image (where `python3` is the project's
//! interpreter and `node_modules/.bin` is on `PATH`): what `belay plan init`
//! puts in a plan's `project` so that its gate runs the project's checks.

use serde::Serialize;

use super::{Language, RepoContext};

/// Commands of the primary language; `None` where the analysis found none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProjectCommands {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_cmd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_cmd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lint_cmd: Option<String>,
}

impl ProjectCommands {
    pub fn is_empty(&self) -> bool {
        self.build_cmd.is_none() && self.test_cmd.is_none() && self.lint_cmd.is_none()
    }
}

fn some(s: &str) -> Option<String> {
    Some(s.to_string())
}

/// The commands of `ctx`'s primary language.
pub fn project_commands(ctx: &RepoContext) -> ProjectCommands {
    match ctx.languages.first() {
        Some(Language::Python) => {
            let test_cmd = if ctx.test_frameworks.iter().any(|f| f == "pytest") {
                some("python3 -m pytest -q")
            } else {
                some("python3 -m unittest discover -q")
            };
            ProjectCommands {
                build_cmd: None,
                test_cmd,
                lint_cmd: None,
            }
        }
        Some(Language::Node) => {
            let pm = ctx
                .node
                .as_ref()
                .map(|n| n.package_manager.as_str())
                .filter(|p| !p.is_empty())
                .unwrap_or("npm");
            let test = ctx.node.as_ref().and_then(|n| n.test_script.as_ref());
            ProjectCommands {
                build_cmd: None,
                test_cmd: test.map(|_| format!("{pm} test")),
                lint_cmd: None,
            }
        }
        Some(Language::Rust) => ProjectCommands {
            build_cmd: some("cargo build --offline --all-targets"),
            test_cmd: some("cargo test --offline"),
            lint_cmd: None,
        },
        Some(Language::Go) => ProjectCommands {
            build_cmd: some("go build ./..."),
            test_cmd: some("go test ./..."),
            lint_cmd: some("go vet ./..."),
        },
        Some(Language::Java) => {
            let j = ctx.java.clone().unwrap_or_default();
            let test = match (j.build_tool.as_str(), j.wrapper) {
                ("gradle", true) => "./gradlew test --offline",
                ("gradle", false) => "gradle test --offline",
                (_, true) => "./mvnw -o -q test",
                _ => "mvn -o -q test",
            };
            ProjectCommands {
                build_cmd: None,
                test_cmd: some(test),
                lint_cmd: None,
            }
        }
        None => ProjectCommands::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::NodeFacts;

    #[test]
    fn commands_per_language() {
        let py = RepoContext {
            languages: vec![Language::Python],
            test_frameworks: vec!["pytest".into()],
            ..Default::default()
        };
        assert_eq!(
            project_commands(&py).test_cmd.as_deref(),
            Some("python3 -m pytest -q")
        );
        let node = RepoContext {
            languages: vec![Language::Node],
            node: Some(NodeFacts {
                package_manager: "pnpm".into(),
                test_script: Some("vitest run".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = project_commands(&node);
        assert_eq!(c.test_cmd.as_deref(), Some("pnpm test"));
        let none = RepoContext::default();
        assert!(project_commands(&none).is_empty());
    }
}
