//! Checkpoints: committing the container as an image, the checkpoint cache (keys,
//! lookups, adoption), and the point a resumed build starts from.

use super::*;
use crate::registry_store::Found;

impl Run<'_> {
    pub(crate) async fn image_id(&mut self, image_ref: &str) -> Result<String, EnvError> {
        if let Some(id) = self.image_ids.get(image_ref) {
            return Ok(id.clone());
        }
        let id = self
            .rt
            .image(image_ref)
            .await?
            .map(|i| i.id)
            .ok_or_else(|| {
                EnvError::from(SandboxError::ImageMissing {
                    image: image_ref.to_string(),
                    hint: "a checkpoint of this run disappeared from the engine (removed by hand?); rerun to rebuild from the last checkpoint that exists".into(),
                })
            })?;
        self.image_ids.insert(image_ref.to_string(), id.clone());
        Ok(id)
    }

    /// Commit the current container as a checkpoint.
    pub(crate) async fn commit(
        &mut self,
        block: &str,
        seq: u32,
        kind: &str,
        parent: Option<String>,
        extra_labels: BTreeMap<String, String>,
    ) -> Result<Checkpoint, EnvError> {
        let container = self
            .container
            .clone()
            .ok_or_else(|| EnvError::Usage("no build container".into()))?;
        let image_ref = checkpoint_ref(&self.opts.image_prefix, &self.dir.run_id, seq, block, kind);
        // `docker commit` keeps the parent image's labels unless they are set:
        // every cache label is set (empty when it does not apply), so that a
        // checkpoint never answers to its parent's keys.
        let mut lbl: BTreeMap<String, String> = [
            cache::KEY_LABEL,
            cache::ALT_LABEL,
            cache::SCRIPT_LABEL,
            cache::SCOPE_LABEL,
        ]
        .iter()
        .map(|k| (k.to_string(), String::new()))
        .collect();
        lbl.extend(extra_labels);
        lbl.insert(labels::RUN.to_string(), self.dir.run_id.clone());
        lbl.insert(labels::KIND.to_string(), "checkpoint".to_string());
        lbl.insert(labels::BLOCK.to_string(), block.to_string());
        lbl.insert(CHECKPOINT_KIND_LABEL.to_string(), kind.to_string());
        if let Some(base) = &self.manifest.base_image {
            lbl.insert(BASE_LABEL.to_string(), base.clone());
        }
        let image_id = self.rt.commit(&container, &image_ref, &lbl).await?;
        self.image_ids.insert(image_ref.clone(), image_id.clone());
        if let Some(store) = &mut self.registry {
            store.push(
                &image_ref,
                lbl.get(cache::KEY_LABEL).map(String::as_str),
                lbl.get(cache::ALT_LABEL).map(String::as_str),
            );
        }
        let cp = Checkpoint {
            id: format!("{seq:03}-{block}"),
            image_ref,
            block_id: block.to_string(),
            parent_image_ref: parent,
            kind: kind.to_string(),
            image_id,
            created_at: belay_record::now_rfc3339(),
            cached_from: None,
        };
        self.push_checkpoint(cp.clone());
        Ok(cp)
    }

    pub(super) fn push_checkpoint(&mut self, cp: Checkpoint) {
        self.obs.event(&BuildEvent::Checkpoint {
            block: cp.block_id.clone(),
            image_ref: cp.image_ref.clone(),
            kind: cp.kind.clone(),
            cached: cp.cached_from.is_some(),
        });
        if let Err(e) = self.checkpoint_log.append(&cp, &self.redactor) {
            tracing::warn!("cannot record checkpoint {}: {e}", cp.image_ref);
        }
        crate::manifest::add_checkpoint(&mut self.manifest.checkpoints, cp);
    }

    /// Decide whether the next block continues in this container.
    ///
    /// `docker commit` archives the container's whole writable layer, i.e.
    /// everything since the container started, and costs a fixed ~0.2 s on
    /// top of that however little changed. Starting a fresh container costs
    /// as much again. So while the writable layer is small (under
    /// [`KEEP_LAYER_BELOW`], and its commit was quick), the next block
    /// continues here; once it is large, the next block starts in a fresh
    /// container from the checkpoint just made (as `docker build` runs each
    /// step), so commits stay proportional to one block's own changes.
    pub(crate) async fn after_checkpoint(&mut self, commit_took: Duration, image_ref: &str) {
        let layer = match (self.container_image_size, self.rt.image(image_ref).await) {
            (Some(base), Ok(Some(img))) => Some(img.size.saturating_sub(base)),
            _ => None,
        };
        let keep = commit_took <= KEEP_COMMIT_BELOW && layer.is_some_and(|l| l < KEEP_LAYER_BELOW);
        tracing::debug!(
            commit_ms = commit_took.as_millis() as u64,
            layer_bytes = layer.unwrap_or(-1),
            keep,
            "checkpoint committed"
        );
        if !keep {
            self.retire_container();
        }
    }

    /// Cache key of `block` on top of `parent`.
    pub(super) async fn block_key(
        &mut self,
        block: &Block,
        parent: &str,
    ) -> Result<String, EnvError> {
        let parent_id = self.image_id(parent).await?;
        Ok(cache::block_key(
            &parent_id,
            &block.id,
            &block.script,
            &block.validation_command,
            &self.env_fingerprint,
        ))
    }

    /// The newest checkpoint image made under `key` (or, for repaired ones,
    /// whose unpatched script had `key`): on this engine, else (with
    /// `--registry`) in the registry, pulled.
    pub(super) async fn cache_lookup(
        &mut self,
        key: &str,
        block: &str,
    ) -> Result<Option<CacheHit>, EnvError> {
        let of_block = |i: &belay_sandbox::ImageInfo| {
            i.labels.get(labels::BLOCK).map(String::as_str) == Some(block)
        };
        for label in [cache::KEY_LABEL, cache::ALT_LABEL] {
            let mut found: Vec<_> = self
                .rt
                .list_images(&[format!("{label}={key}")])
                .await?
                .into_iter()
                .filter(of_block)
                .collect();
            found.sort_by_key(|i| std::cmp::Reverse(i.created));
            if let Some(info) = found.into_iter().next() {
                return Ok(Some(CacheHit {
                    info,
                    pulled: None,
                    remote: None,
                }));
            }
        }
        let Some(store) = &mut self.registry else {
            return Ok(None);
        };
        for alt in [false, true] {
            let label = if alt {
                cache::ALT_LABEL
            } else {
                cache::KEY_LABEL
            };
            let is_ours = |info: &belay_sandbox::ImageInfo| {
                of_block(info) && info.labels.get(label).map(String::as_str) == Some(key)
            };
            match store.lookup(key, alt).await? {
                None => {}
                Some(Found::Remote { key_ref, image }) => {
                    let info = belay_sandbox::ImageInfo {
                        id: image.id.clone(),
                        tags: Vec::new(),
                        labels: image.labels.clone(),
                        created: 0,
                        size: i64::try_from(image.layer_bytes).unwrap_or(i64::MAX),
                    };
                    // A key's tag on an image of another block or key is not
                    // this block's checkpoint (only a hand-made tag can do this).
                    if is_ours(&info) {
                        return Ok(Some(CacheHit {
                            info,
                            pulled: None,
                            remote: Some((key_ref, image)),
                        }));
                    }
                }
                Some(Found::Pulled(pulled)) => match self.rt.image(&pulled).await? {
                    Some(info) if is_ours(&info) => {
                        return Ok(Some(CacheHit {
                            info,
                            pulled: Some(pulled),
                            remote: None,
                        }))
                    }
                    _ => store.forget(&pulled).await,
                },
            }
        }
        Ok(None)
    }

    /// Adopt a cached checkpoint as this run's checkpoint `seq` for `block`.
    pub(super) async fn adopt_cached(
        &mut self,
        hit: CacheHit,
        block: &str,
        seq: u32,
        parent: Option<String>,
    ) -> Result<Checkpoint, EnvError> {
        let CacheHit {
            info: hit,
            pulled,
            remote,
        } = hit;
        let kind = hit
            .labels
            .get(CHECKPOINT_KIND_LABEL)
            .cloned()
            .unwrap_or_else(|| "success".into());
        let image_ref =
            checkpoint_ref(&self.opts.image_prefix, &self.dir.run_id, seq, block, &kind);
        self.image_ids.insert(image_ref.clone(), hit.id.clone());
        let remote_src = remote.as_ref().map(|(src, _)| src.clone());
        let in_registry_only = match (remote, self.registry.as_mut()) {
            (Some((src, image)), Some(store)) => {
                // The run's name, given in the registry in the background:
                // nothing moves (the store pushes it should the registry
                // refuse). A container that must start from it pulls `src`.
                store.tag_remote(&src, &image, &image_ref);
                self.remote_only.insert(image_ref.clone(), (src, image));
                true
            }
            _ => {
                self.rt.tag_image(&hit.id, &image_ref).await?;
                false
            }
        };
        if let (false, Some(store)) = (in_registry_only, &mut self.registry) {
            if let Some(p) = &pulled {
                store.forget(p).await;
            }
            // This run's name in the registry too (layers and key tags are
            // there already when it was pulled: a manifest upload).
            store.push(
                &image_ref,
                hit.labels.get(cache::KEY_LABEL).map(String::as_str),
                hit.labels.get(cache::ALT_LABEL).map(String::as_str),
            );
        }
        let cp = Checkpoint {
            id: format!("{seq:03}-{block}"),
            image_ref,
            block_id: block.to_string(),
            parent_image_ref: parent,
            kind,
            image_id: hit.id.clone(),
            created_at: belay_record::now_rfc3339(),
            cached_from: Some(remote_src.or(pulled).unwrap_or_else(|| {
                hit.tags
                    .iter()
                    .find(|t| !t.contains("<none>"))
                    .cloned()
                    .unwrap_or(hit.id.clone())
            })),
        };
        self.push_checkpoint(cp.clone());
        self.manifest.cache.hits += 1;
        Ok(cp)
    }

    /// Where to start: the image to start from and the block it completed.
    pub(super) async fn resume_point(
        &mut self,
        blocks: Option<&Vec<Block>>,
    ) -> Result<Option<(String, Option<String>)>, EnvError> {
        if let Some(img) = &self.opts.resume_from {
            // Only names in the registry given are pulled: anything else
            // would be fetched from Docker Hub.
            let present = self.rt.image_exists(img).await?;
            let pulled = match self.registry.as_mut() {
                Some(store) if !present && img.starts_with(&format!("{}/", store.registry())) => {
                    store.pull(img, "resume").await?
                }
                _ => false,
            };
            if !present && !pulled {
                return Err(SandboxError::ImageMissing {
                    image: img.clone(),
                    hint: "--resume-from needs a checkpoint image that exists (`docker images` lists them)".into(),
                }
                .into());
            }
            let inferred = parse_checkpoint_tag(belay_sandbox::split_image_ref(img).1).map(|t| t.2);
            return Ok(Some((img.clone(), inferred)));
        }
        if blocks.is_none() {
            return Ok(None);
        }
        // Same run id: the newest recorded block checkpoint that still exists
        // (a toolchain one gets the repository copied onto it: `drive`). The
        // record is in the order they were made, which is the chain's: the
        // workspace (`000`) comes after the toolchain under it (`001`...).
        let cps: Vec<&Checkpoint> = self
            .manifest
            .checkpoints
            .iter()
            .filter(|c| c.kind == "success" || c.kind == "repaired")
            .collect();
        for cp in cps.iter().rev() {
            if self.rt.image_exists(&cp.image_ref).await? {
                return Ok(Some((cp.image_ref.clone(), Some(cp.block_id.clone()))));
            }
        }
        // Not on this engine (another machine made them, or its images were
        // removed): the newest one the registry has. Only names in the given
        // registry are pulled (a checkpoint of an earlier start without
        // --registry would be looked for on Docker Hub), and only an image
        // whose id is the one recorded counts.
        if let Some(store) = self.registry.as_mut() {
            let ours = format!("{}/", store.registry());
            for cp in cps.iter().rev().filter(|c| c.image_ref.starts_with(&ours)) {
                if !store.pull(&cp.image_ref, "resume").await? {
                    continue;
                }
                let id = self.rt.image(&cp.image_ref).await?.map(|i| i.id);
                if id.as_deref() == Some(cp.image_id.as_str()) {
                    return Ok(Some((cp.image_ref.clone(), Some(cp.block_id.clone()))));
                }
                tracing::warn!(
                    "{} in the registry is not the image this run recorded ({}); not resuming from it",
                    cp.image_ref,
                    cp.image_id
                );
                store.forget(&cp.image_ref).await;
            }
        }
        Ok(None)
    }
}

/// A checkpoint the cache found: the image, and the name a registry pull
/// gave it (dropped once the image has this run's name).
#[derive(Debug)]
pub(crate) struct CacheHit {
    pub(crate) info: belay_sandbox::ImageInfo,
    /// The key's name the engine pulled it under.
    pub(crate) pulled: Option<String>,
    /// The key's name in the registry and the image read there, when it
    /// was only read there.
    pub(crate) remote: Option<(String, belay_sandbox::registry::RemoteImage)>,
}
