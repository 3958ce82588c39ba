//! What a build shares through `--registry` besides its checkpoints (which
//! `checkpoints.rs` pushes as they are made): the base image it starts from,
//! the final image, and the wait for the push queue at the end.

use super::*;

impl Run<'_> {
    /// The base image is missing on this engine: pull it from the registry
    /// (under the registry's name for it) and give it its local name.
    /// `Ok(false)`: no registry, or it does not have it either.
    pub(super) async fn pull_shared_base(&mut self, image: &str) -> Result<bool, EnvError> {
        let Some(store) = self.registry.as_mut() else {
            return Ok(false);
        };
        let remote = store.remote_name(image);
        if !store.pull(&remote, "base").await? {
            return Ok(false);
        }
        if remote != image {
            store.tag(&remote, image).await?;
        }
        self.phase("base", format!("{image} pulled from {remote}"));
        Ok(true)
    }

    /// Queue the base image for the registry, so that an engine without it
    /// (another machine, a cluster node) starts from the same image, and so
    /// from the same cache keys. Layers the registry has are not sent again.
    /// A base the registry already has (the same image id under the same
    /// name) is not pushed again.
    pub(super) async fn share_base(&mut self, base: &str) -> Result<(), EnvError> {
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
    pub(super) async fn ensure_local(&mut self, image_ref: &str) -> Result<(), EnvError> {
        let Some((src, image)) = self.remote_only.remove(image_ref) else {
            return Ok(());
        };
        let Some(store) = self.registry.as_mut() else {
            return Ok(());
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
        self.phase("registry", format!("pulled {image_ref}"));
        Ok(())
    }

    /// Name the final image in the registry only, when its source is there
    /// and nothing here needs it: no pull, no push. `false` when it must be
    /// made on the engine.
    pub(super) fn final_in_registry(&mut self, source: &str, final_ref: &str) -> bool {
        // The oracle and a kept container need the image on this engine.
        if self.opts.pull_final || self.opts.oracle_file.is_some() || self.opts.keep_container {
            return false;
        }
        let (Some((src, image)), Some(store)) =
            (self.remote_only.get(source), self.registry.as_mut())
        else {
            return false;
        };
        store.tag_remote(src, image, final_ref);
        true
    }

    /// Queue the final image for the registry.
    pub(super) fn share_final(&mut self, final_ref: &str) {
        if let Some(store) = self.registry.as_mut() {
            store.push(final_ref, None, None);
        }
    }

    /// Wait for the pushes still queued and record them in the manifest. A
    /// build whose checkpoints did not all reach the registry fails (E305),
    /// whatever else happened: its success would be a claim the registry
    /// cannot back.
    pub(super) async fn finish_pushes(
        &mut self,
        result: Result<(), EnvError>,
    ) -> Result<(), EnvError> {
        let Some(store) = self.registry.as_mut() else {
            return result;
        };
        let queued = self.started.elapsed();
        let (report, failed) = store.finish().await;
        let pushed = report.pushes.iter().filter(|p| p.error.is_none()).count();
        self.phase(
            "registry",
            format!(
                "{pushed} of {} push(es) to {} in {:.1} s, {:.1} s of it after the last block; {} of {} lookup(s) hit, {} pull(s)",
                report.pushes.len(),
                report.registry,
                report.push_ms_total as f64 / 1000.0,
                report.waited_ms as f64 / 1000.0,
                report.hits,
                report.lookups,
                report.pulls.len(),
            ),
        );
        tracing::debug!(
            build_ms = queued.as_millis() as u64,
            waited_ms = report.waited_ms,
            "registry pushes finished"
        );
        let registry = report.registry.clone();
        self.manifest.registry = Some(report);
        match (result, failed) {
            (Err(e), _) => Err(e),
            (Ok(()), None) => Ok(()),
            (Ok(()), Some(f)) => {
                // The final image is on this engine, but not where the
                // build was asked to keep it.
                self.manifest.ok = false;
                Err(SandboxError::Registry {
                    op: "push",
                    image: registry,
                    message: f,
                }
                .into())
            }
        }
    }
}
