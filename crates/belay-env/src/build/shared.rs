//! What the checkpoint store shares through `--registry` besides its
//! checkpoints (which `checkpoints.rs` pushes as they are made): the base
//! image a build starts from, the final image, a checkpoint only the registry
//! has, and the wait for the push queue at the end.

use belay_sandbox::SandboxError;

use crate::registry_store::RegistryReport;
use crate::EnvError;

use super::CheckpointStore;

impl CheckpointStore<'_> {
    /// The base image is missing on this engine: pull it from the registry
    /// (under the registry's name for it) and give it its local name.
    /// `Ok(None)`: no registry, or it does not have it either; else the name
    /// it was pulled under.
    pub(crate) async fn pull_shared_base(
        &mut self,
        image: &str,
    ) -> Result<Option<String>, EnvError> {
        let Some(store) = self.registry.as_mut() else {
            return Ok(None);
        };
        let remote = store.remote_name(image);
        if !store.pull(&remote, "base").await? {
            return Ok(None);
        }
        if remote != image {
            store.tag(&remote, image).await?;
        }
        Ok(Some(remote))
    }

    /// Queue the base image for the registry, so that an engine without it
    /// (another machine, a cluster node) starts from the same image, and so
    /// from the same cache keys. Layers the registry has are not sent again.
    /// A base the registry already has (the same image id under the same
    /// name) is not pushed again.
    pub(crate) async fn share_base(&mut self, base: &str) -> Result<(), EnvError> {
        if self.registry.is_none() {
            return Ok(());
        }
        let id = self.image_id(base).await?;
        let Some(store) = self.registry.as_mut() else {
            return Ok(());
        };
        let remote = store.remote_name(base);
        if store.remote_id(&remote).await.as_deref() == Some(id.as_str()) {
            return Ok(());
        }
        if remote != base {
            store.tag(base, &remote).await?;
        }
        store.push(&remote, None, None);
        Ok(())
    }

    /// Make a checkpoint that is only in the registry (a hit read there)
    /// present on this engine: one pull of the key it was found under
    /// (the run's own name may still be queued), named as the checkpoint.
    /// `true` when it was pulled.
    pub(crate) async fn ensure_local(&mut self, image_ref: &str) -> Result<bool, EnvError> {
        let Some((src, image)) = self.remote_only.remove(image_ref) else {
            return Ok(false);
        };
        let Some(store) = self.registry.as_mut() else {
            return Ok(false);
        };
        // By the digest that was read and checked: the key's tag may have
        // moved since (another build re-pushed it, gc removed it), and the
        // key's name is the push queue's to use.
        let repo = belay_sandbox::split_image_ref(&src).0;
        let pinned = format!("{repo}@{}", image.digest);
        if !store.pull(&pinned, "cache").await? {
            return Err(SandboxError::ImageMissing {
                image: pinned,
                hint: "the registry lost this cache entry after the build found it there; rerun to rebuild it".into(),
            }
            .into());
        }
        let got = self.rt.image(&pinned).await?.map(|i| i.id);
        if got.as_deref() != Some(image.id.as_str()) {
            return Err(SandboxError::ImageMissing {
                image: pinned,
                hint: format!(
                    "the pulled image is {}, not the {} the registry's manifest named; rerun to rebuild it",
                    got.unwrap_or_default(),
                    image.id
                ),
            }
            .into());
        }
        self.rt.tag_image(&image.id, image_ref).await?;
        // The digest reference is the pull's, not a name gc knows.
        if let Some(store) = self.registry.as_ref() {
            store.forget(&pinned).await;
        }
        Ok(true)
    }

    /// Name the final image in the registry only, when its source is there
    /// (no pull, no push). `false` when it must be made on the engine.
    pub(crate) fn final_in_registry(&mut self, source: &str, final_ref: &str) -> bool {
        let (Some((src, image)), Some(store)) =
            (self.remote_only.get(source), self.registry.as_mut())
        else {
            return false;
        };
        store.tag_remote(src, image, final_ref);
        true
    }

    /// Queue the final image for the registry.
    pub(crate) fn share_final(&mut self, final_ref: &str) {
        if let Some(store) = self.registry.as_mut() {
            store.push(final_ref, None, None);
        }
    }

    /// Wait for the pushes still queued: the registry's report, and the
    /// first push that failed. `None` without a registry.
    pub(crate) async fn finish_pushes(&mut self) -> Option<(RegistryReport, Option<String>)> {
        let store = self.registry.as_mut()?;
        Some(store.finish().await)
    }
}
