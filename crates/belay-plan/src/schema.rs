//! The plan file, `plan_checkpoints.json` (FORMATS.md §5), with the peer's
//! rules: required fields, unique ids, non-empty exit criteria, known
//! statuses, and no protected branch. Every error names `file:line:col`.
//!
//! The file is kept as JSON values too ([`Plan::raw`]): fields belay does not
//! know are carried through every rewrite untouched.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::PlanError;

/// The plan file's default name.
pub const DEFAULT_PLAN: &str = "plan_checkpoints.json";

/// The largest plan file belay reads.
pub const MAX_PLAN_BYTES: u64 = 16 << 20;

/// Branches the loop never works on.
pub const PROTECTED: &[&str] = &["main", "master"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Built,
    Approved,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Built => "built",
            Status::Approved => "approved",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "pending" => Some(Status::Pending),
            "built" => Some(Status::Built),
            "approved" => Some(Status::Approved),
            _ => None,
        }
    }
}

/// The project's own commands (a checkpoint may override each).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Commands {
    pub build_cmd: Option<String>,
    pub test_cmd: Option<String>,
    pub lint_cmd: Option<String>,
}

impl Commands {
    /// `(name, command)` in the order belay runs them.
    pub fn list(&self) -> Vec<(&'static str, &str)> {
        [
            ("build", &self.build_cmd),
            ("test", &self.test_cmd),
            ("lint", &self.lint_cmd),
        ]
        .into_iter()
        .filter_map(|(n, c)| c.as_deref().map(|c| (n, c)))
        .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Checkpoint {
    pub id: String,
    pub name: String,
    pub scope: String,
    pub status: Status,
    pub exit_criteria: Vec<String>,
    pub attempts: u32,
    pub review_notes: String,
    pub commands: Commands,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub plan_file: String,
    pub branch: String,
    pub project: Commands,
    pub verify_in_review: bool,
    pub developer_model: Option<String>,
    pub reviewer_model: Option<String>,
    pub checkpoints: Vec<Checkpoint>,
    /// The file as JSON, unknown fields included.
    pub raw: Value,
}

impl Plan {
    pub fn get(&self, id: &str) -> Option<&Checkpoint> {
        self.checkpoints.iter().find(|c| c.id == id)
    }

    /// Whether any checkpoint has a build, test or lint command (its own or
    /// the project's): a gate runs in a container.
    pub fn has_commands(&self) -> bool {
        self.checkpoints
            .iter()
            .any(|c| !self.commands_for(&c.id).list().is_empty())
    }

    /// The commands of checkpoint `id`: its own, else the project's.
    pub fn commands_for(&self, id: &str) -> Commands {
        let own = self.get(id).map(|c| c.commands.clone()).unwrap_or_default();
        Commands {
            build_cmd: own.build_cmd.or_else(|| self.project.build_cmd.clone()),
            test_cmd: own.test_cmd.or_else(|| self.project.test_cmd.clone()),
            lint_cmd: own.lint_cmd.or_else(|| self.project.lint_cmd.clone()),
        }
    }

    /// The file's text with each checkpoint's `status`, `attempts` and
    /// `review_notes` set from `view` (every other field as it was).
    pub fn render(&self, view: &[(String, Status, u32, String)]) -> String {
        let mut raw = self.raw.clone();
        if let Some(cps) = raw.get_mut("checkpoints").and_then(Value::as_array_mut) {
            for cp in cps.iter_mut() {
                let Some(id) = cp.get("id").and_then(Value::as_str).map(String::from) else {
                    continue;
                };
                if let (Some((_, st, at, notes)), Some(obj)) =
                    (view.iter().find(|v| v.0 == id), cp.as_object_mut())
                {
                    obj.insert("status".into(), Value::String(st.as_str().into()));
                    obj.insert("attempts".into(), Value::from(*at));
                    obj.insert("review_notes".into(), Value::String(notes.clone()));
                }
            }
        }
        let mut text = serde_json::to_string_pretty(&raw).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// Whether `branch` is one the loop refuses.
pub fn is_protected(branch: &str) -> bool {
    let b = branch.strip_prefix("refs/heads/").unwrap_or(branch);
    PROTECTED.contains(&b)
}

/// Why `branch` cannot be the loop's branch, if it cannot.
pub fn branch_problem(branch: &str) -> Option<String> {
    if branch.trim().is_empty() {
        return Some("the branch is empty".into());
    }
    if branch.starts_with("refs/") {
        return Some(format!(
            "give the branch as a name (`{}`), not a ref",
            branch.strip_prefix("refs/heads/").unwrap_or(branch)
        ));
    }
    if is_protected(branch) {
        return Some(format!(
            "the branch `{branch}` is protected: the loop never works on main or master. Name a feature branch (feature/…)"
        ));
    }
    let bad = branch == "@"
        || branch == "HEAD"
        || branch.starts_with('-')
        || branch.starts_with('/')
        || branch.ends_with('/')
        || branch.ends_with(".lock")
        || branch.contains("..")
        || branch.contains("//")
        || branch.contains("@{")
        || branch
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c));
    bad.then(|| format!("`{branch}` is not a valid git branch name"))
}

/// Why `id` cannot be a checkpoint id, if it cannot. Ids start commit
/// messages and name log files, and the plan file is agent-writable: the one
/// validator of ids from outside (`belay_record::ids`), at most 64.
pub fn id_problem(id: &str) -> Option<String> {
    let ok = id.len() <= 64 && belay_record::ids::is_valid(id);
    (!ok).then(|| {
        format!(
            "checkpoint id `{}` is not allowed: use letters, digits, `.`, `_` and `-`, starting with a letter or digit, no `..`, at most 64",
            id.chars().take(80).collect::<String>()
        )
    })
}

/// Parse and validate the plan file at `path` (as the user gave it).
pub fn load(path: &Path) -> Result<Plan, PlanError> {
    let bytes = read_file(path)?;
    parse_bytes(path, &bytes)
}

/// The plan file at `path`, as the user gave it: read like any file an
/// agent could have written (the plan lives in the work tree). Under the
/// current directory no name on the way is a link; outside it, the file's own
/// name is never followed. Only a regular file is read, non-blocking (a fifo
/// or a device is refused at once), at most [`MAX_PLAN_BYTES`].
pub fn read_file(path: &Path) -> Result<Vec<u8>, PlanError> {
    let cwd = std::env::current_dir().map_err(|e| PlanError::io("resolve", ".", e))?;
    let abs = lexical(&cwd.join(path));
    let read = belay_sandbox::hostfs::read_under(&cwd, &abs, MAX_PLAN_BYTES + 1);
    checked(path, read)
}

/// `path` with `.` and `..` taken by name (`a/b/../c` is `a/c`), never by
/// following anything on disk.
pub fn lexical(path: &Path) -> std::path::PathBuf {
    let mut out = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c.as_os_str()),
        }
    }
    out
}

/// The plan file `rel` of the work tree at `root` (`shown` in messages): no
/// link at any level below the root, a regular file only, non-blocking, at
/// most [`MAX_PLAN_BYTES`].
pub fn read_in_tree(root: &Path, rel: &str, shown: &Path) -> Result<Vec<u8>, PlanError> {
    let read = belay_sandbox::hostfs::read(root, rel, MAX_PLAN_BYTES + 1);
    checked(shown, read)
}

fn checked(
    path: &Path,
    read: Result<Option<Vec<u8>>, belay_sandbox::hostfs::HostFsError>,
) -> Result<Vec<u8>, PlanError> {
    match read {
        Ok(Some(b)) if b.len() as u64 > MAX_PLAN_BYTES => Err(PlanError::Usage(format!(
            "the plan {} is more than {MAX_PLAN_BYTES} bytes: a plan file is at most 16 MiB",
            path.display()
        ))),
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(PlanError::Usage(format!(
            "cannot read the plan {}: there is no such file (create one with `belay plan init`, or pass --state)",
            path.display()
        ))),
        Err(e) => Err(PlanError::Usage(format!(
            "cannot read the plan {}: {e}",
            path.display()
        ))),
    }
}

/// Parse and validate the plan file's bytes (named `path` in errors).
pub fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<Plan, PlanError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        PlanError::Usage(format!(
            "cannot read the plan {}: it is not UTF-8 text ({e})",
            path.display()
        ))
    })?;
    parse(path, text)
}

/// Parse and validate plan `text` (named `path` in errors).
pub fn parse(path: &Path, text: &str) -> Result<Plan, PlanError> {
    // A byte order mark is not JSON, but editors write one.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let raw: Value = serde_json::from_str(text).map_err(|e| PlanError::Invalid {
        path: path.to_path_buf(),
        line: e.line().max(1),
        col: e.column().max(1),
        message: format!("not valid JSON: {e}"),
    })?;
    validate(&raw).map_err(|(at, message)| {
        let (line, col) = locate(text, &at);
        PlanError::Invalid {
            path: path.to_path_buf(),
            line,
            col,
            message,
        }
    })
}

pub use crate::locate::{locate, Seg};

type Fail = (Vec<Seg>, String);

fn key(path: &[Seg], k: &str) -> Vec<Seg> {
    let mut p = path.to_vec();
    p.push(Seg::Key(k.into()));
    p
}

fn req_str(
    obj: &serde_json::Map<String, Value>,
    at: &[Seg],
    k: &str,
    non_empty: bool,
) -> Result<String, Fail> {
    match obj.get(k) {
        None => Err((at.to_vec(), format!("`{k}` is required"))),
        Some(Value::String(s)) if non_empty && s.trim().is_empty() => {
            Err((key(at, k), format!("`{k}` must not be empty")))
        }
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err((key(at, k), format!("`{k}` must be a string"))),
    }
}

fn opt_str(
    obj: &serde_json::Map<String, Value>,
    at: &[Seg],
    k: &str,
) -> Result<Option<String>, Fail> {
    match obj.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err((
            key(at, k),
            format!("`{k}` must be a string (a shell command)"),
        )),
    }
}

fn commands(obj: &serde_json::Map<String, Value>, at: &[Seg]) -> Result<Commands, Fail> {
    Ok(Commands {
        build_cmd: opt_str(obj, at, "build_cmd")?,
        test_cmd: opt_str(obj, at, "test_cmd")?,
        lint_cmd: opt_str(obj, at, "lint_cmd")?,
    })
}

/// The rules, on a parsed document; a failure says where (a JSON path) and why.
pub fn validate(raw: &Value) -> Result<Plan, Fail> {
    let root: Vec<Seg> = vec![];
    let Some(top) = raw.as_object() else {
        return Err((root, "the plan must be a JSON object".into()));
    };
    let plan_file = req_str(top, &root, "plan_file", true)?;
    let branch = req_str(top, &root, "branch", true)?;
    if let Some(why) = branch_problem(&branch) {
        return Err((key(&root, "branch"), why));
    }
    let (project, verify_in_review) = project(top, &root)?;
    let (developer_model, reviewer_model) = models(top, &root)?;
    let cps = match top.get("checkpoints") {
        None => return Err((root, "`checkpoints` is required".into())),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err((
                key(&root, "checkpoints"),
                "`checkpoints` must list at least one checkpoint".into(),
            ))
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err((
                key(&root, "checkpoints"),
                "`checkpoints` must be a list".into(),
            ))
        }
    };
    let mut seen = BTreeSet::new();
    let mut checkpoints = Vec::new();
    for (i, cp) in cps.iter().enumerate() {
        checkpoints.push(checkpoint(&root, i, cp, &mut seen)?);
    }
    Ok(Plan {
        plan_file,
        branch,
        project,
        verify_in_review,
        developer_model,
        reviewer_model,
        checkpoints,
        raw: raw.clone(),
    })
}

/// The `project` object: its commands and `verify_in_review`.
fn project(top: &serde_json::Map<String, Value>, root: &[Seg]) -> Result<(Commands, bool), Fail> {
    Ok(match top.get("project") {
        None | Some(Value::Null) => (Commands::default(), false),
        Some(Value::Object(p)) => {
            let at = key(root, "project");
            let verify = match p.get("verify_in_review") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err((
                        key(&at, "verify_in_review"),
                        "`verify_in_review` must be true or false".into(),
                    ))
                }
            };
            (commands(p, &at)?, verify)
        }
        Some(_) => return Err((key(root, "project"), "`project` must be an object".into())),
    })
}

/// The `models` object: (developer, reviewer).
fn models(
    top: &serde_json::Map<String, Value>,
    root: &[Seg],
) -> Result<(Option<String>, Option<String>), Fail> {
    Ok(match top.get("models") {
        None | Some(Value::Null) => (None, None),
        Some(Value::Object(m)) => {
            let at = key(root, "models");
            for k in m.keys() {
                if k != "developer" && k != "reviewer" {
                    return Err((
                        key(&at, k),
                        format!("`models` takes only `developer` and `reviewer`, not `{k}`"),
                    ));
                }
            }
            let one = |k: &str| -> Result<Option<String>, Fail> {
                match m.get(k) {
                    None => Ok(None),
                    Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
                    Some(_) => Err((
                        key(&at, k),
                        format!("`models.{k}` must be a non-empty string (a model name)"),
                    )),
                }
            };
            (one("developer")?, one("reviewer")?)
        }
        Some(_) => return Err((key(root, "models"), "`models` must be an object".into())),
    })
}

/// Checkpoint `i` of the list (its id added to `seen`, the ids so far).
fn checkpoint(
    root: &[Seg],
    i: usize,
    cp: &Value,
    seen: &mut BTreeSet<String>,
) -> Result<Checkpoint, Fail> {
    let mut at = key(root, "checkpoints");
    at.push(Seg::Index(i));
    let Some(o) = cp.as_object() else {
        return Err((at, format!("checkpoint #{i} must be an object")));
    };
    let id = req_str(o, &at, "id", true)?;
    if !seen.insert(id.clone()) {
        return Err((
            key(&at, "id"),
            format!("checkpoint id `{id}` is used twice"),
        ));
    }
    if let Some(why) = id_problem(&id) {
        return Err((key(&at, "id"), why));
    }
    let name = match o.get("name") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err((key(&at, "name"), "`name` must be a string".into())),
    };
    let scope = req_str(o, &at, "scope", true)?;
    let status = match o.get("status") {
        None => Status::Pending,
        Some(Value::String(s)) => Status::parse(s).ok_or_else(|| {
            (
                key(&at, "status"),
                format!("status `{s}` is not one of pending, built, approved"),
            )
        })?,
        Some(_) => {
            return Err((
                key(&at, "status"),
                "`status` must be pending, built or approved".into(),
            ))
        }
    };
    let exit_criteria = exit_criteria(o, &at, &id)?;
    let attempts = match o.get("attempts") {
        None => 0,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|v| v <= u32::MAX as u64) => {
            n.as_u64().unwrap_or(0) as u32
        }
        Some(_) => {
            return Err((
                key(&at, "attempts"),
                "`attempts` must be a whole number from 0 to 4294967295".into(),
            ))
        }
    };
    let review_notes = match o.get("review_notes") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err((
                key(&at, "review_notes"),
                "`review_notes` must be a string".into(),
            ))
        }
    };
    Ok(Checkpoint {
        id,
        name,
        scope,
        status,
        exit_criteria,
        attempts,
        review_notes,
        commands: commands(o, &at)?,
    })
}

/// Checkpoint `id`'s `exit_criteria` (at `at`): a non-empty list of non-empty strings.
fn exit_criteria(
    o: &serde_json::Map<String, Value>,
    at: &[Seg],
    id: &str,
) -> Result<Vec<String>, Fail> {
    Ok(match o.get("exit_criteria") {
        None => {
            return Err((
                at.to_vec(),
                format!("checkpoint `{id}`: `exit_criteria` is required"),
            ))
        }
        Some(Value::Array(a)) if a.is_empty() => {
            return Err((
                key(at, "exit_criteria"),
                format!("checkpoint `{id}`: `exit_criteria` must list at least one criterion"),
            ))
        }
        Some(Value::Array(a)) => {
            let mut out = Vec::new();
            for (j, c) in a.iter().enumerate() {
                let mut cat = key(at, "exit_criteria");
                cat.push(Seg::Index(j));
                match c {
                    Value::String(s) if !s.trim().is_empty() => out.push(s.clone()),
                    _ => {
                        let why = format!(
                            "checkpoint `{id}`: every exit criterion must be a non-empty string"
                        );
                        return Err((cat, why));
                    }
                }
            }
            out
        }
        Some(_) => {
            return Err((
                key(at, "exit_criteria"),
                "`exit_criteria` must be a list of strings".into(),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = r#"{
  "plan_file": "docs/plan.md",
  "branch": "feature/x",
  "project": {"test_cmd": "make test", "verify_in_review": true},
  "models": {"developer": "m1"},
  "extra": {"kept": true},
  "checkpoints": [
    {"id": "c1", "name": "one", "scope": "do one", "status": "pending",
     "exit_criteria": ["a"], "attempts": 0, "review_notes": ""},
    {"id": "c2", "name": "two", "scope": "do two", "status": "approved",
     "exit_criteria": ["b"], "attempts": 1, "review_notes": "ok", "test_cmd": "make t2"}
  ]
}"#;

    #[test]
    fn a_plan_file_that_is_a_link_is_refused_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("host.json");
        std::fs::write(&host, GOOD.replace("do one", "host-canary-91")).unwrap();
        assert!(load(&host).is_ok(), "the file itself is read");
        let link = d.path().join("plan.json");
        std::os::unix::fs::symlink(&host, &link).unwrap();
        let e = load(&link).unwrap_err().to_string();
        assert!(
            e.contains("symlink") && !e.contains("host-canary-91"),
            "{e}"
        );
        // In a work tree no level is followed.
        let tree = d.path().join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        std::os::unix::fs::symlink(d.path(), tree.join("docs")).unwrap();
        let e = read_in_tree(&tree, "docs/host.json", Path::new("docs/host.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("symlink"), "{e}");
        let e = read_in_tree(&tree, "none.json", Path::new("none.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such file"), "{e}");
        assert_eq!(
            lexical(Path::new("/a/b/../c/./d")),
            std::path::PathBuf::from("/a/c/d")
        );
    }

    fn err(text: &str) -> String {
        parse(Path::new("plan.json"), text).unwrap_err().to_string()
    }

    #[test]
    fn a_good_plan_parses_with_overrides_and_unknown_fields() {
        let p = parse(Path::new("p.json"), GOOD).unwrap();
        assert_eq!(p.checkpoints.len(), 2);
        assert_eq!(p.developer_model.as_deref(), Some("m1"));
        assert_eq!(p.commands_for("c1").test_cmd.as_deref(), Some("make test"));
        assert_eq!(p.commands_for("c2").test_cmd.as_deref(), Some("make t2"));
        let out = p.render(&[("c1".into(), Status::Built, 2, "n".into())]);
        assert!(out.contains("\"kept\": true"), "{out}");
        let back = parse(Path::new("p.json"), &out).unwrap();
        assert_eq!(back.get("c1").unwrap().status, Status::Built);
        assert_eq!(back.get("c1").unwrap().attempts, 2);
    }

    #[test]
    fn every_rule_names_its_line_and_column() {
        let dup = GOOD.replace("\"id\": \"c2\"", "\"id\": \"c1\"");
        assert!(
            err(&dup).starts_with("plan.json:10:12: checkpoint id `c1` is used twice"),
            "{}",
            err(&dup)
        );
        let main = GOOD.replace("feature/x", "main");
        assert!(
            err(&main).starts_with("plan.json:3:13: the branch `main` is protected"),
            "{}",
            err(&main)
        );
        let crit = GOOD.replace("[\"a\"]", "[]");
        assert!(err(&crit).contains("plan.json:9:"), "{}", err(&crit));
        assert!(err(&crit).contains("at least one criterion"));
        let blank = GOOD.replace("[\"a\"]", "[\"  \"]");
        assert!(err(&blank).contains("non-empty string"));
        let st = GOOD.replace("\"approved\"", "\"done\"");
        assert!(
            err(&st).contains("status `done` is not one of"),
            "{}",
            err(&st)
        );
        let att = GOOD.replace("\"attempts\": 1", "\"attempts\": true");
        assert!(err(&att).contains("whole number"));
        let neg = GOOD.replace("\"attempts\": 1", "\"attempts\": -1");
        assert!(err(&neg).contains("whole number"));
        let models = GOOD.replace("\"developer\": \"m1\"", "\"qa\": \"m1\"");
        assert!(err(&models).contains("only `developer` and `reviewer`"));
        let torn = &GOOD[..60];
        assert!(
            err(torn).starts_with("plan.json:4:2: not valid JSON"),
            "{}",
            err(torn)
        );
        assert!(err("[]").contains("must be a JSON object"));
        let no_scope = GOOD.replace("\"scope\": \"do one\", ", "");
        assert!(err(&no_scope).contains("`scope` is required"));
    }

    #[test]
    fn protected_and_bad_branches() {
        for b in ["main", "master", "refs/heads/main"] {
            assert!(is_protected(b));
            assert!(branch_problem(b).is_some());
        }
        assert!(branch_problem("refs/heads/feature/y")
            .unwrap()
            .contains("not a ref"));
        for id in ["../x", "a/b", ".hidden", "", "a b", "é"] {
            assert!(id_problem(id).is_some(), "{id}");
        }
        assert!(id_problem("phase-1.2_x").is_none());
        assert!(!is_protected("feature/main"));
        for b in ["", "-x", "a..b", "a b", "x.lock", "a:b", "@", "HEAD"] {
            assert!(branch_problem(b).is_some(), "{b}");
        }
        assert!(branch_problem("feature/csv-export").is_none());
    }

    proptest! {
        /// No text makes the parser panic, and every error has a position.
        #[test]
        fn never_panics(s in "\\PC{0,200}") {
            if let Err(e) = parse(Path::new("f"), &s) {
                prop_assert!(e.to_string().starts_with("f:"));
            }
        }

        /// Locating a checkpoint field points at that field's value.
        #[test]
        fn locate_points_at_the_value(i in 0usize..2) {
            let (line, _) = locate(GOOD, &[Seg::Key("checkpoints".into()), Seg::Index(i), Seg::Key("id".into())]);
            prop_assert_eq!(line, 8 + 2 * i);
        }
    }
}
