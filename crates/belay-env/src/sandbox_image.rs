//! Which image a mode's sandboxes run in: what the user named (an image, or
//! the run id of an env build), else the repository's latest successful env
//! build, else the default base image.
//!
//! An env build's final image is found by its labels (`belay.run`), which
//! belay set when it committed the image and nothing in a sandbox can
//! change, never through the run's manifest (which may sit in the work tree
//! an agent writes).

use std::path::Path;

use belay_record::{Mode, Registry, RunEntry, RunStatus};
use belay_sandbox::ContainerRuntime;

use crate::EnvError;

/// Where the image came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// `--image IMAGE` as given.
    Named,
    /// The final image of env build `run_id` (named by its run id, or the
    /// repository's latest).
    EnvBuild { run_id: String, latest: bool },
    /// Nothing named and no env build of the repository: the default.
    Default,
    /// The repository's latest env build lacks a program the mode needs
    /// (round agents commit with git): the default.
    Lacking {
        run_id: String,
        missing: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxImage {
    pub image: String,
    pub source: ImageSource,
}

impl SandboxImage {
    /// One line for the terminal: which image, and why.
    pub fn describe(&self) -> String {
        match &self.source {
            ImageSource::Named => format!("sandbox image {}", self.image),
            ImageSource::EnvBuild { run_id, latest } => format!(
                "sandbox image {} ({}env build {run_id})",
                self.image,
                if *latest {
                    "the repository's latest "
                } else {
                    ""
                }
            ),
            ImageSource::Lacking { run_id, missing } => format!(
                "sandbox image {}: the repository's env build {run_id} has no {} on PATH, which this mode needs (add it to the env build's system packages to work in it)",
                self.image,
                missing.join(", ")
            ),
            ImageSource::Default => format!(
                "sandbox image {} (no env build of this repository: `belay env build --repo .` makes one with the project's environment)",
                self.image
            ),
        }
    }
}

/// The final image of env build `e`, if it is on this engine: the image id
/// its run recorded (its `<prefix>:<run>-final` tag when that still names
/// the same image; another build with the same run id may have moved it).
async fn final_image(rt: &dyn ContainerRuntime, e: &RunEntry) -> Option<String> {
    let id = e.artifact.as_deref()?;
    let info = rt.image(id).await.ok()??;
    let tag = format!("{}-final", e.run_id);
    Some(
        info.tags
            .into_iter()
            .find(|t| belay_sandbox::split_image_ref(t).1 == tag)
            .unwrap_or(info.id),
    )
}

/// Whether the work tree at `repo` is the repository env build `e` was made
/// from: the commit it was built at is in the history of what is checked
/// out now (a build of an unrelated repository at the same path is not).
async fn same_lineage(repo: &Path, e: &RunEntry) -> bool {
    let Some(built) = e.commit.as_deref() else {
        // Built from a directory that was no repository: the path is all.
        return true;
    };
    let hooks = belay_record::no_hooks_dir();
    let Ok(git) = belay_vcs::Git::open(repo, &hooks).await else {
        return false;
    };
    git.is_ancestor(built, "HEAD").await.unwrap_or(false)
}

/// The image for a mode working on `repo`: `named` (an image, or an env
/// build's run id), else the repository's latest successful env build whose
/// final image is on this engine and has the programs in `needs`, else
/// `default`.
pub async fn resolve(
    rt: &dyn ContainerRuntime,
    registry: &Registry,
    repo: &Path,
    named: Option<&str>,
    default: &str,
    needs: &[&str],
) -> Result<SandboxImage, EnvError> {
    let runs = registry.list().unwrap_or_default();
    if let Some(n) = named {
        let env_run = runs.iter().find(|e| e.mode == Mode::Env && e.run_id == n);
        if let Some(e) = env_run {
            if e.status != RunStatus::Ok {
                return Err(EnvError::Usage(format!(
                    "env build {n} did not succeed ({}): its image is no environment to work in; pass another run id or an image",
                    e.status.as_str()
                )));
            }
            let Some(image) = final_image(rt, e).await else {
                return Err(EnvError::Usage(format!(
                    "the final image of env build {n} is not on this Docker engine (removed by `belay env gc`?): run `belay env build` again, or pass an image"
                )));
            };
            return Ok(SandboxImage {
                image,
                source: ImageSource::EnvBuild {
                    run_id: n.into(),
                    latest: false,
                },
            });
        }
        return Ok(SandboxImage {
            image: n.into(),
            source: ImageSource::Named,
        });
    }
    let repo = fs_err::canonicalize(repo).unwrap_or_else(|_| repo.to_path_buf());
    // Newest first: the first that succeeded and whose image is still here.
    for e in runs.iter().filter(|e| {
        e.mode == Mode::Env && e.status == RunStatus::Ok && e.repo.as_deref() == Some(&repo)
    }) {
        let Some(image) = final_image(rt, e).await else {
            continue;
        };
        if !same_lineage(&repo, e).await {
            continue;
        }
        if !needs.is_empty() {
            let probe = belay_sandbox::envimage::probe(
                rt,
                &image,
                &e.run_id,
                crate::REPO_DIR,
                Some(&belay_sandbox::envimage::probe_cache()),
                &belay_record::Redactor::default(),
            )
            .await?;
            let missing: Vec<String> = needs
                .iter()
                .filter(|n| !probe.tools.iter().any(|t| t == *n))
                .map(|n| n.to_string())
                .collect();
            if !missing.is_empty() {
                return Ok(SandboxImage {
                    image: default.into(),
                    source: ImageSource::Lacking {
                        run_id: e.run_id.clone(),
                        missing,
                    },
                });
            }
        }
        return Ok(SandboxImage {
            image,
            source: ImageSource::EnvBuild {
                run_id: e.run_id.clone(),
                latest: true,
            },
        });
    }
    Ok(SandboxImage {
        image: default.into(),
        source: ImageSource::Default,
    })
}
