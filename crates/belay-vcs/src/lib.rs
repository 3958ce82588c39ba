//! git, through the git CLI, hardened for a work tree that sandboxes write.
//!
//! Every call is async, has a deadline ([`Git::with_timeout`]) after which
//! git is killed with its whole process group, and runs with an explicit
//! environment (nothing inherited but PATH, HOME and the locale, plus what a
//! caller passes for remote operations), no terminal prompt, no pager or editor, no system
//! config, an explicit git dir and work tree (no discovery, so a planted
//! `.git` elsewhere is never picked up), and a command line that neutralises
//! everything in a repository's config that would run a program on the host:
//!
//! * `core.hooksPath` on an empty directory: repository hooks never run;
//! * `core.fsmonitor=false`, `protocol.ext.allow=never`;
//! * every filter driver (`filter.<name>.clean|smudge|process`) that any
//!   config scope defines is overridden with an empty command, so
//!   `.gitattributes` cannot invoke one;
//! * every command that makes a patch (`diff`, `log`, `show`,
//!   `format-patch`) gets `--no-ext-diff --no-textconv`: neither
//!   `diff.external` nor a diff driver's `command` or `textconv` runs;
//! * submodules are never recursed into (`submodule.recurse=false`,
//!   `diff.ignoreSubmodules=all`), so a nested repository's config is never read
//!   as git's own.
//!
//! The commit point ([`Git::commit_checked`]) also refuses embedded
//! repositories and gitlinks, and scans the staged blobs for secrets before
//! any object reaches the repository (see `commit.rs`).

mod commit;
pub mod excludes;
mod exec;
mod guard;
pub mod lock;
mod remote;
mod sanitize;
mod stash;
mod worktree;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub use commit::{BlobScan, CommitOutcome, CommitRequest, Refusal, MAX_LISTED};
pub use guard::{GitDirGuard, GitDirRepair};
pub use lock::RepoLock;
pub use stash::{keep_pathspec, Stash};
pub use worktree::Reset;

#[derive(Debug, thiserror::Error)]
pub enum VcsError {
    #[error("cannot run git in {dir}: {source} (is git installed?)")]
    Spawn {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("git {args} failed in {dir}: {stderr}")]
    Failed {
        dir: PathBuf,
        args: String,
        stderr: String,
    },
    #[error("git {args} in {dir} did not finish within {secs} s and was killed with its helpers; raise the timeout if the repository is that large")]
    Timeout {
        dir: PathBuf,
        args: String,
        secs: u64,
    },
    #[error("`{0}` is not a valid branch name (see `git check-ref-format --branch`)")]
    BadName(String),
    #[error("no stash {0} in the stash list (already applied and dropped?)")]
    NoSuchStash(String),
    #[error("{rev} is not a branch, tag or commit of {url}")]
    NoSuchRevision { rev: String, url: String },
    #[error(
        "a git task was aborted ({0}): belay was shutting down or hit a bug; rerun the command"
    )]
    Aborted(String),
    #[error("{0} is not a git work tree: run `git init` there, or point the run at one")]
    NotARepo(PathBuf),
    #[error("the repository {} is locked ({holder}): one writer of a checkout at a time; wait for it, or stop that belay", repo.display())]
    Locked { repo: PathBuf, holder: String },
    #[error("belay's records: {0}")]
    Record(String),
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl VcsError {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        VcsError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

impl belay_record::Classify for VcsError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            VcsError::Spawn { .. } | VcsError::Timeout { .. } | VcsError::Aborted(_) => {
                ExitClass::Infra
            }
            VcsError::Failed { .. } => ExitClass::Failed,
            VcsError::Locked { .. } | VcsError::Record(_) => ExitClass::Infra,
            VcsError::Io { source, .. } => belay_record::io_class(source),
            VcsError::NotARepo(_)
            | VcsError::BadName(_)
            | VcsError::NoSuchStash(_)
            | VcsError::NoSuchRevision { .. } => ExitClass::Usage,
        }
    }
}

/// A git work tree.
#[derive(Debug, Clone)]
pub struct Git {
    root: PathBuf,
    git_dir: PathBuf,
    /// The common git dir (the git dir itself, or a worktree's main one).
    common_dir: PathBuf,
    /// An empty directory used as `core.hooksPath`.
    hooks: PathBuf,
    timeout: Duration,
    remote_env: Vec<(String, String)>,
    /// A credential helper belay's caller chose (never the repository's).
    credential_helper: Option<String>,
}

/// What a commit made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub sha: String,
    /// The changed paths, the first [`commit::MAX_LISTED`] of them.
    pub files: Vec<String>,
    /// How many paths changed.
    pub files_total: usize,
}

/// Files in the git dir that make git read another config or object store.
const CONTROL_FILES: &[&str] = &[
    "commondir",
    "config.worktree",
    "objects/info/alternates",
    "objects/info/http-alternates",
];

/// How long one git call may take unless [`Git::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The most of a commit's patch a run records.
pub const PATCH_RECORD_MAX: usize = 2 << 20;

impl Git {
    /// Open the work tree containing `dir`. `hooks_dir`: an empty directory
    /// belay owns (created if missing), used as the hooks path.
    pub async fn open(dir: &Path, hooks_dir: &Path) -> Result<Self, VcsError> {
        fs_err::create_dir_all(hooks_dir).map_err(|e| VcsError::io("create", hooks_dir, e))?;
        let mut c = exec::base_command(hooks_dir, &[]);
        c.current_dir(dir);
        let out = exec::output(
            c,
            dir,
            &[
                "rev-parse",
                "--show-toplevel",
                "--absolute-git-dir",
                "--path-format=absolute",
                "--git-common-dir",
            ],
            DEFAULT_TIMEOUT,
        )
        .await
        .map_err(|e| match e {
            VcsError::Spawn { .. } | VcsError::Timeout { .. } => e,
            _ => VcsError::NotARepo(dir.to_path_buf()),
        })?;
        let mut lines = out.lines();
        let (Some(top), Some(git_dir), Some(common)) = (lines.next(), lines.next(), lines.next())
        else {
            return Err(VcsError::NotARepo(dir.to_path_buf()));
        };
        Ok(Git {
            root: PathBuf::from(top.trim()),
            git_dir: PathBuf::from(git_dir.trim()),
            common_dir: PathBuf::from(common.trim()),
            hooks: hooks_dir.to_path_buf(),
            timeout: DEFAULT_TIMEOUT,
            remote_env: Vec::new(),
            credential_helper: None,
        })
    }

    /// The deadline of each git call (the whole process group is killed there).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Variables that remote operations (fetch, push) pass to git on top of
    /// the kept ones: the proxy settings a caller chose. Nothing else of the
    /// host's environment reaches git.
    pub fn with_remote_env(mut self, env: Vec<(String, String)>) -> Self {
        self.remote_env = env;
        self
    }

    /// The credential helper fetch and push use. Every helper a config names
    /// is reset (a repository's config could name any program); this one,
    /// chosen by belay's caller, is the only one that runs.
    pub fn with_credential_helper(mut self, helper: Option<String>) -> Self {
        self.credential_helper = helper;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The common git dir, as it was when the repository was opened.
    pub fn common_dir(&self) -> &Path {
        &self.common_dir
    }

    /// The repository's git directory (`.git`, or a worktree's).
    pub fn git_dir(&self) -> &Path {
        &self.git_dir
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn scoped(&self, extra_env: &[(String, String)]) -> Command {
        let mut c = exec::base_command(&self.hooks, extra_env);
        // The common dir as it was when the repository was opened: a
        // `commondir` file written later (by a sandbox that can write the git
        // dir) does not move git to another config.
        c.env("GIT_DIR", &self.git_dir)
            .env("GIT_COMMON_DIR", &self.common_dir)
            .env("GIT_WORK_TREE", &self.root)
            .current_dir(&self.root);
        c
    }

    const LIST_CONFIG: &'static [&'static str] = &["config", "-z", "--list", "--name-only"];

    fn config_unreadable(&self, e: VcsError) -> VcsError {
        VcsError::Failed {
            dir: self.root.clone(),
            args: "config --list".into(),
            stderr: format!(
                "{e}; belay reads the repository's config before every git command to disable its filters: fix or restore {}",
                self.git_dir.join("config").display()
            ),
        }
    }

    fn with_overrides(mut c: Command, names: &str) -> Command {
        let o = exec::driver_overrides(names);
        c.env("GIT_CONFIG_COUNT", o.len().to_string());
        for (i, (k, v)) in o.iter().enumerate() {
            c.env(format!("GIT_CONFIG_KEY_{i}"), k)
                .env(format!("GIT_CONFIG_VALUE_{i}"), v);
        }
        c
    }

    /// A hardened git command for this work tree (see the module docs). The
    /// repository's config is listed first, to empty every filter driver it
    /// names; a config that cannot be listed refuses the command (fail closed:
    /// an override left out would let a filter run).
    async fn command_with(&self, extra_env: &[(String, String)]) -> Result<Command, VcsError> {
        let names = exec::output(
            self.scoped(&[]),
            &self.root,
            Self::LIST_CONFIG,
            self.timeout,
        )
        .await
        .map_err(|e| self.config_unreadable(e))?;
        Ok(Self::with_overrides(self.scoped(extra_env), &names))
    }

    async fn command(&self) -> Result<Command, VcsError> {
        self.command_with(&[]).await
    }

    /// [`Git::command`] for code on the blocking pool.
    fn command_blocking(&self) -> Result<Command, VcsError> {
        let names = exec::output_blocking(
            self.scoped(&[]),
            &self.root,
            Self::LIST_CONFIG,
            self.timeout,
        )
        .map_err(|e| self.config_unreadable(e))?;
        Ok(Self::with_overrides(self.scoped(&[]), &names))
    }

    /// Run git; its stdout.
    pub async fn run(&self, args: &[&str]) -> Result<String, VcsError> {
        exec::output(
            self.command().await?,
            &self.root,
            &exec::patch_safe(args),
            self.timeout,
        )
        .await
    }

    /// Run git; whether it exited 0 (any other exit is `false`, not an error).
    pub async fn succeeds(&self, args: &[&str]) -> Result<bool, VcsError> {
        let f = exec::finish(self.command().await?, &self.root, args, self.timeout).await?;
        Ok(f.code == Some(0))
    }

    fn run_blocking(&self, env: &[(&str, &Path)], args: &[&str]) -> Result<String, VcsError> {
        let mut c = self.command_blocking()?;
        for (k, v) in env {
            c.env(k, v);
        }
        exec::output_blocking(c, &self.root, &exec::patch_safe(args), self.timeout)
    }

    pub async fn head(&self) -> Result<String, VcsError> {
        Ok(self.run(&["rev-parse", "HEAD"]).await?.trim().to_string())
    }

    /// Whether commit `ancestor` is in the history of `rev` (false when
    /// either is unknown here).
    pub async fn is_ancestor(&self, ancestor: &str, rev: &str) -> Result<bool, VcsError> {
        let Some(a) = self.resolve_commit(ancestor).await? else {
            return Ok(false);
        };
        match self.run(&["merge-base", "--is-ancestor", &a, rev]).await {
            Ok(_) => Ok(true),
            Err(VcsError::Failed { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The full SHA of the commit `rev` names, if it names one.
    pub async fn resolve_commit(&self, rev: &str) -> Result<Option<String>, VcsError> {
        let spec = format!("{rev}^{{commit}}");
        match self.run(&["rev-parse", "--verify", "--quiet", &spec]).await {
            Ok(s) => Ok(Some(s.trim().to_string())),
            Err(VcsError::Failed { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Changed, staged or untracked paths (relative to the root), limited to
    /// `paths` when given.
    pub async fn dirty(&self, paths: &[&str]) -> Result<Vec<String>, VcsError> {
        let mut args = vec![
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignore-submodules=all",
        ];
        if !paths.is_empty() {
            args.push("--");
            args.extend(paths);
        }
        let out = self.run(&args).await?;
        let mut files = Vec::new();
        let mut it = out.split('\0').filter(|s| !s.is_empty());
        while let Some(entry) = it.next() {
            if entry.len() < 4 {
                continue;
            }
            let (status, path) = entry.split_at(3);
            files.push(path.to_string());
            // A rename is followed by its source path.
            if status.starts_with('R') || status.starts_with('C') {
                it.next();
            }
        }
        Ok(files)
    }

    /// After a crash between "record HEAD, then commit" and "record the
    /// commit": the commit made on top of `before` with subject `message`,
    /// if HEAD is that commit (so that a resume neither loses nor repeats it).
    pub async fn recognise_commit(
        &self,
        before: &str,
        message: &str,
    ) -> Result<Option<String>, VcsError> {
        let head = self.head().await?;
        if head == before {
            return Ok(None);
        }
        let parent = self.resolve_commit(&format!("{head}~1")).await?;
        if parent.as_deref() != Some(before) {
            return Ok(None);
        }
        let subject = self.run(&["log", "-1", "--format=%s", &head]).await?;
        let first = message.lines().next().unwrap_or_default();
        Ok((subject.trim_end() == first).then_some(head))
    }

    /// Untracked paths the ignore rules hide from git: what is in the tree
    /// but in no commit. Every file, or with `collapse` a wholly ignored
    /// directory once, as `dir/`.
    pub async fn ignored_entries(&self, collapse: bool) -> Result<Vec<String>, VcsError> {
        let mut args = vec![
            "ls-files",
            "-z",
            "--others",
            "--ignored",
            "--exclude-standard",
        ];
        if collapse {
            args.push("--directory");
        }
        let out = self.run(&args).await?;
        Ok(out
            .split('\0')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect())
    }

    /// Whether `name` is a branch name git accepts (`check-ref-format --branch`).
    pub async fn valid_branch(&self, name: &str) -> Result<bool, VcsError> {
        if name.starts_with('-') {
            return Ok(false);
        }
        self.succeeds(&["check-ref-format", "--branch", name]).await
    }

    /// The paths of `.gitmodules` submodules (the gitlinks a commit may hold).
    pub async fn submodule_paths(&self) -> Result<Vec<String>, VcsError> {
        if !self.root.join(".gitmodules").is_file() {
            return Ok(Vec::new());
        }
        let out = self
            .run(&[
                "config",
                "-z",
                "--file",
                ".gitmodules",
                "--get-regexp",
                r"^submodule\..*\.path$",
            ])
            .await
            .unwrap_or_default();
        Ok(out
            .split('\0')
            .filter_map(|e| e.split_once('\n').map(|(_, v)| v.to_string()))
            .collect())
    }

    /// The paths git does not ignore, of `paths`.
    pub async fn not_ignored(&self, paths: &[String]) -> Result<Vec<String>, VcsError> {
        let mut out = Vec::new();
        for p in paths {
            // `check-ignore` exits 1 when the path is not ignored.
            let f = exec::finish(
                self.command().await?,
                &self.root,
                &["check-ignore", "-q", "--no-index", "--", p],
                self.timeout,
            )
            .await?;
            if f.code == Some(1) {
                out.push(p.clone());
            }
        }
        Ok(out)
    }

    /// Undo staging (the work tree is untouched).
    pub async fn unstage(&self) -> Result<(), VcsError> {
        self.run(&["reset", "-q"]).await.map(|_| ())
    }

    /// The patch of commit `sha` for the run's record (`git show` with its
    /// stat; no external diff or textconv driver runs), cut after `max`
    /// bytes with a note saying so.
    pub async fn commit_patch(&self, sha: &str, max: usize) -> Result<String, VcsError> {
        let args = [
            "show",
            "--stat",
            "--patch",
            "--format=fuller",
            "--no-color",
            sha,
            "--",
        ];
        self.capped_patch(&args, max, &format!("git show {sha}"))
            .await
    }

    /// The patch of stash `sha`, its untracked files included (`git stash
    /// show -p`, with its stat), cut after `max` bytes with a note saying so:
    /// what an owner approves is exactly this.
    pub async fn stash_patch(&self, sha: &str, max: usize) -> Result<String, VcsError> {
        let args = [
            "stash",
            "show",
            "--include-untracked",
            "--stat",
            "--patch",
            "--no-color",
            sha,
        ];
        self.capped_patch(
            &args,
            max,
            &format!("git stash show -p --include-untracked {sha}"),
        )
        .await
    }

    async fn capped_patch(
        &self,
        args: &[&str],
        max: usize,
        rest: &str,
    ) -> Result<String, VcsError> {
        let git = self.clone();
        let owned: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (bytes, more) = blocking(move || {
            let a: Vec<&str> = owned.iter().map(String::as_str).collect();
            git.capped_blocking(&a, max)
        })
        .await?;
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if more {
            text.push_str(&format!(
                "\n[belay: the patch is cut at {max} bytes; `{rest}` has the rest]\n"
            ));
        }
        Ok(text)
    }

    /// Record commit `sha` in the run as `commits/<sha>.patch`, for the audit
    /// and the dashboard. A commit is never undone for its record: a failure
    /// is logged.
    pub async fn record_commit(&self, run: &belay_record::RunHandle, sha: &str) {
        let name = format!("commits/{sha}.patch");
        match self.commit_patch(sha, PATCH_RECORD_MAX).await {
            Ok(p) => {
                if let Err(e) = run.write_text(&name, &p) {
                    tracing::warn!("cannot record the patch of {sha}: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot read the patch of {sha}: {e}"),
        }
    }

    /// Commit what is staged in the index.
    pub async fn commit_staged(
        &self,
        message: &str,
        author: Option<(&str, &str)>,
    ) -> Result<String, VcsError> {
        let configured = self.succeeds(&["config", "user.email"]).await?;
        let args = commit_args(message, author, configured);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&refs).await?;
        self.head().await
    }

    /// The files in the git dir that redirect git elsewhere (another common
    /// dir, a per-worktree config, object alternates), by name: their sha256,
    /// or `absent`. A sandbox with git mutations must not change them: the
    /// next host `git status` would read the config they point at.
    pub fn control_files(&self) -> std::collections::BTreeMap<String, String> {
        use sha2::Digest;
        CONTROL_FILES
            .iter()
            .map(|name| {
                let p = self.git_dir.join(name);
                let v = match fs_err::symlink_metadata(&p) {
                    Err(_) => "absent".to_string(),
                    Ok(m) if !m.is_file() => "not a regular file".to_string(),
                    Ok(_) => fs_err::read(&p)
                        .map(|b| hex::encode(sha2::Sha256::digest(&b)))
                        .unwrap_or_else(|_| "unreadable".into()),
                };
                (name.to_string(), v)
            })
            .collect()
    }

    /// Put the control files back as `before` recorded them, where that can
    /// be done: a file that was absent is removed (a link itself, never its
    /// target). The names that differed.
    pub fn restore_control_files(
        &self,
        before: &std::collections::BTreeMap<String, String>,
    ) -> Vec<String> {
        let now = self.control_files();
        let mut changed = Vec::new();
        for (name, was) in before {
            if now.get(name) != Some(was) {
                if was == "absent" {
                    let _ = fs_err::remove_file(self.git_dir.join(name));
                }
                changed.push(name.clone());
            }
        }
        changed
    }

    /// A copy of the repository's config for sandboxes, written to `dest`:
    /// credentials in remote and submodule URLs, `http.*.extraHeader` and
    /// `credential.*` removed.
    pub async fn write_sanitized_config(&self, dest: &Path) -> Result<(), VcsError> {
        sanitize::write(self, dest).await
    }
}

/// Run blocking git work (the commit's streamed checks) off the async
/// threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VcsError> + Send + 'static,
) -> Result<T, VcsError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| VcsError::Aborted(e.to_string()))?
}

/// `git commit` of the index, hooks and signing off, with `author` (or
/// belay's own identity when the repository has none).
fn commit_args(message: &str, author: Option<(&str, &str)>, configured: bool) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    let (name, email) = author.unwrap_or(("belay", "belay@localhost"));
    if author.is_some() || !configured {
        args.extend([
            "-c".into(),
            format!("user.name={name}"),
            "-c".into(),
            format!("user.email={email}"),
        ]);
    }
    args.extend([
        "commit".into(),
        "--no-verify".into(),
        "--no-gpg-sign".into(),
        "-q".into(),
        "-m".into(),
        message.into(),
    ]);
    args
}

#[cfg(test)]
mod tests;
