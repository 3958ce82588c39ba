//! git, through the git CLI.
//!
//! Every call runs with an explicit environment (nothing inherited but PATH,
//! HOME and the locale), no terminal prompt, no system config, and
//! `core.hooksPath` pointed at an empty directory: repository hooks never run.

use std::path::{Path, PathBuf};
use std::process::Command;

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
}

/// A git work tree.
#[derive(Debug, Clone)]
pub struct Git {
    root: PathBuf,
    /// An empty directory used as `core.hooksPath`.
    hooks: PathBuf,
}

/// What a commit made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub sha: String,
    pub files: Vec<String>,
}

impl Git {
    /// Open the work tree containing `dir`. `hooks_dir`: an empty directory
    /// belay owns (created if missing), used as the hooks path.
    pub fn open(dir: &Path, hooks_dir: &Path) -> Result<Self, VcsError> {
        std::fs::create_dir_all(hooks_dir).map_err(|source| VcsError::Spawn {
            dir: hooks_dir.to_path_buf(),
            source,
        })?;
        let probe = Git {
            root: dir.to_path_buf(),
            hooks: hooks_dir.to_path_buf(),
        };
        let top = probe
            .run(&["rev-parse", "--show-toplevel"])
            .map_err(|_| VcsError::NotARepo(dir.to_path_buf()))?;
        Ok(Git {
            root: PathBuf::from(top.trim()),
            hooks: hooks_dir.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("git");
        c.env_clear();
        for k in ["PATH", "HOME", "LANG", "LC_ALL", "TZ"] {
            if let Ok(v) = std::env::var(k) {
                c.env(k, v);
            }
        }
        c.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .current_dir(&self.root)
            .arg("-c")
            .arg(format!("core.hooksPath={}", self.hooks.display()))
            .args(args);
        c
    }

    /// Run git; its stdout.
    pub fn run(&self, args: &[&str]) -> Result<String, VcsError> {
        let out = self
            .command(args)
            .output()
            .map_err(|source| VcsError::Spawn {
                dir: self.root.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(VcsError::Failed {
                dir: self.root.clone(),
                args: args.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn head(&self) -> Result<String, VcsError> {
        Ok(self.run(&["rev-parse", "HEAD"])?.trim().to_string())
    }

    /// Changed, staged or untracked paths (relative to the root), limited to
    /// `paths` when given.
    pub fn dirty(&self, paths: &[&str]) -> Result<Vec<String>, VcsError> {
        let mut args = vec!["status", "--porcelain=v1", "-z", "--untracked-files=all"];
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

    /// Stage everything except `exclude` (paths relative to the root); the
    /// staged paths.
    pub fn stage_all(&self, exclude: &[String]) -> Result<Vec<String>, VcsError> {
        let mut args: Vec<String> = vec!["add".into(), "-A".into(), "--".into(), ".".into()];
        for e in exclude {
            args.push(format!(":(exclude){e}"));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&refs)?;
        let staged = self.run(&["diff", "--cached", "--name-only", "-z"])?;
        Ok(staged
            .split('\0')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect())
    }

    /// The staged change as a patch (binary files as markers).
    pub fn staged_diff(&self) -> Result<String, VcsError> {
        // --text: a `-diff` attribute or a NUL byte cannot hide content.
        self.run(&[
            "diff",
            "--cached",
            "--text",
            "--no-textconv",
            "--no-color",
            "--no-ext-diff",
        ])
    }

    /// Undo staging (the work tree is untouched).
    pub fn unstage(&self) -> Result<(), VcsError> {
        self.run(&["reset", "-q"]).map(|_| ())
    }

    /// Commit what is staged.
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

    /// Stage everything except `exclude` and commit. `None` when there is
    /// nothing to commit.
    pub fn commit_all(
        &self,
        message: &str,
        exclude: &[String],
        author: Option<(&str, &str)>,
    ) -> Result<Option<Commit>, VcsError> {
        let files = self.stage_all(exclude)?;
        if files.is_empty() {
            return Ok(None);
        }
        let sha = self.commit_staged(message, author)?;
        Ok(Some(Commit { sha, files }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn repo() -> (tempfile::TempDir, Git) {
        let d = tempfile::tempdir().unwrap();
        let g = Command::new("git")
            .args(["init", "-q", "-b", "main"])
            .current_dir(d.path())
            .status()
            .unwrap();
        assert!(g.success());
        std::fs::write(d.path().join("a.txt"), "a\n").unwrap();
        let git = Git::open(d.path(), &d.path().join(".git/belay-no-hooks")).unwrap();
        git.commit_all("init", &[], Some(("t", "t@t")))
            .unwrap()
            .unwrap();
        (d, git)
    }

    #[test]
    fn dirty_lists_changes_and_untracked_files() {
        let (d, git) = repo();
        assert!(git.dirty(&[]).unwrap().is_empty());
        std::fs::write(d.path().join("a.txt"), "b\n").unwrap();
        std::fs::create_dir_all(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/new.txt"), "n\n").unwrap();
        let mut all = git.dirty(&[]).unwrap();
        all.sort();
        assert_eq!(all, vec!["a.txt", "sub/new.txt"]);
        assert_eq!(git.dirty(&["sub"]).unwrap(), vec!["sub/new.txt"]);
    }

    #[test]
    fn hooks_never_run_and_excludes_are_left_out() {
        let (d, git) = repo();
        let hook = d.path().join(".git/hooks/pre-commit");
        std::fs::write(
            &hook,
            "#!/bin/sh\ntouch \"$(git rev-parse --show-toplevel)/HOOK-RAN\"\nexit 1\n",
        )
        .unwrap();
        std::os::unix::fs::PermissionsExt::set_mode(
            &mut std::fs::metadata(&hook).unwrap().permissions(),
            0o755,
        );
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::write(d.path().join("code.txt"), "c\n").unwrap();
        std::fs::write(d.path().join("pipeline.yaml"), "x\n").unwrap();
        let c = git
            .commit_all("feat: code", &["pipeline.yaml".into()], None)
            .unwrap()
            .unwrap();
        assert_eq!(c.files, vec!["code.txt"]);
        assert!(!d.path().join("HOOK-RAN").exists());
        assert_eq!(git.dirty(&[]).unwrap(), vec!["pipeline.yaml"]);
        assert!(git
            .commit_all("nothing", &["pipeline.yaml".into()], None)
            .unwrap()
            .is_none());
    }
}
