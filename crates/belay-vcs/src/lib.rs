//! git, through the git CLI, hardened for a work tree that sandboxes write.
//!
//! Every call runs with an explicit environment (nothing inherited but PATH,
//! HOME and the locale), no terminal prompt, no pager or editor, no system
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
mod sanitize;

use std::path::{Path, PathBuf};
use std::process::Command;

pub use commit::{CommitOutcome, CommitRequest, Refusal, MAX_LISTED};

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
    #[error("{0} is not a git work tree: run `git init` there, or point the run at one")]
    NotARepo(PathBuf),
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

/// A git work tree.
#[derive(Debug, Clone)]
pub struct Git {
    root: PathBuf,
    git_dir: PathBuf,
    /// An empty directory used as `core.hooksPath`.
    hooks: PathBuf,
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

/// The fixed part of the hardening, before the per-repository driver overrides.
const HARDENING: &[&str] = &[
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "protocol.ext.allow=never",
    "submodule.recurse=false",
    "status.submoduleSummary=false",
    "diff.ignoreSubmodules=all",
    "core.alternateRefsCommand=",
    "core.pager=cat",
    "gc.auto=0",
    "maintenance.auto=false",
];

fn base_command(hooks: &Path) -> Command {
    let mut c = Command::new("git");
    c.env_clear();
    for k in ["PATH", "HOME", "LANG", "LC_ALL", "TZ"] {
        if let Ok(v) = std::env::var(k) {
            c.env(k, v);
        }
    }
    c.env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_PAGER", "cat")
        .env("GIT_EDITOR", "true")
        .env("GIT_ASKPASS", "true")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .stdin(std::process::Stdio::null())
        .arg("-c")
        .arg(format!("core.hooksPath={}", hooks.display()));
    for h in HARDENING {
        c.arg("-c").arg(h);
    }
    c
}

fn output_of(mut c: Command, dir: &Path, args: &[&str]) -> Result<String, VcsError> {
    let out = c.args(args).output().map_err(|source| VcsError::Spawn {
        dir: dir.to_path_buf(),
        source,
    })?;
    if !out.status.success() {
        return Err(VcsError::Failed {
            dir: dir.to_path_buf(),
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `-c` overrides that empty every filter and diff driver the config
/// names (`git config --list` never runs a program).
fn driver_overrides(names: &str) -> Vec<String> {
    let mut out = Vec::new();
    for key in names.split('\0').map(str::trim).filter(|k| !k.is_empty()) {
        let lower = key.to_ascii_lowercase();
        let Some((section, rest)) = lower.split_once('.') else {
            continue;
        };
        let Some((_, var)) = rest.rsplit_once('.') else {
            continue;
        };
        // The subsection keeps its case in the key git printed.
        let sub = &key[section.len() + 1..key.len() - var.len() - 1];
        let keys: &[&str] = match (section, var) {
            ("filter", "clean" | "smudge" | "process" | "required") => {
                &["clean=", "smudge=", "process=", "required=false"]
            }
            _ => continue,
        };
        for k in keys {
            let o = format!("{section}.{sub}.{k}");
            if !out.contains(&o) {
                out.push(o);
            }
        }
    }
    out
}

/// `args` with `--no-ext-diff --no-textconv` after a patch-making subcommand.
fn patch_safe<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    if let Some(i) = v.iter().position(|a| !a.starts_with('-')) {
        if matches!(
            v[i],
            "diff" | "log" | "show" | "format-patch" | "whatchanged"
        ) {
            v.insert(i + 1, "--no-textconv");
            v.insert(i + 1, "--no-ext-diff");
        }
    }
    v
}

impl Git {
    /// Open the work tree containing `dir`. `hooks_dir`: an empty directory
    /// belay owns (created if missing), used as the hooks path.
    pub fn open(dir: &Path, hooks_dir: &Path) -> Result<Self, VcsError> {
        fs_err::create_dir_all(hooks_dir).map_err(|source| VcsError::Spawn {
            dir: hooks_dir.to_path_buf(),
            source,
        })?;
        let mut c = base_command(hooks_dir);
        c.current_dir(dir);
        let out = output_of(
            c,
            dir,
            &["rev-parse", "--show-toplevel", "--absolute-git-dir"],
        )
        .map_err(|_| VcsError::NotARepo(dir.to_path_buf()))?;
        let mut lines = out.lines();
        let (Some(top), Some(git_dir)) = (lines.next(), lines.next()) else {
            return Err(VcsError::NotARepo(dir.to_path_buf()));
        };
        Ok(Git {
            root: PathBuf::from(top.trim()),
            git_dir: PathBuf::from(git_dir.trim()),
            hooks: hooks_dir.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The repository's git directory (`.git`, or a worktree's).
    pub fn git_dir(&self) -> &Path {
        &self.git_dir
    }

    /// A hardened git command for this work tree (see the module docs). The
    /// repository's config is listed first, to empty every filter driver it
    /// names; a config that cannot be listed refuses the command (fail closed:
    /// an override left out would let a filter run).
    fn command(&self) -> Result<Command, VcsError> {
        let scoped = |mut c: Command| {
            c.env("GIT_DIR", &self.git_dir)
                .env("GIT_WORK_TREE", &self.root)
                .current_dir(&self.root);
            c
        };
        let names = output_of(
            scoped(base_command(&self.hooks)),
            &self.root,
            &["config", "-z", "--list", "--name-only"],
        )
        .map_err(|e| VcsError::Failed {
            dir: self.root.clone(),
            args: "config --list".into(),
            stderr: format!(
                "{e}; belay reads the repository's config before every git command to disable its filters: fix or restore {}",
                self.git_dir.join("config").display()
            ),
        })?;
        let mut c = scoped(base_command(&self.hooks));
        for o in driver_overrides(&names) {
            c.arg("-c").arg(o);
        }
        Ok(c)
    }

    /// Run git; its stdout.
    pub fn run(&self, args: &[&str]) -> Result<String, VcsError> {
        output_of(self.command()?, &self.root, &patch_safe(args))
    }

    /// Run git with extra environment (a temporary index or object directory).
    fn run_env(&self, env: &[(&str, &Path)], args: &[&str]) -> Result<String, VcsError> {
        let mut c = self.command()?;
        for (k, v) in env {
            c.env(k, v);
        }
        output_of(c, &self.root, &patch_safe(args))
    }

    pub fn head(&self) -> Result<String, VcsError> {
        Ok(self.run(&["rev-parse", "HEAD"])?.trim().to_string())
    }

    /// Changed, staged or untracked paths (relative to the root), limited to
    /// `paths` when given.
    pub fn dirty(&self, paths: &[&str]) -> Result<Vec<String>, VcsError> {
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
        let out = self.run(&args)?;
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

    /// The paths of `.gitmodules` submodules (the gitlinks a commit may hold).
    pub fn submodule_paths(&self) -> Result<Vec<String>, VcsError> {
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
            .unwrap_or_default();
        Ok(out
            .split('\0')
            .filter_map(|e| e.split_once('\n').map(|(_, v)| v.to_string()))
            .collect())
    }

    /// The paths git does not ignore, of `paths`.
    pub fn not_ignored(&self, paths: &[String]) -> Result<Vec<String>, VcsError> {
        let mut out = Vec::new();
        for p in paths {
            // `check-ignore` exits 1 when the path is not ignored.
            let mut c = self.command()?;
            let o = c
                .args(["check-ignore", "-q", "--no-index", "--", p])
                .output()
                .map_err(|source| VcsError::Spawn {
                    dir: self.root.clone(),
                    source,
                })?;
            if o.status.code() == Some(1) {
                out.push(p.clone());
            }
        }
        Ok(out)
    }

    /// Undo staging (the work tree is untouched).
    pub fn unstage(&self) -> Result<(), VcsError> {
        self.run(&["reset", "-q"]).map(|_| ())
    }

    /// Commit what is staged in the index.
    pub fn commit_staged(
        &self,
        message: &str,
        author: Option<(&str, &str)>,
    ) -> Result<String, VcsError> {
        let mut args: Vec<String> = Vec::new();
        let configured = self.run(&["config", "user.email"]).is_ok();
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
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&refs)?;
        self.head()
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
                let v = match std::fs::symlink_metadata(&p) {
                    Err(_) => "absent".to_string(),
                    Ok(m) if !m.is_file() => "not a regular file".to_string(),
                    Ok(_) => std::fs::read(&p)
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
                    let _ = std::fs::remove_file(self.git_dir.join(name));
                }
                changed.push(name.clone());
            }
        }
        changed
    }

    /// A copy of the repository's config for sandboxes, written to `dest`:
    /// credentials in remote and submodule URLs, `http.*.extraHeader` and
    /// `credential.*` removed.
    pub fn write_sanitized_config(&self, dest: &Path) -> Result<(), VcsError> {
        sanitize::write(self, dest)
    }
}

#[cfg(test)]
mod tests;
