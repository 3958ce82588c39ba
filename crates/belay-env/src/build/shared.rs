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
    pub(super) async fn share_base(&mut self, base: &str) -> Result<(), EnvError> {
        let Some(store) = self.registry.as_mut() else {
            return Ok(());
        };
        let remote = store.remote_name(base);
        if remote != base {
            store.tag(base, &remote).await?;
        }
        store.push(&remote, None, None);
        Ok(())
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
