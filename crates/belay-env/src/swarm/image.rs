//! `belay image worker`: the image a distributed batch's tasks run, built
//! offline (this belay binary on the default base image, no download), and
//! pushed to the registry the batch uses.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use belay_record::Redactor;
use belay_sandbox::{BuildRequest, ContainerRuntime, Network, PushReport};

use crate::EnvError;

/// What `belay image worker` made.
#[derive(Debug, Clone)]
pub struct WorkerImage {
    pub tag: String,
    pub id: String,
    pub pushed: Option<PushReport>,
}

/// Build `tag` from `base` with this binary as its entrypoint; push it when
/// the tag names a registry. `work_dir` holds the build context (removed after).
pub async fn build(
    rt: &dyn ContainerRuntime,
    base: &str,
    tag: &str,
    work_dir: &Path,
) -> Result<WorkerImage, EnvError> {
    if !rt.image_exists(base).await? {
        return Err(belay_sandbox::SandboxError::ImageMissing {
            image: base.to_string(),
            hint: "the worker image is belay on the base image: run `belay image bootstrap` first"
                .into(),
        }
        .into());
    }
    let exe =
        std::env::current_exe().map_err(|e| EnvError::io("cannot find", "the belay binary", e))?;
    fs_err::create_dir_all(work_dir).map_err(|e| EnvError::io("cannot create", work_dir, e))?;
    let result = async {
        let bin = work_dir.join("belay");
        // A hard link when the binary is on the same file system; else a copy.
        if std::fs::hard_link(&exe, &bin).is_err() {
            fs_err::copy(&exe, &bin).map_err(|e| EnvError::io("cannot copy", &exe, e))?;
        }
        let dockerfile = work_dir.join("Dockerfile");
        belay_record::atomic_write(
            &dockerfile,
            format!(
                "FROM {base}\nCOPY belay /usr/local/bin/belay\n# It must run on the base (its C library): every task would fail otherwise.\nRUN [\"/usr/local/bin/belay\", \"--version\"]\nENTRYPOINT [\"/usr/local/bin/belay\"]\n"
            )
            .as_bytes(),
        )?;
        let labels = BTreeMap::from([
            (belay_sandbox::labels::BELAY.to_string(), "true".to_string()),
            (belay_sandbox::labels::KIND.to_string(), "worker".to_string()),
            ("belay.version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ]);
        let id = rt
            .build(
                &BuildRequest {
                    dockerfile,
                    context_dir: work_dir.to_path_buf(),
                    tag: tag.to_string(),
                    labels,
                    timeout: Duration::from_secs(600),
                    log_path: work_dir.join("build.log"),
                    network: Network::None,
                },
                &Redactor::default(),
            )
            .await?;
        let pushed = match belay_sandbox::registry::registry_host(tag) {
            Some(_) => {
                let ops = rt.image_registry().ok_or_else(|| {
                    EnvError::Usage("pushing needs the Docker Engine API".into())
                })?;
                Some(ops.push(tag).await?)
            }
            None => None,
        };
        Ok(WorkerImage {
            tag: tag.to_string(),
            id,
            pushed,
        })
    }
    .await;
    let _ = fs_err::remove_dir_all(work_dir);
    result
}
