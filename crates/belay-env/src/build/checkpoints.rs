//! The checkpoint store: the names of this run's checkpoints, the image ids
//! it has seen, `checkpoints.jsonl`, commits and tags, the checkpoint cache
//! (lookups, adoption), the toolchain checkpoints, and the point a resumed
//! build starts from. With `--registry` it holds the registry store too; what
//! that shares besides checkpoints is in `shared.rs`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};

use belay_record::{JsonlAppender, Redactor};
use belay_sandbox::registry::RemoteImage;
use belay_sandbox::{labels, ContainerRuntime, ImageInfo, SandboxError};

use crate::cache;
use crate::checkpoint_names::{
    base_ref, checkpoint_id, checkpoint_ref, final_ref, parse_checkpoint_tag, toolchain_ref,
    BASE_LABEL, CHECKPOINT_KIND_LABEL, TOOLCHAIN_KIND,
};
use crate::manifest::{Checkpoint, CheckpointRecord};
use crate::registry_store::{Found, RegistryStore};
use crate::rundir::RunDir;
use crate::EnvError;

// What the store shares through the registry besides checkpoints (a child
// module, in `build/shared.rs`, so that it sees the store's state).
#[path = "shared.rs"]
mod shared;

/// This run's checkpoints: how they are named, what is known of them, and
/// where they are kept besides the engine.
pub(crate) struct CheckpointStore<'a> {
    rt: &'a dyn ContainerRuntime,
    /// The image prefix (under the registry, with `--registry`).
    prefix: String,
    run_id: String,
    /// `checkpoints.jsonl`: each checkpoint as it is made, and rollbacks.
    log: JsonlAppender,
    /// Image ids of checkpoint refs seen in this run.
    image_ids: HashMap<String, String>,
    /// Checkpoints of this run that are only in the registry (cache hits
    /// read there), with the key ref they were read from and what was read:
    /// pulled when a container must start from one.
    remote_only: HashMap<String, (String, RemoteImage)>,
    /// The registry store, with `--registry`.
    registry: Option<RegistryStore>,
    /// The toolchain images this run committed (their reuse is not sharing).
    made_toolchain: HashSet<String>,
}

/// A checkpoint the cache found: the image, and the name a registry pull
/// gave it (dropped once the image has this run's name).
#[derive(Debug)]
pub(crate) struct CacheHit {
    pub(crate) info: ImageInfo,
    /// The key's name the engine pulled it under.
    pub(crate) pulled: Option<String>,
    /// The key's name in the registry and the image read there, when it
    /// was only read there.
    pub(crate) remote: Option<(String, RemoteImage)>,
}

impl<'a> CheckpointStore<'a> {
    /// Open the checkpoint log of `dir`.
    pub(crate) fn open(
        rt: &'a dyn ContainerRuntime,
        dir: &RunDir,
        prefix: &str,
        registry: Option<RegistryStore>,
    ) -> Result<Self, EnvError> {
        Ok(Self {
            rt,
            prefix: prefix.to_string(),
            run_id: dir.run_id.clone(),
            log: JsonlAppender::open(&dir.checkpoints())?,
            image_ids: HashMap::new(),
            remote_only: HashMap::new(),
            registry,
            made_toolchain: Default::default(),
        })
    }

    /// This run's checkpoint `seq` of `block`: `<prefix>:<run>-<NNN>-<block>-<kind>`.
    pub(crate) fn name(&self, seq: u32, block: &str, kind: &str) -> String {
        checkpoint_ref(&self.prefix, &self.run_id, seq, block, kind)
    }

    /// This run's final image.
    pub(crate) fn final_name(&self) -> String {
        final_ref(&self.prefix, &self.run_id)
    }

    /// This run's base image built from a Dockerfile.
    pub(crate) fn base_name(&self) -> String {
        base_ref(&self.prefix, &self.run_id)
    }

    /// Whether checkpoints are shared through a registry.
    pub(crate) fn has_registry(&self) -> bool {
        self.registry.is_some()
    }

    /// The image id of `image_ref` (asked of the engine once per run).
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

    /// Whether the checkpoint `image_ref` is a toolchain image this run made
    /// (rather than one it found).
    pub(crate) fn made_here(&self, image_ref: &str) -> bool {
        self.image_ids
            .get(image_ref)
            .is_some_and(|id| self.made_toolchain.contains(id))
    }

    /// Whether the image `id` is a toolchain image this run made.
    pub(crate) fn made_toolchain(&self, id: &str) -> bool {
        self.made_toolchain.contains(id)
    }

    /// Append a checkpoint to `checkpoints.jsonl` (a failure is only logged).
    pub(crate) fn log(&mut self, cp: &Checkpoint, redactor: &Redactor) {
        if let Err(e) = self.log.append(cp, redactor) {
            tracing::warn!("cannot record checkpoint {}: {e}", cp.image_ref);
        }
    }

    /// Checkpoints from `from` on are stale: out of `checkpoints`, and the
    /// rollback in the log, so that a resume does not pick them either.
    pub(crate) fn retire_from(
        &mut self,
        from: u32,
        checkpoints: &mut Vec<Checkpoint>,
        redactor: &Redactor,
    ) -> Result<(), EnvError> {
        crate::manifest::retire_checkpoints(checkpoints, from);
        self.log
            .append(&CheckpointRecord::Retired { retired_from: from }, redactor)?;
        Ok(())
    }

    /// Commit `container` as this run's checkpoint `seq` of `block`, labelled
    /// with the `base` it grew from; queued for the registry.
    pub(crate) async fn commit(
        &mut self,
        container: &str,
        (seq, block, kind): (u32, &str, &str),
        base: Option<&str>,
        parent: Option<String>,
        extra_labels: BTreeMap<String, String>,
    ) -> Result<Checkpoint, EnvError> {
        let image_ref = self.name(seq, block, kind);
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
        lbl.insert(labels::RUN.to_string(), self.run_id.clone());
        lbl.insert(labels::KIND.to_string(), "checkpoint".to_string());
        lbl.insert(labels::BLOCK.to_string(), block.to_string());
        lbl.insert(CHECKPOINT_KIND_LABEL.to_string(), kind.to_string());
        if let Some(base) = base {
            lbl.insert(BASE_LABEL.to_string(), base.to_string());
        }
        let image_id = self.rt.commit(container, &image_ref, &lbl).await?;
        self.image_ids.insert(image_ref.clone(), image_id.clone());
        if let Some(store) = &mut self.registry {
            store.push(
                &image_ref,
                lbl.get(cache::KEY_LABEL).map(String::as_str),
                lbl.get(cache::ALT_LABEL).map(String::as_str),
            );
        }
        Ok(Checkpoint {
            id: checkpoint_id(seq, block),
            image_ref,
            block_id: block.to_string(),
            parent_image_ref: parent,
            kind: kind.to_string(),
            image_id,
            created_at: belay_record::now_rfc3339(),
            cached_from: None,
        })
    }

    /// The newest checkpoint image made under `key` (or, for repaired ones,
    /// whose unpatched script had `key`): on this engine, else (with
    /// `--registry`) in the registry, pulled.
    pub(crate) async fn lookup(
        &mut self,
        key: &str,
        block: &str,
    ) -> Result<Option<CacheHit>, EnvError> {
        let of_block =
            |i: &ImageInfo| i.labels.get(labels::BLOCK).map(String::as_str) == Some(block);
        for label in [cache::KEY_LABEL, cache::ALT_LABEL] {
            let mut found: Vec<_> = self
                .rt
                .list_images(&[format!("{label}={key}")])
                .await?
                .into_iter()
                .filter(of_block)
                .collect();
            found.sort_by_key(|i| Reverse(i.created));
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
            let is_ours = |info: &ImageInfo| {
                of_block(info) && info.labels.get(label).map(String::as_str) == Some(key)
            };
            match store.lookup(key, alt).await? {
                None => {}
                Some(Found::Remote { key_ref, image }) => {
                    let info = ImageInfo {
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

    /// Name a cached checkpoint as this run's checkpoint `seq` for `block`
    /// (on the engine, or only in the registry when it was only read there).
    pub(crate) async fn adopt(
        &mut self,
        hit: CacheHit,
        seq: u32,
        block: &str,
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
        let image_ref = self.name(seq, block, &kind);
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
        Ok(Checkpoint {
            id: checkpoint_id(seq, block),
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
        })
    }

    /// Where to start: the image to start from and the block it completed.
    /// `resume_from` is `--resume-from`; else, when the run has blocks, the
    /// newest of the `recorded` checkpoints that exists.
    pub(crate) async fn resume_point(
        &mut self,
        resume_from: Option<&str>,
        recorded: &[Checkpoint],
        has_blocks: bool,
    ) -> Result<Option<(String, Option<String>)>, EnvError> {
        if let Some(img) = resume_from {
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
                    image: img.to_string(),
                    hint: "--resume-from needs a checkpoint image that exists (`docker images` lists them)".into(),
                }
                .into());
            }
            let inferred = parse_checkpoint_tag(belay_sandbox::split_image_ref(img).1).map(|t| t.2);
            return Ok(Some((img.to_string(), inferred)));
        }
        if !has_blocks {
            return Ok(None);
        }
        // Same run id: the newest recorded block checkpoint that still exists
        // (a toolchain one gets the repository copied onto it: `resume`). The
        // record is in the order they were made, which is the chain's: the
        // workspace (`000`) comes after the toolchain under it (`001`...).
        let cps: Vec<&Checkpoint> = recorded
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

    /// The shared name of the toolchain checkpoint of `block` under `key`.
    fn toolchain_name(&self, block: &str, key: &str) -> String {
        toolchain_ref(&self.prefix, block, key)
    }

    /// The newest toolchain checkpoint of `block` under `key` on this engine:
    /// any, or (with `scope`) one made in that scope.
    pub(crate) async fn toolchain_lookup(
        &self,
        key: &str,
        block: &str,
        scope: Option<String>,
    ) -> Result<Option<String>, EnvError> {
        let mut filters = vec![format!("{}={key}", cache::KEY_LABEL)];
        if let Some(scope) = scope {
            filters.push(format!("{}={scope}", cache::SCOPE_LABEL));
        }
        let mut found: Vec<_> = self
            .rt
            .list_images(&filters)
            .await?
            .into_iter()
            .filter(|i| {
                i.labels.get(labels::BLOCK).map(String::as_str) == Some(block)
                    && i.labels.get(labels::KIND).map(String::as_str) == Some(TOOLCHAIN_KIND)
            })
            .collect();
        found.sort_by_key(|i| Reverse(i.created));
        let Some(img) = found.into_iter().next() else {
            return Ok(None);
        };
        // By id: a tag may move to another build's image of the same key.
        Ok(Some(img.id))
    }

    /// Commit `container` as the toolchain checkpoint of `block` under `key`
    /// in `scope`: its shared name, not the run's. Returns the image id.
    pub(crate) async fn commit_toolchain(
        &mut self,
        container: &str,
        block: &str,
        key: &str,
        base: &str,
        scope: String,
    ) -> Result<String, EnvError> {
        let image_ref = self.toolchain_name(block, key);
        let lbl: BTreeMap<String, String> = [
            (cache::KEY_LABEL, key.to_string()),
            (cache::ALT_LABEL, String::new()),
            (cache::SCRIPT_LABEL, String::new()),
            (cache::SCOPE_LABEL, scope),
            (cache::UNDER_WORKSPACE_LABEL, String::new()),
            (labels::RUN, String::new()),
            (labels::KIND, TOOLCHAIN_KIND.to_string()),
            (labels::BLOCK, block.to_string()),
            (CHECKPOINT_KIND_LABEL, "success".to_string()),
            (BASE_LABEL, base.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let id = self.rt.commit(container, &image_ref, &lbl).await?;
        self.made_toolchain.insert(id.clone());
        Ok(id)
    }

    /// The toolchain image `image_id` as this run's checkpoint `seq` of
    /// `block`: its run tag on the shared image, and its record. A shared
    /// one says where it came from (`shared_from` of `key`).
    pub(crate) async fn tag_toolchain(
        &mut self,
        seq: u32,
        block: &str,
        image_id: &str,
        parent: &str,
        shared_key: Option<&str>,
    ) -> Result<Checkpoint, EnvError> {
        let shared_from = shared_key.map(|key| self.toolchain_name(block, key));
        let image_ref = self.name(seq, block, "success");
        self.rt.tag_image(image_id, &image_ref).await?;
        self.image_ids
            .insert(image_ref.clone(), image_id.to_string());
        Ok(Checkpoint {
            id: checkpoint_id(seq, block),
            image_ref,
            block_id: block.to_string(),
            parent_image_ref: Some(parent.to_string()),
            kind: "success".into(),
            image_id: image_id.to_string(),
            created_at: belay_record::now_rfc3339(),
            cached_from: shared_from,
        })
    }

    /// Whether `image` is a toolchain checkpoint (no repository in it).
    pub(crate) async fn is_toolchain(&self, image: &str) -> Result<bool, EnvError> {
        Ok(self.rt.image(image).await?.is_some_and(|i| {
            i.labels.get(labels::KIND).map(String::as_str) == Some(TOOLCHAIN_KIND)
        }))
    }

    /// How many blocks are under the copy in `image` (a checkpoint of a run).
    pub(crate) async fn under_workspace_of(&self, image: &str) -> Result<usize, EnvError> {
        Ok(self
            .rt
            .image(image)
            .await?
            .and_then(|i| i.labels.get(cache::UNDER_WORKSPACE_LABEL).cloned())
            .map(|s| s.split(',').filter(|b| !b.is_empty()).count())
            .unwrap_or(0))
    }
}
