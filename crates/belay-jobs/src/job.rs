//! A job file: the fields of the builder seed (FORMATS.md §7) and the
//! repositories it may write, parsed strictly. A job file is input from
//! whoever could write the queue's inbox, so every field is checked and a
//! broken file is named with its line and column.

use std::path::{Path, PathBuf};

use belay_record::Id;
use serde::{Deserialize, Serialize};

use crate::JobsError;

/// The longest request (with its carried context), as in the seed.
pub const MAX_BODY_CHARS: usize = 20_000;
/// The seed's default iteration limit.
pub const DEFAULT_ITERATION_LIMIT: u32 = 20;
/// The highest iteration limit a job may ask for.
pub const MAX_ITERATION_LIMIT: u32 = 1_000;

/// A job's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    Builder,
    /// Answers with exactly one FIX_RESULT block.
    Fixer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Builder => "builder",
            Role::Fixer => "fixer",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "builder" => Ok(Role::Builder),
            "fixer" => Ok(Role::Fixer),
            o => Err(format!("unknown role `{o}`: builder or fixer")),
        }
    }
}

/// What belay keeps on a job between its moves (never from the submitter).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bookkeeping {
    /// Times the job was found in `processing/` with no live worker and put
    /// back in the inbox.
    #[serde(default)]
    pub requeues: u32,
    /// Times SIGTERM interrupted it.
    #[serde(default)]
    pub interrupted: u32,
    /// The owner who accepted a third party's job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_by: Option<String>,
    /// Why it failed, when it is in `failed/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// One job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Parsed by the one validator of ids ([`belay_record::ids`]) when the
    /// file is read: a job file whose id is no id is no job.
    pub id: Id,
    /// Who sent it (a chat address, `local`, `http:<name>`): replies go here.
    pub sender: String,
    /// On whose behalf; a job not requested by an owner waits for the
    /// owner's start approval.
    #[serde(default)]
    pub requested_by: Option<String>,
    pub body: String,
    /// The seed's runtime: `codex`, `claude` or `openrouter` (the built-in
    /// agent on the configured endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// A belay agent spec (`codex@gpt-5`, `cmd:./agent.sh`); wins over
    /// `runtime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration_limit: Option<u32>,
    #[serde(default)]
    pub pipeline_role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_complete_dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run_id: Option<String>,
    /// Carry no context in and save none.
    #[serde(default)]
    pub fresh_session: bool,
    /// The repositories it may write: names from `jobs.toml` or paths.
    /// Empty: the config's default repositories.
    #[serde(default)]
    pub repos: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// `cli`, `xmpp`, `http` or `drop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The ids of the chat messages it was made of (no duplicate job after a
    /// reconnect).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ids: Vec<String>,
    #[serde(default)]
    pub belay: Bookkeeping,
}

/// A job as another tool asks for it (a drop file, an HTTP body): the
/// fields a submitter may set. Who sent it, on whose behalf and under which
/// id are the front end's to decide ([`Request::into_job`] leaves them).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    #[serde(default)]
    pub id: Option<Id>,
    #[serde(default)]
    pub requested_by: Option<String>,
    pub body: String,
    #[serde(default)]
    pub repos: Vec<String>,
    #[serde(default)]
    pub runtime: Option<String>,
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    #[serde(default)]
    pub iteration_limit: Option<u32>,
    #[serde(default)]
    pub pipeline_role: Option<Role>,
    #[serde(default)]
    pub on_complete_dir: Option<PathBuf>,
    #[serde(default)]
    pub board_slug: Option<String>,
    #[serde(default)]
    pub pipeline_run_id: Option<String>,
    #[serde(default)]
    pub fresh_session: bool,
}

impl Request {
    /// A new job from `sender` with these fields (not `id`, not
    /// `requested_by`).
    pub fn into_job(self, sender: &str, source: &str) -> Job {
        let mut j = Job::new(sender, &self.body);
        j.repos = self.repos;
        j.runtime = self.runtime;
        j.agent = self.agent;
        j.model = self.model;
        j.reasoning_effort = self.reasoning_effort;
        j.iteration_limit = self.iteration_limit;
        j.pipeline_role = self.pipeline_role.unwrap_or_default();
        j.on_complete_dir = self.on_complete_dir;
        j.board_slug = self.board_slug;
        j.pipeline_run_id = self.pipeline_run_id;
        j.fresh_session = self.fresh_session;
        j.source = Some(source.to_string());
        j
    }
}

/// A fresh job id: `j<UTC yyyymmddHHMMSS>-<8 hex>`, sortable by time, a valid
/// run id and branch name.
pub fn new_id() -> Id {
    loop {
        let now = jiff::Timestamp::now();
        let t = now.strftime("%Y%m%d%H%M%S");
        // Letters, digits and one `-`: always an id, so this loop never
        // goes round (it is how the type is made without a panic).
        if let Ok(id) = Id::parse("job", &format!("j{t}-{:08x}", fastrand::u32(..))) {
            return id;
        }
    }
}

/// What is wrong with a job, for the file and for the sender.
fn invalid(path: &Path, why: impl std::fmt::Display) -> JobsError {
    JobsError::Refused(format!("{}: {why}", path.display()))
}

impl Job {
    /// A job from the owner or a sender, with the defaults.
    pub fn new(sender: &str, body: &str) -> Job {
        Job {
            id: new_id(),
            sender: sender.to_string(),
            requested_by: None,
            body: body.to_string(),
            runtime: None,
            agent: None,
            model: None,
            reasoning_effort: None,
            iteration_limit: None,
            pipeline_role: Role::Builder,
            on_complete_dir: None,
            board_slug: None,
            pipeline_run_id: None,
            fresh_session: false,
            repos: vec![],
            created_at: Some(belay_record::now_rfc3339()),
            source: None,
            source_ids: vec![],
            belay: Bookkeeping::default(),
        }
    }

    /// On whose behalf (the sender when not said).
    pub fn requester(&self) -> &str {
        self.requested_by.as_deref().unwrap_or(&self.sender)
    }

    pub fn iteration_limit(&self) -> u32 {
        self.iteration_limit.unwrap_or(DEFAULT_ITERATION_LIMIT)
    }

    /// Parse a job file's text; `path` names it in every error.
    pub fn parse(path: &Path, text: &str) -> Result<Job, JobsError> {
        let job: Job = serde_json::from_str(text).map_err(|e| {
            JobsError::Refused(format!(
                "{}:{}:{}: not a valid job: {e}. A job is a JSON object with id, sender and body (FORMATS.md §7; `belay jobs submit` writes one)",
                path.display(),
                e.line(),
                e.column()
            ))
        })?;
        job.validate(path)?;
        Ok(job)
    }

    /// Check every field a submitter can set.
    pub fn validate(&self, path: &Path) -> Result<(), JobsError> {
        belay_record::run_id::validate(self.id.as_str()).map_err(|e| invalid(path, e))?;
        if self.sender.trim().is_empty() {
            return Err(invalid(path, "`sender` is empty: say who sent the job"));
        }
        if self.body.trim().is_empty() {
            return Err(invalid(path, "`body` is empty: a job needs a request"));
        }
        let n = self.body.chars().count();
        if n > MAX_BODY_CHARS {
            return Err(invalid(
                path,
                format!("`body` has {n} characters, more than the limit of {MAX_BODY_CHARS}: split the request"),
            ));
        }
        if let Some(l) = self.iteration_limit {
            if l == 0 || l > MAX_ITERATION_LIMIT {
                return Err(invalid(
                    path,
                    format!("`iteration_limit` is {l}: give 1 to {MAX_ITERATION_LIMIT}"),
                ));
            }
        }
        if let Some(r) = &self.runtime {
            if !matches!(r.as_str(), "codex" | "claude" | "openrouter") {
                return Err(invalid(
                    path,
                    format!("`runtime` is `{r}`: codex, claude or openrouter (or give a belay `agent` spec)"),
                ));
            }
        }
        for (k, v) in [
            ("model", &self.model),
            ("reasoning_effort", &self.reasoning_effort),
        ] {
            if let Some(v) = v {
                let ok = !v.is_empty()
                    && v.len() <= 128
                    && !v.starts_with('-')
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._:/@-".contains(c));
                if !ok {
                    return Err(invalid(
                        path,
                        format!("`{k}` `{v}` is not a model name (letters, digits and ._:/@-, not starting with -)"),
                    ));
                }
            }
        }
        if let Some(a) = &self.agent {
            a.parse::<belay_agent::AgentSpec>()
                .map_err(|e| invalid(path, format!("`agent`: {e}")))?;
        }
        if let Some(d) = &self.on_complete_dir {
            if !d.is_absolute() {
                return Err(invalid(
                    path,
                    format!(
                        "`on_complete_dir` {} is relative: give an absolute path",
                        d.display()
                    ),
                ));
            }
        }
        for r in &self.repos {
            if r.trim().is_empty() {
                return Err(invalid(path, "`repos` holds an empty name"));
            }
        }
        Ok(())
    }

    /// A short preview of the request (at most `n` characters).
    pub fn preview(&self, n: usize) -> String {
        let body = self.body.trim();
        if body.chars().count() <= n {
            return body.to_string();
        }
        let cut: String = body.chars().take(n).collect();
        format!("{}…", cut.trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_job_is_named_with_its_line_and_column() {
        let p = Path::new("/q/inbox/x.json");
        let e = Job::parse(p, "{\n  \"id\": \"x\",\n  \"sender\": 3\n}").unwrap_err();
        assert!(e.to_string().starts_with("/q/inbox/x.json:3:"), "{e}");
        let e = Job::parse(p, r#"{"id":"x","sender":"a","body":"b","owner":true}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `owner`"), "{e}");
        for bad in ["../x", "a/b", "..", ".x", "a..b"] {
            let text = format!(r#"{{"id":"{bad}","sender":"a","body":"b"}}"#);
            let e = Job::parse(p, &text).unwrap_err();
            assert!(e.to_string().contains("is not a valid id"), "{bad}: {e}");
        }
        let long = "x".repeat(65);
        let e =
            Job::parse(p, &format!(r#"{{"id":"{long}","sender":"a","body":"b"}}"#)).unwrap_err();
        assert!(e.to_string().contains("invalid run id"), "{e}");
        let e = Job::parse(
            p,
            r#"{"id":"x","sender":"a","body":"b","iteration_limit":0}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("iteration_limit"), "{e}");
        let e = Job::parse(p, r#"{"id":"x","sender":"a","body":"b","runtime":"gpt"}"#).unwrap_err();
        assert!(e.to_string().contains("codex, claude or openrouter"), "{e}");
        let j = Job::parse(p, r#"{"id":"x","sender":"a","body":"b"}"#).unwrap();
        assert_eq!(j.requester(), "a");
        assert_eq!(j.iteration_limit(), 20);
    }

    #[test]
    fn ids_sort_by_time_and_are_run_ids() {
        let a = new_id();
        belay_record::run_id::validate(a.as_str()).unwrap();
        assert!(a.as_str().starts_with('j') && a.as_str().len() == 24, "{a}");
    }

    proptest::proptest! {
        #[test]
        fn any_text_is_a_job_or_an_error_naming_the_file(s in "\\PC{0,200}") {
            let p = Path::new("/q/inbox/p.json");
            if let Err(e) = Job::parse(p, &s) {
                proptest::prop_assert!(e.to_string().starts_with("/q/inbox/p.json"));
            }
        }
    }
}
