//! The layout of `<state-dir>/runs/<run-id>/`.

use std::path::{Path, PathBuf};

use crate::EnvError;

#[derive(Debug, Clone)]
pub struct RunDir {
    pub state_dir: PathBuf,
    pub run_id: String,
    pub root: PathBuf,
}

impl RunDir {
    pub fn new(state_dir: &Path, run_id: &str) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            run_id: run_id.to_string(),
            root: state_dir.join("runs").join(run_id),
        }
    }

    /// Refuse the run's directories when they lie inside `repo` (the default
    /// `<repo>/.belay`) behind a link or a non-directory the repository
    /// ships ([`check_in_repo`]). Call before [`RunDir::create`].
    pub fn check_in_repo(&self, repo: &Path) -> Result<(), EnvError> {
        for d in [
            self.blocks_dir(),
            self.scripts_dir(),
            self.logs_dir(),
            machine_cache_dir(&self.state_dir),
        ] {
            check_in_repo(repo, &d, "--state-dir")?;
        }
        Ok(())
    }

    /// Create the directory tree, failing with a clear message when the state
    /// directory cannot be written.
    pub fn create(&self) -> Result<(), EnvError> {
        for d in [
            self.root.clone(),
            self.blocks_dir(),
            self.scripts_dir(),
            self.logs_dir(),
        ] {
            fs_err::create_dir_all(&d).map_err(|e| EnvError::StateDir {
                path: self.state_dir.clone(),
                reason: format!("cannot create {}: {e}", d.display()),
            })?;
        }
        let probe = self.root.join(".write-test");
        fs_err::write(&probe, b"ok").map_err(|e| EnvError::StateDir {
            path: self.state_dir.clone(),
            reason: format!("cannot write in {}: {e}", self.root.display()),
        })?;
        let _ = fs_err::remove_file(probe);
        Ok(())
    }

    pub fn context(&self) -> PathBuf {
        self.root.join("context.json")
    }
    pub fn blocks_dir(&self) -> PathBuf {
        self.root.join("blocks")
    }
    pub fn scripts_dir(&self) -> PathBuf {
        self.root.join("scripts")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn executions(&self) -> PathBuf {
        self.root.join("executions.jsonl")
    }
    /// The checkpoints as they are made (and retired by a rollback).
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints.jsonl")
    }
    pub fn containers(&self) -> PathBuf {
        self.root.join("containers.jsonl")
    }
    pub fn llm_usage(&self) -> PathBuf {
        self.root.join("llm-usage.json")
    }
    pub fn manifest(&self) -> PathBuf {
        self.root.join("manifest.json")
    }
    pub fn dockerfile(&self) -> PathBuf {
        self.root.join("Dockerfile")
    }
    /// The written Dockerfile for the legacy builder (no `RUN --mount`).
    pub fn dockerfile_legacy(&self) -> PathBuf {
        self.root.join("Dockerfile.legacy")
    }
    pub fn ca_bundle(&self) -> PathBuf {
        self.root.join("belay-ca.crt")
    }
    pub fn lock(&self) -> PathBuf {
        self.root.join("run.lock")
    }
    /// `logs/<block>/<phase>-attempt-N.log`
    pub fn log_path(&self, block: &str, phase: &str, attempt: u32) -> PathBuf {
        self.logs_dir()
            .join(block)
            .join(format!("{phase}-attempt-{attempt}.log"))
    }
}

/// Refuse to write in `dir` when it lies inside `repo` (absolute, as
/// `analyze` resolves it) and a part of it between the two that exists is a
/// link or not a directory. A repository is untrusted: its `.belay ->
/// /host/dir` would otherwise receive belay's state. Parts that do not exist
/// yet are fine (belay creates them as directories); a `dir` outside the
/// repository is the user's choice and is not checked. `flag` is the option
/// that moves the directory elsewhere.
pub fn check_in_repo(repo: &Path, dir: &Path, flag: &'static str) -> Result<(), EnvError> {
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Ok(rest) = abs.strip_prefix(repo) else {
        return Ok(());
    };
    let mut part = repo.to_path_buf();
    for c in rest.components() {
        part.push(c);
        match part_kind(&part) {
            Part::Dir => {}
            Part::Missing => return Ok(()),
            Part::Refused(reason) => return Err(link_in_repo(repo, dir, part, reason, flag)),
        }
    }
    Ok(())
}

/// What a part of a directory path inside the repository is.
enum Part {
    /// A real directory.
    Dir,
    /// Not there yet: belay creates it, and what is below it, as directories.
    Missing,
    /// A link, not a directory, or unreadable: why.
    Refused(String),
}

fn part_kind(p: &Path) -> Part {
    match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Part::Missing,
        Err(e) => Part::Refused(format!("unreadable ({e})")),
        Ok(m) if m.file_type().is_symlink() => Part::Refused("a symbolic link".into()),
        Ok(m) if !m.is_dir() => Part::Refused("not a directory".into()),
        Ok(_) => Part::Dir,
    }
}

fn link_in_repo(
    repo: &Path,
    dir: &Path,
    part: PathBuf,
    reason: String,
    flag: &'static str,
) -> EnvError {
    EnvError::LinkInRepo {
        path: dir.to_path_buf(),
        repo: repo.to_path_buf(),
        part,
        reason,
        flag,
    }
}

/// The machine's cache directory (preflight results, passed oracles, the
/// Debian Contents index, the package download caches): `$BELAY_CACHE_DIR`,
/// else `$XDG_CACHE_HOME/belay`, else `~/.cache/belay`, else
/// `<state-dir>/cache`.
pub fn machine_cache_dir(state_dir: &Path) -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("BELAY_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("belay")))
        .or_else(|| env("HOME").map(|h| h.join(".cache").join("belay")))
        .unwrap_or_else(|| state_dir.join("cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let repo = d.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        let repo = repo.canonicalize().unwrap();
        (d, repo)
    }

    #[test]
    fn a_belay_link_shipped_by_the_repository_is_refused() {
        let (d, repo) = repo();
        let outside = d.path().join("host-dir");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, repo.join(".belay")).unwrap();
        let dir = RunDir::new(&repo.join(".belay"), "r1");
        let err = dir.check_in_repo(&repo).unwrap_err();
        assert!(matches!(err, EnvError::LinkInRepo { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("symbolic link") && msg.contains("--state-dir"),
            "{msg}"
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn a_link_or_file_deeper_in_the_state_dir_is_refused() {
        let (_d, repo) = repo();
        std::fs::create_dir_all(repo.join(".belay")).unwrap();
        std::os::unix::fs::symlink("/tmp", repo.join(".belay/runs")).unwrap();
        let dir = RunDir::new(&repo.join(".belay"), "r1");
        assert!(matches!(
            dir.check_in_repo(&repo),
            Err(EnvError::LinkInRepo { .. })
        ));
        std::fs::remove_file(repo.join(".belay/runs")).unwrap();
        std::fs::write(repo.join(".belay/runs"), "x").unwrap();
        let err = check_in_repo(&repo, &dir.blocks_dir(), "--out").unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        assert!(err.to_string().contains("--out"), "{err}");
    }

    #[test]
    fn real_missing_or_outside_directories_pass() {
        let (d, repo) = repo();
        let dir = RunDir::new(&repo.join(".belay"), "r1");
        dir.check_in_repo(&repo).unwrap();
        dir.create().unwrap();
        dir.check_in_repo(&repo).unwrap();
        let link = d.path().join("state-link");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        check_in_repo(&repo, &link.join("state"), "--state-dir").unwrap();
    }
}
