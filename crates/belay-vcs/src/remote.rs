//! Fetching and pushing. Credentials in a URL serve the transfer only: a
//! checkout's `origin` is left without them, and no error names them.

use std::path::Path;

use crate::{exec, Git, VcsError};

/// `url` as it may be shown or stored: without its userinfo.
fn shown(url: &str) -> String {
    belay_record::without_userinfo(url).unwrap_or_else(|| url.to_string())
}

impl Git {
    /// Make `dir` (created if missing) a new repository.
    pub async fn init(dir: &Path, hooks_dir: &Path) -> Result<Git, VcsError> {
        fs_err::create_dir_all(dir).map_err(|e| VcsError::io("create", dir, e))?;
        fs_err::create_dir_all(hooks_dir).map_err(|e| VcsError::io("create", hooks_dir, e))?;
        let mut c = exec::base_command(hooks_dir, &[]);
        c.current_dir(dir);
        exec::output(c, dir, &["init", "--quiet"], crate::DEFAULT_TIMEOUT).await?;
        Git::open(dir, hooks_dir).await
    }

    /// Git for a remote operation: the caller's remote environment (proxy
    /// settings) on top of the kept variables.
    async fn run_remote(&self, args: &[&str], url: &str) -> Result<String, VcsError> {
        let mut c = self.command_with(&self.remote_env).await?;
        if let Some(h) = &self.credential_helper {
            c.arg("-c").arg(format!("credential.helper={h}"));
        }
        exec::output(c, &self.root, args, self.timeout)
            .await
            .map_err(|e| match e {
                // git may echo the URL (with its credentials) in its stderr.
                VcsError::Failed { dir, args, stderr } => VcsError::Failed {
                    dir,
                    args: args.replace(url, &shown(url)),
                    stderr: stderr.replace(url, &shown(url)),
                },
                VcsError::Timeout { dir, args, secs } => VcsError::Timeout {
                    dir,
                    args: args.replace(url, &shown(url)),
                    secs,
                },
                e => e,
            })
    }

    /// Check out `reference` (a branch, a tag, or a full or short commit; the
    /// remote's HEAD when `None`) of `url` into `dir`, shallow where git can.
    /// Afterwards, and after a failure, `origin` is the URL without
    /// credentials.
    pub async fn checkout_remote(
        dir: &Path,
        hooks_dir: &Path,
        url: &str,
        reference: Option<&str>,
        timeout: std::time::Duration,
        remote_env: Vec<(String, String)>,
    ) -> Result<Git, VcsError> {
        let git = Git::init(dir, hooks_dir)
            .await?
            .with_timeout(timeout)
            .with_remote_env(remote_env);
        git.run(&["remote", "add", "origin", "--", url]).await?;
        let r = git.fetch_checkout(url, reference).await;
        if belay_record::without_userinfo(url).is_some() {
            git.run(&["remote", "set-url", "origin", "--", &shown(url)])
                .await?;
        }
        r.map(|_| git)
    }

    async fn fetch_checkout(&self, url: &str, reference: Option<&str>) -> Result<(), VcsError> {
        let wanted = reference.unwrap_or("HEAD");
        let shallow = self
            .run_remote(
                &[
                    "fetch",
                    "--quiet",
                    "--upload-pack=git-upload-pack",
                    "--depth",
                    "1",
                    "origin",
                    wanted,
                ],
                url,
            )
            .await;
        if shallow.is_ok() {
            self.run(&["checkout", "--quiet", "FETCH_HEAD"]).await?;
            return Ok(());
        }
        // A short commit cannot be fetched by name: fetch heads and tags
        // (without blobs), resolve it locally, then check it out.
        self.run_remote(
            &[
                "fetch",
                "--quiet",
                "--upload-pack=git-upload-pack",
                "--filter=blob:none",
                "origin",
                "+refs/heads/*:refs/remotes/origin/*",
                "+refs/tags/*:refs/tags/*",
            ],
            url,
        )
        .await?;
        let Some(sha) = self.resolve_commit(wanted).await? else {
            return Err(VcsError::NoSuchRevision {
                rev: wanted.to_string(),
                url: shown(url),
            });
        };
        self.run(&["checkout", "--quiet", &sha]).await?;
        Ok(())
    }

    /// Fetch `refspecs` from `remote`.
    pub async fn fetch(&self, remote: &str, refspecs: &[&str]) -> Result<(), VcsError> {
        let mut args = vec![
            "fetch",
            "--quiet",
            "--upload-pack=git-upload-pack",
            "--",
            remote,
        ];
        args.extend(refspecs);
        self.run_remote(&args, remote).await?;
        Ok(())
    }

    /// Push `refspec` to `remote` (a name or a URL). Never forced: a
    /// rejected push is an error to resolve by hand.
    pub async fn push(&self, remote: &str, refspec: &str) -> Result<(), VcsError> {
        self.run_remote(
            &["push", "--quiet", "--no-verify", "--", remote, refspec],
            remote,
        )
        .await?;
        Ok(())
    }
}
