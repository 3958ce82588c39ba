//! The commit point: stage, check, and only then let objects reach the
//! repository.
//!
//! Staging goes to a temporary index and a temporary object directory inside
//! the git dir (the real objects are an alternate, so nothing is copied). The
//! checks then read what would be committed:
//!
//! 1. no embedded repository among the untracked paths (git shows one as
//!    `path/`), and no gitlink (mode 160000) in the staged tree that is not a
//!    submodule of `.gitmodules` at the start of the run: a nested `.git`
//!    staged as a gitlink makes every later `git status` on the host read the
//!    nested repository's config, whose `core.fsmonitor` is a command;
//! 2. no secret in any staged blob, in any of its matched forms, read by
//!    `git cat-file --batch` and streamed through the caller's scanner (the
//!    memory held is one chunk, however large the change).
//!
//! A refused commit deletes the temporary directory: no blob holding a secret
//! is left in `.git/objects`. An accepted one moves the new objects in,
//! replaces the index with the staged one, and commits.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::{Commit, Git, VcsError};

/// Streams one staged blob (its path, its content) through a secret check;
/// the name of the secret found, if any.
pub type BlobScan<'a> = dyn FnMut(&str, &mut dyn Read) -> std::io::Result<Option<String>> + 'a;

pub struct CommitRequest<'a> {
    pub message: &'a str,
    pub author: Option<(&'a str, &'a str)>,
    /// Paths (relative to the root) left out of the commit.
    pub exclude: &'a [String],
    /// Gitlinks that may be committed: the submodules at the start of the run.
    pub submodules: &'a [String],
    pub scan: &'a mut BlobScan<'a>,
}

/// Why a commit was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Directories holding their own `.git`.
    EmbeddedRepository(Vec<String>),
    /// Gitlinks that are not submodules of the repository.
    Gitlink(Vec<String>),
    /// A staged file holds a secret's value (or an encoding of it).
    Secret { name: String, path: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::EmbeddedRepository(p) => write!(
                f,
                "the change holds an embedded git repository ({}): a nested .git would let its config run commands in every later git on the host. Remove it, or add it as a submodule outside the run",
                p.join(", ")
            ),
            Refusal::Gitlink(p) => write!(
                f,
                "the change adds gitlinks that are not submodules in .gitmodules at the start ({}); nothing was committed",
                p.join(", ")
            ),
            Refusal::Secret { name, path } => write!(
                f,
                "the change contains the value of secret `{name}` (in {path}); nothing was committed and no object holding it was kept. Remove it from the files and rerun"
            ),
        }
    }
}

#[derive(Debug)]
pub enum CommitOutcome {
    Committed(Commit),
    Nothing,
    Refused(Refusal),
}

/// The temporary index and object directory; removed when dropped.
struct Stage {
    dir: PathBuf,
    index: PathBuf,
    objects: PathBuf,
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Stage {
    fn new(git: &Git) -> Result<Stage, VcsError> {
        let dir = git.git_dir().join(format!(
            "belay-stage-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let objects = dir.join("objects");
        fs_err::create_dir_all(&objects).map_err(|e| VcsError::io("create", &objects, e))?;
        let index = dir.join("index");
        let real = git.git_dir().join("index");
        if real.is_file() {
            fs_err::copy(&real, &index).map_err(|e| VcsError::io("copy", &real, e))?;
        }
        Ok(Stage {
            dir,
            index,
            objects,
        })
    }
}

impl Git {
    fn objects_dir(&self) -> Result<PathBuf, VcsError> {
        let p = self.run(&["rev-parse", "--git-path", "objects"])?;
        let p = PathBuf::from(p.trim());
        Ok(if p.is_absolute() {
            p
        } else {
            self.root.join(p)
        })
    }

    /// Untracked directories that are repositories of their own.
    pub fn embedded_repositories(&self) -> Result<Vec<String>, VcsError> {
        let out = self.run(&["ls-files", "-z", "--others", "--exclude-standard"])?;
        Ok(out
            .split('\0')
            .filter(|p| p.ends_with('/'))
            .map(|p| p.trim_end_matches('/').to_string())
            .collect())
    }

    /// Stage everything but the excludes, check it, and commit it.
    pub fn commit_checked(&self, req: CommitRequest<'_>) -> Result<CommitOutcome, VcsError> {
        let embedded = self.embedded_repositories()?;
        if !embedded.is_empty() {
            return Ok(CommitOutcome::Refused(Refusal::EmbeddedRepository(
                embedded,
            )));
        }
        let objects = self.objects_dir()?;
        let stage = Stage::new(self)?;
        let env = [
            ("GIT_INDEX_FILE", stage.index.as_path()),
            ("GIT_OBJECT_DIRECTORY", stage.objects.as_path()),
            ("GIT_ALTERNATE_OBJECT_DIRECTORIES", objects.as_path()),
        ];
        let mut args: Vec<String> = vec!["add".into(), "-A".into(), "--".into(), ".".into()];
        for e in req.exclude {
            args.push(format!(":(exclude,literal){e}"));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run_env(&env, &refs)?;
        let listing = self.run_env(&env, &["ls-files", "-s", "-z"])?;
        let links: Vec<String> = listing
            .split('\0')
            .filter_map(|e| e.split_once('\t'))
            .filter(|(meta, _)| meta.starts_with("160000 "))
            .map(|(_, p)| p.to_string())
            .filter(|p| !req.submodules.contains(p))
            .collect();
        if !links.is_empty() {
            return Ok(CommitOutcome::Refused(Refusal::Gitlink(links)));
        }
        let base = if self
            .run(&["rev-parse", "-q", "--verify", "HEAD^{commit}"])
            .is_ok()
        {
            "HEAD"
        } else {
            // The empty tree: the first commit of a repository.
            "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        };
        let raw = self.run_env(
            &env,
            &[
                "diff-index",
                "--cached",
                "--raw",
                "-z",
                "--no-renames",
                base,
            ],
        )?;
        let mut files = Vec::new();
        let mut blobs = Vec::new();
        let mut it = raw.split('\0');
        while let Some(meta) = it.next() {
            if meta.is_empty() {
                continue;
            }
            let Some(path) = it.next() else { break };
            files.push(path.to_string());
            // `:old_mode new_mode old_sha new_sha status`
            let f: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
            if f.len() >= 5 && !f[4].starts_with('D') && f[1] != "160000" {
                blobs.push((f[3].to_string(), path.to_string()));
            }
        }
        if files.is_empty() {
            return Ok(CommitOutcome::Nothing);
        }
        if let Some(r) = self.scan_blobs(&env, &blobs, req.scan)? {
            return Ok(CommitOutcome::Refused(r));
        }
        stage.publish_to(self, &objects)?;
        let sha = self.commit_staged(req.message, req.author)?;
        Ok(CommitOutcome::Committed(Commit { sha, files }))
    }

    /// Stream each blob through the scan; the first secret found.
    fn scan_blobs(
        &self,
        env: &[(&str, &Path)],
        blobs: &[(String, String)],
        scan: &mut BlobScan<'_>,
    ) -> Result<Option<Refusal>, VcsError> {
        if blobs.is_empty() {
            return Ok(None);
        }
        let mut c = self.command()?;
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c
            .args(["cat-file", "--batch"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| VcsError::Spawn {
                dir: self.root.clone(),
                source,
            })?;
        let result = (|| -> Result<Option<Refusal>, VcsError> {
            let io = |e| VcsError::io("read staged blobs of", &self.root, e);
            let mut stdin = child
                .stdin
                .take()
                .ok_or_else(|| io(std::io::ErrorKind::BrokenPipe.into()))?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| io(std::io::ErrorKind::BrokenPipe.into()))?;
            let mut out = BufReader::with_capacity(256 * 1024, stdout);
            for (sha, path) in blobs {
                writeln!(stdin, "{sha}").map_err(io)?;
                stdin.flush().map_err(io)?;
                let mut header = String::new();
                out.read_line(&mut header).map_err(io)?;
                // `<sha> blob <size>`, or `<sha> missing`.
                let size: u64 = header
                    .split_whitespace()
                    .nth(2)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| VcsError::Failed {
                        dir: self.root.clone(),
                        args: "cat-file --batch".into(),
                        stderr: format!("unexpected answer for {path}: {}", header.trim()),
                    })?;
                let mut body = (&mut out).take(size);
                let found = scan(path, &mut body).map_err(io)?;
                std::io::copy(&mut body, &mut std::io::sink()).map_err(io)?;
                let mut nl = [0u8; 1];
                out.read_exact(&mut nl).map_err(io)?;
                if let Some(name) = found {
                    return Ok(Some(Refusal::Secret {
                        name,
                        path: path.clone(),
                    }));
                }
            }
            Ok(None)
        })();
        let _ = child.kill();
        let _ = child.wait();
        result
    }
}

impl Stage {
    /// Move the staged objects into the repository's object directory and
    /// make the staged index the real one.
    fn publish_to(&self, git: &Git, objects: &Path) -> Result<(), VcsError> {
        let rd =
            fs_err::read_dir(&self.objects).map_err(|e| VcsError::io("read", &self.objects, e))?;
        for sub in rd.flatten() {
            let target_dir = objects.join(sub.file_name());
            fs_err::create_dir_all(&target_dir)
                .map_err(|e| VcsError::io("create", &target_dir, e))?;
            let files =
                fs_err::read_dir(sub.path()).map_err(|e| VcsError::io("read", &sub.path(), e))?;
            for f in files.flatten() {
                let to = target_dir.join(f.file_name());
                if to.exists() {
                    continue;
                }
                fs_err::rename(f.path(), &to).map_err(|e| VcsError::io("move", &to, e))?;
            }
        }
        let index = git.git_dir().join("index");
        fs_err::rename(&self.index, &index).map_err(|e| VcsError::io("replace", &index, e))
    }
}
