//! `belay env gc --registry`: remove old runs' checkpoints from the registry,
//! by the same labels and age rules as on the engine.
//!
//! The Engine API cannot list or delete a registry's tags, so this speaks the
//! distribution API ([`belay_sandbox::distribution`]): the catalog, each repository's tags, each tag's
//! manifest and image config (for its labels and creation time), then a
//! DELETE of each manifest none of whose tags is to be kept. Deleting a
//! manifest removes every tag on it, the cache keys' too; the registry's own
//! `garbage-collect` then frees the blobs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use belay_sandbox::distribution::Distribution;
use belay_sandbox::labels;
use serde::Serialize;

use super::CACHE_REPO;
use crate::checkpoint_names::run_of_tag;
use crate::gc::GcOptions;
use crate::EnvError;

#[derive(Debug, Clone, Default, Serialize)]
pub struct RegistryGcReport {
    pub registry: String,
    /// `repo:tag` of every tag that went (with its manifest).
    pub removed_tags: Vec<String>,
    pub kept_final: Vec<String>,
    /// Manifests deleted.
    pub removed_manifests: usize,
    pub skipped: Vec<String>,
    pub dry_run: bool,
}

/// One tag and what its image says of itself.
#[derive(Debug, Clone)]
struct TagInfo {
    repo: String,
    tag: String,
    digest: String,
    run: Option<String>,
    is_final: bool,
    removable: bool,
    created: i64,
}

/// The distribution API of the registry, through the sandbox's client.
struct Api {
    client: Distribution,
    host: String,
    registry: String,
}

impl Api {
    fn new(registry: &str) -> Result<Self, EnvError> {
        Ok(Self {
            client: Distribution::for_registry(registry)?,
            host: registry.split('/').next().unwrap_or(registry).to_string(),
            registry: registry.to_string(),
        })
    }

    /// Repositories whose names a belay build makes: `<prefix>…` under the
    /// registry's path, the base images and the cache keys.
    async fn repositories(&self) -> Result<Vec<String>, EnvError> {
        let all = self.client.catalog().await?;
        let sub = self.registry.split_once('/').map(|(_, p)| format!("{p}/"));
        Ok(all
            .into_iter()
            .filter(|r| sub.as_ref().is_none_or(|s| r.starts_with(s.as_str())))
            .collect())
    }

    async fn tag_info(&self, repo: &str, tag: &str) -> Result<TagInfo, EnvError> {
        let image_ref = format!("{}/{repo}:{tag}", self.host);
        let img = self.client.image(&image_ref).await?.ok_or_else(|| {
            fail(
                &self.registry,
                "read",
                format!("{repo}:{tag}: gone while gc read it"),
            )
        })?;
        let lbl = &img.labels;
        let created = img
            .created
            .as_deref()
            .and_then(|s| s.parse::<jiff::Timestamp>().ok())
            .map(|t| t.as_second());
        let kind = lbl.get(labels::KIND).map(String::as_str);
        let label_run = lbl.get(labels::RUN).filter(|r| !r.is_empty()).cloned();
        let ours = lbl.get(labels::BELAY).map(String::as_str) == Some("true");
        // An image without a creation time has no age: it is never removed.
        let removable = ours
            && created.is_some()
            && (kind == Some("checkpoint") || (kind == Some("base") && label_run.is_some()));
        let created = created.unwrap_or(i64::MAX);
        let (run, is_final) = if tag.starts_with("key-") || tag.starts_with("alt-") {
            (label_run, false)
        } else {
            match run_of_tag(tag) {
                Some((r, f)) => (Some(r), f),
                None => (None, false),
            }
        };
        Ok(TagInfo {
            repo: repo.to_string(),
            tag: tag.to_string(),
            digest: img.digest,
            run,
            is_final,
            removable,
            created,
        })
    }
}

fn fail(registry: &str, op: &'static str, message: String) -> EnvError {
    belay_sandbox::SandboxError::Registry {
        op,
        image: registry.to_string(),
        message,
    }
    .into()
}

/// Remove old runs' checkpoints from `registry` (checked by
/// `parse_registry`), by the rules of [`crate::gc::gc`].
pub async fn gc(registry: &str, opts: &GcOptions) -> Result<RegistryGcReport, EnvError> {
    let api = Api::new(registry)?;
    let mut report = RegistryGcReport {
        registry: registry.to_string(),
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let mut infos = Vec::new();
    let mut foreign: Vec<String> = Vec::new();
    for repo in api.repositories().await? {
        let tags = api.client.tags(&repo).await?;
        for tag in tags.iter().map(String::as_str) {
            // Cache keys in the cache repository; runs' names elsewhere.
            let in_cache = repo == CACHE_REPO || repo.ends_with(&format!("/{CACHE_REPO}"));
            let ours = if in_cache {
                tag.starts_with("key-") || tag.starts_with("alt-")
            } else {
                run_of_tag(tag).is_some()
            };
            if !ours {
                // Not a name belay made, but its manifest must outlive
                // belay's names for it.
                match api.client.digest(&repo, tag).await {
                    Ok(Some(d)) => foreign.push(d),
                    Ok(None) => {}
                    Err(e) => report.skipped.push(format!("{repo}:{tag}: {e}")),
                }
                continue;
            }
            match api.tag_info(&repo, tag).await {
                Ok(i) => infos.push(i),
                Err(e) => report.skipped.push(format!("{repo}:{tag}: {e}")),
            }
        }
    }
    let now = jiff::Timestamp::now().as_second();
    let wanted = |run: &str| opts.runs.is_empty() || opts.runs.iter().any(|r| r == run);
    // A run's age is that of its newest image, as on the engine.
    let mut newest: HashMap<String, i64> = HashMap::new();
    for i in infos.iter().filter(|i| i.removable) {
        if let Some(r) = &i.run {
            let e = newest.entry(r.clone()).or_insert(i.created);
            *e = (*e).max(i.created);
        }
    }
    let goes = |i: &TagInfo| -> bool {
        let Some(run) = &i.run else { return false };
        let age = now - newest.get(run).copied().unwrap_or(i.created);
        i.removable
            && wanted(run)
            && Duration::from_secs(age.max(0) as u64) >= opts.older_than
            && (!i.is_final || opts.include_final)
    };
    // A manifest goes only when no kept name anywhere has its digest: a
    // final image is a tag on its last checkpoint's manifest, a cache hit's
    // run names the first run's manifests, and a cache key in the cache
    // repository stays while any run still names its image.
    if !report.skipped.is_empty() {
        // A tag that could not be read might name a manifest that would go.
        return Err(fail(
            registry,
            "gc",
            format!(
                "{} tag(s) could not be read, so nothing was removed: {}",
                report.skipped.len(),
                report.skipped.join("; ")
            ),
        ));
    }
    let mut kept: BTreeSet<String> = foreign.into_iter().collect();
    for i in &infos {
        if !goes(i) {
            kept.insert(i.digest.clone());
            if i.is_final && i.removable && i.run.as_deref().is_some_and(wanted) {
                report.kept_final.push(format!("{}:{}", i.repo, i.tag));
            }
        }
    }
    let mut doomed: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for i in infos.iter().filter(|i| goes(i)) {
        if !kept.contains(&i.digest) {
            doomed
                .entry((i.repo.clone(), i.digest.clone()))
                .or_default()
                .push(format!("{}:{}", i.repo, i.tag));
        }
    }
    for ((repo, digest), tags) in doomed {
        if !opts.dry_run {
            if let Err(e) = api.client.delete_manifest(&repo, &digest).await {
                report.skipped.push(format!("{repo}@{digest}: {e}"));
                continue;
            }
        }
        report.removed_manifests += 1;
        report.removed_tags.extend(tags);
    }
    Ok(report)
}
