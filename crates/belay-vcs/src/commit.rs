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

use crate::exec::{self, Watchdog};
use crate::{Commit, Git, VcsError};

/// Streams one staged blob (its path, its content) through a secret check;
/// the name of the secret found, if any.
pub type BlobScan = dyn FnMut(&str, &mut dyn Read) -> std::io::Result<Option<String>> + Send;

pub struct CommitRequest {
    pub message: String,
    pub author: Option<(String, String)>,
    /// Paths (relative to the root) left out of the commit.
    pub exclude: Vec<String>,
    /// Glob patterns (`**/.env`) left out of the commit.
    pub exclude_globs: Vec<String>,
    /// Commit even when nothing changed (an audit record).
    pub allow_empty: bool,
    /// Stage only these paths (relative to the root); empty: the whole tree.
    pub paths: Vec<String>,
    /// Gitlinks that may be committed: the submodules at the start of the run.
    pub submodules: Vec<String>,
    pub scan: Box<BlobScan>,
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
    /// A staged path (a file or directory name) holds a secret's value.
    SecretInName { name: String },
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
            Refusal::SecretInName { name } => write!(
                f,
                "a file or directory name in the change contains the value of secret `{name}`; nothing was committed. Rename it and rerun"
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
        let _ = fs_err::remove_dir_all(&self.dir);
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
        let p = self.run_blocking(&[], &["rev-parse", "--git-path", "objects"])?;
        let p = PathBuf::from(p.trim());
        Ok(if p.is_absolute() {
            p
        } else {
            self.root.join(p)
        })
    }

    /// Untracked directories that are repositories of their own (git lists
    /// one as `path/`). Streamed: the listing is never held whole.
    pub async fn embedded_repositories(&self) -> Result<Vec<String>, VcsError> {
        let git = self.clone();
        crate::blocking(move || git.embedded_blocking()).await
    }

    fn embedded_blocking(&self) -> Result<Vec<String>, VcsError> {
        let mut out = Vec::new();
        self.stream(
            &[],
            &["ls-files", "-z", "--others", "--exclude-standard"],
            |e| {
                if e.ends_with(b"/") {
                    out.push(String::from_utf8_lossy(&e[..e.len() - 1]).into_owned());
                }
                Ok(true)
            },
        )?;
        Ok(out)
    }

    /// The first `max` bytes git prints for `args` (diff drivers off), and
    /// whether it printed more; git is stopped once `max` is read, so a
    /// 300 MB patch costs `max` bytes, not 300 MB.
    pub(crate) fn capped_blocking(
        &self,
        args: &[&str],
        max: usize,
    ) -> Result<(Vec<u8>, bool), VcsError> {
        let args = exec::patch_safe(args);
        let mut child = self.spawn_piped(&[], &args, Stdio::null())?;
        let dog = Watchdog::start(child.id(), self.timeout);
        let io = |e| VcsError::io("read the output of git in", &self.root, e);
        let mut out = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            stdout
                .take(max as u64 + 1)
                .read_to_end(&mut out)
                .map_err(io)?;
        }
        let more = out.len() > max;
        if more {
            out.truncate(max);
            let _ = child.kill();
        }
        let status = child.wait().map_err(io)?;
        dog.check(&self.root, &args)?;
        if !more && !status.success() {
            return Err(exec::failed(&self.root, &args, String::new()));
        }
        Ok((out, more))
    }

    /// git with `env` and `args`, its stdout piped.
    fn spawn_piped(
        &self,
        env: &[(&str, &Path)],
        args: &[&str],
        stderr: Stdio,
    ) -> Result<std::process::Child, VcsError> {
        let mut c = self.command_blocking()?;
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|source| VcsError::Spawn {
                dir: self.root.clone(),
                source,
            })
    }

    /// Run git and hand each NUL-terminated entry of its output to `f`
    /// (which returns whether to go on), with bounded memory; stderr's tail
    /// goes into the error.
    fn stream(
        &self,
        env: &[(&str, &Path)],
        args: &[&str],
        mut f: impl FnMut(&[u8]) -> Result<bool, VcsError>,
    ) -> Result<(), VcsError> {
        let mut child = self.spawn_piped(env, args, Stdio::piped())?;
        let dog = Watchdog::start(child.id(), self.timeout);
        let err = child.stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut tail = Vec::new();
                let mut buf = [0u8; 8192];
                while let Ok(n) = e.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > 16 * 1024 {
                        tail.drain(..tail.len() - 8 * 1024);
                    }
                }
                String::from_utf8_lossy(&tail).trim().to_string()
            })
        });
        let io = |e| VcsError::io("read the output of git in", &self.root, e);
        let mut result = Ok(());
        if let Some(stdout) = child.stdout.take() {
            let mut r = BufReader::with_capacity(64 * 1024, stdout);
            let mut entry = Vec::new();
            loop {
                entry.clear();
                match r.read_until(0, &mut entry) {
                    Ok(0) => break,
                    Ok(_) => {
                        if entry.last() == Some(&0) {
                            entry.pop();
                        }
                        match f(&entry) {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        result = Err(io(e));
                        break;
                    }
                }
            }
        }
        if result.is_err() {
            let _ = child.kill();
        }
        let status = child.wait().map_err(io)?;
        let stderr = err.and_then(|t| t.join().ok()).unwrap_or_default();
        dog.check(&self.root, args)?;
        result?;
        if !status.success() {
            return Err(exec::failed(&self.root, args, stderr));
        }
        Ok(())
    }

    /// Stage everything but the excludes, check it, and commit it. The
    /// checks stream on the blocking pool; every git in them has the deadline.
    pub async fn commit_checked(&self, req: CommitRequest) -> Result<CommitOutcome, VcsError> {
        let git = self.clone();
        crate::blocking(move || git.commit_blocking(req)).await
    }

    fn commit_blocking(&self, mut req: CommitRequest) -> Result<CommitOutcome, VcsError> {
        let embedded = self.embedded_blocking()?;
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
        let mut args: Vec<String> = vec!["add".into(), "-A".into(), "--".into()];
        if req.paths.is_empty() {
            args.push(".".into());
        } else {
            args.extend(req.paths.iter().map(|p| format!(":(literal){p}")));
        }
        for e in &req.exclude {
            args.push(format!(":(exclude,literal){e}"));
        }
        for g in &req.exclude_globs {
            args.push(format!(":(exclude,glob){g}"));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run_blocking(&env, &refs)?;
        let mut links = Vec::new();
        self.stream(&env, &["ls-files", "-s", "-z"], |e| {
            if e.starts_with(b"160000 ") {
                if let Some(i) = e.iter().position(|b| *b == b'\t') {
                    let p = String::from_utf8_lossy(&e[i + 1..]).into_owned();
                    if !req.submodules.contains(&p) {
                        links.push(p);
                    }
                }
            }
            Ok(true)
        })?;
        if !links.is_empty() {
            return Ok(CommitOutcome::Refused(Refusal::Gitlink(links)));
        }
        let base = if self
            .run_blocking(&[], &["rev-parse", "-q", "--verify", "HEAD^{commit}"])
            .is_ok()
        {
            "HEAD"
        } else {
            // The empty tree: the first commit of a repository.
            "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        };
        // Each staged change is checked as it is listed: its name, then its
        // blob through `cat-file --batch`. Nothing is held but the first
        // names (for the record) and one chunk of one blob.
        let mut batch = BlobReader::start(self, &env)?;
        let mut files = Vec::new();
        let mut total = 0usize;
        let mut meta: Option<Vec<u8>> = None;
        let mut refusal = None;
        self.stream(
            &env,
            &[
                "diff-index",
                "--cached",
                "--raw",
                "-z",
                "--no-renames",
                base,
            ],
            |e| {
                let Some(m) = meta.take() else {
                    meta = Some(e.to_vec());
                    return Ok(true);
                };
                let path = String::from_utf8_lossy(e).into_owned();
                total += 1;
                if files.len() < MAX_LISTED {
                    files.push(path.clone());
                }
                let found = (req.scan)(&path, &mut path.as_bytes())
                    .map_err(|e| VcsError::io("check", &self.root, e))?;
                if let Some(name) = found {
                    refusal = Some(Refusal::SecretInName { name });
                    return Ok(false);
                }
                // `:old_mode new_mode old_sha new_sha status`
                let m = String::from_utf8_lossy(&m).into_owned();
                let f: Vec<&str> = m.trim_start_matches(':').split(' ').collect();
                if f.len() >= 5 && !f[4].starts_with('D') && f[1] != "160000" {
                    if let Some(name) = batch.scan(f[3], &path, &mut *req.scan)? {
                        refusal = Some(Refusal::Secret { name, path });
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )?;
        batch.finish();
        if let Some(r) = refusal {
            return Ok(CommitOutcome::Refused(r));
        }
        if total == 0 && !req.allow_empty {
            return Ok(CommitOutcome::Nothing);
        }
        stage.publish_to(self, &objects)?;
        let configured = self.run_blocking(&[], &["config", "user.email"]).is_ok();
        let author = req.author.as_ref().map(|(n, e)| (n.as_str(), e.as_str()));
        let mut args = crate::commit_args(&req.message, author, configured);
        if total == 0 {
            args.push("--allow-empty".into());
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run_blocking(&[], &refs)?;
        let sha = self
            .run_blocking(&[], &["rev-parse", "HEAD"])?
            .trim()
            .to_string();
        Ok(CommitOutcome::Committed(Commit {
            sha,
            files,
            files_total: total,
        }))
    }
}

/// How many changed paths a [`Commit`] lists (the count is always whole).
pub const MAX_LISTED: usize = 1000;

/// `git cat-file --batch`, one blob at a time.
struct BlobReader {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: BufReader<std::process::ChildStdout>,
    root: PathBuf,
    _dog: Watchdog,
}

impl BlobReader {
    fn start(git: &Git, env: &[(&str, &Path)]) -> Result<BlobReader, VcsError> {
        let mut c = git.command_blocking()?;
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
                dir: git.root.clone(),
                source,
            })?;
        let broken = || {
            VcsError::io(
                "start git cat-file in",
                &git.root,
                std::io::ErrorKind::BrokenPipe.into(),
            )
        };
        let stdin = child.stdin.take().ok_or_else(broken)?;
        let stdout = child.stdout.take().ok_or_else(broken)?;
        let dog = Watchdog::start(child.id(), git.timeout);
        Ok(BlobReader {
            child,
            stdin,
            out: BufReader::with_capacity(256 * 1024, stdout),
            root: git.root.clone(),
            _dog: dog,
        })
    }

    /// Stream one blob through the scan; the secret found, if any.
    fn scan(
        &mut self,
        sha: &str,
        path: &str,
        scan: &mut BlobScan,
    ) -> Result<Option<String>, VcsError> {
        let io = |e| VcsError::io("read staged blobs of", &self.root, e);
        writeln!(self.stdin, "{sha}").map_err(io)?;
        self.stdin.flush().map_err(io)?;
        let mut header = String::new();
        self.out.read_line(&mut header).map_err(io)?;
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
        let mut body = (&mut self.out).take(size);
        let found = scan(path, &mut body).map_err(io)?;
        std::io::copy(&mut body, &mut std::io::sink()).map_err(io)?;
        let mut nl = [0u8; 1];
        self.out.read_exact(&mut nl).map_err(io)?;
        Ok(found)
    }

    fn finish(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
