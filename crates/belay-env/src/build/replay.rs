//! The final clean replay: every final script (repairs patched in) and its
//! validation, in order, in a fresh container from the base image (the
//! repository copied in after the toolchain blocks, as in the forward run). It proves
//! that the scripts alone rebuild the environment; its image becomes final.

use std::collections::BTreeMap;

use crate::plan::Block;
use crate::{cache, EnvError};

use super::Run;

impl Run<'_> {
    /// Returns the replay's image, or `None` when it failed (the manifest says where).
    pub(crate) async fn clean_replay(
        &mut self,
        blocks: &[Block],
    ) -> Result<Option<String>, EnvError> {
        let base =
            self.manifest.base_image.clone().ok_or_else(|| {
                EnvError::Usage("the clean replay needs the run's base image".into())
            })?;
        // The replay is determined by the workspace checkpoint (base image,
        // repository, environment) and the final scripts: an identical one
        // made before is reused.
        let last = blocks
            .last()
            .map(|b| b.id.clone())
            .unwrap_or_else(|| "workspace".into());
        let key = self
            .manifest
            .checkpoints
            .iter()
            .find(|c| c.block_id == "workspace")
            .map(|c| c.image_id.clone())
            .filter(|id| !id.is_empty())
            .map(|ws| {
                let scripts: String = blocks
                    .iter()
                    .map(|b| format!("{}\n{}\n", b.id, b.script))
                    .collect();
                let validations: String = blocks
                    .iter()
                    .map(|b| format!("{}\n", b.validation_command))
                    .collect();
                cache::block_key(
                    &ws,
                    "clean-replay",
                    &scripts,
                    &validations,
                    &self.env_fingerprint,
                )
            });
        if let (Some(k), true) = (&key, self.opts.cache) {
            if let Some(hit) = self.store.lookup(k, &last).await? {
                let cp = self
                    .adopt_cached(hit, &last, blocks.len() as u32 + 1, Some(base.clone()))
                    .await?;
                self.manifest.final_clean_replay_ok = Some(true);
                self.manifest.final_clean_replay_image = Some(cp.image_ref.clone());
                self.manifest.final_clean_replay_note = Some(format!(
                    "reused the clean replay of identical final scripts from {}",
                    cp.cached_from.unwrap_or_default()
                ));
                return Ok(Some(cp.image_ref));
            }
        }
        self.phase(
            "clean replay",
            format!("{} final scripts from {base}", blocks.len()),
        );
        self.pool.retire();
        // In the order of the forward run and the written Dockerfile: the
        // toolchain blocks, the repository copy, the rest. An unrepaired
        // toolchain is already a clean run of its scripts from the base.
        let under = self.laid_under.min(blocks.len());
        let (from, start) = match self.replay_start(blocks) {
            Some((n, top)) => (n, top),
            None => (0, base.clone()),
        };
        self.start_base_container(&start).await?;
        self.pool.set_checkpoint(start.clone());
        for (i, b) in blocks.iter().enumerate().skip(from) {
            if i == under {
                self.copy_workspace_in().await?;
            }
            if let Err(f) = self.run_script(b, "clean_replay").await? {
                return self.replay_failed(&format!("clean_replay:{}", b.id), &f.summary);
            }
            if let Err(f) = self.run_validation(b, "clean_replay_validation").await? {
                return self
                    .replay_failed(&format!("clean_replay_validation:{}", b.id), &f.summary);
            }
        }
        if under == blocks.len() {
            self.copy_workspace_in().await?;
        }
        let extra: BTreeMap<String, String> = key
            .map(|k| BTreeMap::from([(cache::KEY_LABEL.to_string(), k)]))
            .unwrap_or_default();
        let cp = self
            .commit(
                &last,
                blocks.len() as u32 + 1,
                "clean-replay",
                Some(base),
                extra,
            )
            .await?;
        self.pool.retire();
        self.manifest.final_clean_replay_ok = Some(true);
        self.manifest.final_clean_replay_image = Some(cp.image_ref.clone());
        self.manifest.final_clean_replay_note = Some(match from {
            0 => "replayed the final scripts in a fresh container from the base image".into(),
            n => format!(
                "replayed the final scripts after the {n} toolchain block(s), from their checkpoint {start} (a clean run of the same scripts from the base image)"
            ),
        });
        Ok(Some(cp.image_ref))
    }

    fn replay_failed(&mut self, stage: &str, why: &str) -> Result<Option<String>, EnvError> {
        self.manifest.final_clean_replay_ok = Some(false);
        self.manifest.final_clean_replay_failure_stage = Some(stage.to_string());
        self.manifest.error = Some(format!(
            "the final clean replay failed at {stage}: {why}; the repaired scripts do not rebuild the environment on their own"
        ));
        Ok(None)
    }
}
