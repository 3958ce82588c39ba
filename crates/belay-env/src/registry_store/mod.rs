//! The registry checkpoint store (`--registry`): checkpoints pushed to an OCI
//! registry as they are made, cache keys as registry tags, and pulls for cache
//! hits, resumes and a missing base.
//!
//! The engine store stays the first place looked in: a build commits to the
//! local engine as always, and the registry is where other engines (another
//! machine, a fresh image store, a cluster node) find the same work.
//!
//! - **Pushes never hold up a block.** Each checkpoint is queued as soon as it
//!   is committed, and one background task pushes the queue in order (a
//!   child's push then finds its parent's layers there). The build waits only
//!   at its end, for what is still queued; that wait is recorded. A failed
//!   push fails the build: success is never reported for work that is not in
//!   the registry.
//! - **Keys are tags.** A checkpoint made under cache key `K` is also pushed
//!   as `<registry>/belay-cache:key-K` (and a repaired one under its unpatched
//!   script's key as `alt-K`), in one repository for all projects, so that a
//!   lookup is one manifest read, which downloads nothing on a miss.
//! - **A hit is not a pull.** The registry is read directly
//!   ([`belay_sandbox::distribution`]): a hit's manifest and config (its
//!   labels) are read there, and the run's own name is given to it there.
//!   An image is pulled only when a container must start from it: a later
//!   block missed, or the result is wanted on this engine. A build whose
//!   every block hits moves no layer at all. Where the registry cannot be
//!   read directly (not reachable from here, or it wants a credential
//!   helper), lookups go through the engine and every hit is pulled, as
//!   before; the report says why.

pub mod gc;

use std::sync::Arc;
use std::time::Instant;

use belay_sandbox::registry::RemoteImage;
use belay_sandbox::{ImageRegistry, PushReport, SandboxError};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// The repository of cache-key tags, under the registry.
pub const CACHE_REPO: &str = "belay-cache";

/// One push: an image and the other names it is pushed under.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PushRecord {
    pub image_ref: String,
    /// Cache-key names of the same image, pushed after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// How long it waited behind earlier pushes.
    pub queued_ms: u64,
    /// Its own push, and those of its aliases.
    pub push_ms: u64,
    pub layers_pushed: u32,
    pub layers_existing: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Named in the registry itself: nothing was uploaded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_registry: bool,
}

/// One pull, and why it was made.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PullRecord {
    pub image_ref: String,
    /// `cache`, `resume` or `base`.
    pub reason: String,
    pub pull_ms: u64,
}

/// What the registry store did in one build (the manifest's `registry`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RegistryReport {
    pub registry: String,
    pub pushes: Vec<PushRecord>,
    pub pulls: Vec<PullRecord>,
    /// Cache lookups that went to the registry (the engine had no match).
    pub lookups: u32,
    /// Of those, the ones the registry had.
    pub hits: u32,
    /// All pushes, end to end.
    pub push_ms_total: u64,
    /// How long the build waited at its end for pushes still running: the
    /// only time a push can cost the build.
    pub waited_ms: u64,
    /// Names given to images in the registry itself, without a pull or a
    /// push (a hit's run name, a result left there).
    #[serde(default)]
    pub remote_tags: u32,
    /// Why the registry was not read directly, when it was not: lookups
    /// then went through the engine, and each hit was pulled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_off: Option<String>,
}

/// A cache key the registry has.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// Read in the registry: nothing was pulled.
    Remote { key_ref: String, image: RemoteImage },
    /// Pulled through the engine: the image has the key's name locally
    /// until [`RegistryStore::forget`].
    Pulled(String),
}

struct Job {
    image_ref: String,
    aliases: Vec<String>,
    queued: Instant,
    /// A name given in the registry: the image read from this ref.
    remote: Option<(String, RemoteImage)>,
}

/// The store of one build.
pub struct RegistryStore {
    registry: String,
    ops: Arc<dyn ImageRegistry>,
    tx: Option<mpsc::UnboundedSender<Job>>,
    worker: Option<tokio::task::JoinHandle<Vec<PushRecord>>>,
    report: RegistryReport,
    /// Whether lookups and tags still go straight to the registry.
    direct: bool,
}

impl std::fmt::Debug for RegistryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryStore")
            .field("registry", &self.registry)
            .finish()
    }
}

impl RegistryStore {
    /// Start the store's push queue. `registry` was checked by
    /// [`belay_sandbox::registry::parse_registry`].
    pub fn start(registry: &str, ops: Arc<dyn ImageRegistry>) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let worker_ops = ops.clone();
        let worker = tokio::spawn(async move {
            let mut done = Vec::new();
            // After a failure the rest is not pushed: a child's layers on top
            // of a missing parent would be pushed again in full, and the build
            // fails anyway.
            let mut failed = false;
            while let Some(job) = rx.recv().await {
                let mut rec = PushRecord {
                    image_ref: job.image_ref.clone(),
                    aliases: job.aliases.clone(),
                    queued_ms: job.queued.elapsed().as_millis() as u64,
                    ..Default::default()
                };
                if failed {
                    rec.error = Some("not pushed: an earlier push failed".into());
                    done.push(rec);
                    continue;
                }
                let t0 = Instant::now();
                match push_job(worker_ops.as_ref(), &job, &mut rec).await {
                    Ok(r) => {
                        rec.layers_pushed = r.layers_pushed;
                        rec.layers_existing = r.layers_existing;
                        rec.digest = r.digest;
                    }
                    Err(e) => {
                        rec.error = Some(e.to_string());
                        failed = true;
                    }
                }
                rec.push_ms = t0.elapsed().as_millis() as u64;
                done.push(rec);
            }
            done
        });
        Self {
            registry: registry.to_string(),
            ops,
            tx: Some(tx),
            worker: Some(worker),
            report: RegistryReport {
                registry: registry.to_string(),
                ..Default::default()
            },
            direct: true,
        }
    }

    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The registry name of a cache key's tag.
    pub fn key_ref(&self, key: &str, alt: bool) -> String {
        let kind = if alt { "alt" } else { "key" };
        format!("{}/{CACHE_REPO}:{kind}-{key}", self.registry)
    }

    /// The registry's name for a local image ref (a base image named
    /// `belay-base:bookworm` is `<registry>/belay-base:bookworm` there).
    pub fn remote_name(&self, local: &str) -> String {
        if local.starts_with(&format!("{}/", self.registry)) {
            local.to_string()
        } else {
            format!("{}/{local}", self.registry)
        }
    }

    /// Queue `image_ref` (a name in this registry) for pushing, with the
    /// cache keys it answers to. Returns at once.
    pub fn push(&mut self, image_ref: &str, key: Option<&str>, alt: Option<&str>) {
        let mut aliases = Vec::new();
        if let Some(k) = key.filter(|k| !k.is_empty()) {
            aliases.push(self.key_ref(k, false));
        }
        if let Some(k) = alt.filter(|k| !k.is_empty()) {
            aliases.push(self.key_ref(k, true));
        }
        self.queue(Job {
            image_ref: image_ref.to_string(),
            aliases,
            queued: Instant::now(),
            remote: None,
        });
    }

    /// Queue the name `dst` for the registry's image `image` (read from
    /// `src`), given there without a pull; should the registry refuse it,
    /// the engine pulls `src` and pushes it as `dst`. Returns at once.
    pub fn tag_remote(&mut self, src: &str, image: &RemoteImage, dst: &str) {
        self.queue(Job {
            image_ref: dst.to_string(),
            aliases: Vec::new(),
            queued: Instant::now(),
            remote: Some((src.to_string(), image.clone())),
        });
    }

    fn queue(&mut self, job: Job) {
        if let Some(tx) = &self.tx {
            let name = job.image_ref.clone();
            if tx.send(job).is_err() {
                tracing::warn!("the registry push queue is gone; {name} is not pushed");
            }
        }
    }

    /// Look a cache key up in the registry. Read directly, a hit is only
    /// read ([`Found::Remote`]); through the engine it is pulled
    /// ([`Found::Pulled`]).
    pub async fn lookup(&mut self, key: &str, alt: bool) -> Result<Option<Found>, SandboxError> {
        let r = self.key_ref(key, alt);
        self.report.lookups += 1;
        if self.direct {
            match self.ops.remote_image(&r).await {
                Ok(None) => return Ok(None),
                Ok(Some(image)) => {
                    self.report.hits += 1;
                    return Ok(Some(Found::Remote { key_ref: r, image }));
                }
                Err(e) => self.stop_direct(&e),
            }
        }
        if self.ops.remote_digest(&r).await?.is_none() {
            return Ok(None);
        }
        if !self.pull(&r, "cache").await? {
            return Ok(None);
        }
        self.report.hits += 1;
        Ok(Some(Found::Pulled(r)))
    }

    /// The image id the registry has under `image_ref`, read directly;
    /// `None` when it has none or cannot be read directly.
    pub async fn remote_id(&mut self, image_ref: &str) -> Option<String> {
        if !self.direct {
            return None;
        }
        match self.ops.remote_image(image_ref).await {
            Ok(found) => found.map(|i| i.id),
            Err(e) => {
                self.stop_direct(&e);
                None
            }
        }
    }

    fn stop_direct(&mut self, e: &SandboxError) {
        tracing::warn!("reading the registry directly failed, so the engine does it: {e}");
        self.direct = false;
        self.report.direct_off = Some(e.to_string());
    }

    /// Pull `image_ref`; `false` when the registry has no such tag.
    pub async fn pull(&mut self, image_ref: &str, reason: &str) -> Result<bool, SandboxError> {
        let t0 = Instant::now();
        let ok = self.ops.pull(image_ref).await?;
        if ok {
            self.report.pulls.push(PullRecord {
                image_ref: image_ref.to_string(),
                reason: reason.to_string(),
                pull_ms: t0.elapsed().as_millis() as u64,
            });
        }
        Ok(ok)
    }

    /// Drop a local name made by a pull (the image keeps its other names).
    pub async fn forget(&self, image_ref: &str) {
        if let Err(e) = self.ops.untag(image_ref).await {
            tracing::warn!("cannot remove the local name {image_ref}: {e}");
        }
    }

    pub async fn tag(&self, image: &str, new_ref: &str) -> Result<(), SandboxError> {
        self.ops.tag(image, new_ref).await
    }

    /// Wait for every queued push. The report, and the first push that
    /// failed (the build must not succeed without its checkpoints).
    pub async fn finish(&mut self) -> (RegistryReport, Option<String>) {
        let t0 = Instant::now();
        self.tx = None;
        let pushes = match self.worker.take() {
            Some(w) => match w.await {
                Ok(p) => p,
                Err(e) => vec![PushRecord {
                    error: Some(format!("the push task failed: {e}")),
                    ..Default::default()
                }],
            },
            None => Vec::new(),
        };
        self.report.waited_ms = t0.elapsed().as_millis() as u64;
        self.report.push_ms_total = pushes.iter().map(|p| p.push_ms).sum();
        self.report.remote_tags = pushes.iter().filter(|p| p.in_registry).count() as u32;
        let failed = pushes
            .iter()
            .find_map(|p| p.error.as_ref().map(|e| format!("{}: {e}", p.image_ref)));
        self.report.pushes = pushes;
        (self.report.clone(), failed)
    }
}

async fn push_job(
    ops: &dyn ImageRegistry,
    job: &Job,
    rec: &mut PushRecord,
) -> Result<PushReport, SandboxError> {
    if let Some((src, image)) = &job.remote {
        match ops.remote_tag(src, image, &job.image_ref).await {
            Ok(digest) => {
                rec.in_registry = true;
                return Ok(PushReport {
                    digest: Some(digest),
                    layers_existing: image.blobs.len().saturating_sub(1) as u32,
                    ..Default::default()
                });
            }
            Err(e) => {
                // The engine can still do it: pull, name, push.
                tracing::warn!(
                    "{e}: the engine pulls {src} and pushes it as {}",
                    job.image_ref
                );
                if !ops.pull(src).await? {
                    return Err(SandboxError::Registry {
                        op: "push",
                        image: job.image_ref.clone(),
                        message: format!("the registry lost {src} before it could be named"),
                    });
                }
                ops.tag(src, &job.image_ref).await?;
                let pushed = ops.push(&job.image_ref).await;
                if let Err(e) = ops.untag(src).await {
                    tracing::warn!("cannot remove the local name {src}: {e}");
                }
                return pushed;
            }
        }
    }
    let mut total = ops.push(&job.image_ref).await?;
    for alias in &job.aliases {
        ops.tag(&job.image_ref, alias).await?;
        let pushed = ops.push(alias).await;
        // The alias is only a name for the push; locally the image keeps its
        // run's name (gc finds images by their run's names).
        ops.untag(alias).await?;
        let r = pushed?;
        total.layers_pushed += r.layers_pushed;
        total.duration_ms += r.duration_ms;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records calls; fails pushes of refs containing "bad". With `direct`,
    /// it reads the registry itself too, failing tags to refs containing
    /// "deny".
    #[derive(Default)]
    struct Recording {
        calls: Mutex<Vec<String>>,
        direct: bool,
    }

    #[async_trait::async_trait]
    impl ImageRegistry for Recording {
        async fn push(&self, image_ref: &str) -> Result<PushReport, SandboxError> {
            self.calls.lock().unwrap().push(format!("push {image_ref}"));
            if image_ref.contains("bad") {
                return Err(SandboxError::Registry {
                    op: "push",
                    image: image_ref.into(),
                    message: "denied".into(),
                });
            }
            Ok(PushReport {
                digest: Some("sha256:d".into()),
                layers_pushed: 1,
                ..Default::default()
            })
        }
        async fn pull(&self, image_ref: &str) -> Result<bool, SandboxError> {
            self.calls.lock().unwrap().push(format!("pull {image_ref}"));
            Ok(true)
        }
        async fn remote_digest(&self, image_ref: &str) -> Result<Option<String>, SandboxError> {
            self.calls.lock().unwrap().push(format!("head {image_ref}"));
            Ok(image_ref.contains("key-hit").then(|| "sha256:d".into()))
        }
        async fn tag(&self, image: &str, new_ref: &str) -> Result<(), SandboxError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("tag {image} {new_ref}"));
            Ok(())
        }
        async fn untag(&self, image_ref: &str) -> Result<(), SandboxError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("untag {image_ref}"));
            Ok(())
        }
        async fn remote_image(&self, image_ref: &str) -> Result<Option<RemoteImage>, SandboxError> {
            if !self.direct {
                return Err(SandboxError::Registry {
                    op: "read",
                    image: image_ref.into(),
                    message: "unreachable".into(),
                });
            }
            self.calls.lock().unwrap().push(format!("read {image_ref}"));
            Ok(image_ref.contains("key-hit").then(|| RemoteImage {
                digest: "sha256:d".into(),
                id: "sha256:c".into(),
                ..Default::default()
            }))
        }
        async fn remote_tag(
            &self,
            src: &str,
            _image: &RemoteImage,
            dst: &str,
        ) -> Result<String, SandboxError> {
            self.calls.lock().unwrap().push(format!("rtag {src} {dst}"));
            if dst.contains("deny") {
                return Err(SandboxError::Registry {
                    op: "tag",
                    image: dst.into(),
                    message: "denied".into(),
                });
            }
            Ok("sha256:d".into())
        }
    }

    #[tokio::test]
    async fn read_directly_a_hit_pulls_nothing_and_a_refused_name_is_pushed() {
        let ops = Arc::new(Recording {
            direct: true,
            ..Default::default()
        });
        let mut store = RegistryStore::start("127.0.0.1:5000", ops.clone());
        assert_eq!(store.lookup("miss", false).await.unwrap(), None);
        let Some(Found::Remote { key_ref, image }) = store.lookup("hit", false).await.unwrap()
        else {
            panic!("a direct hit is read, not pulled");
        };
        assert_eq!(key_ref, "127.0.0.1:5000/belay-cache:key-hit");
        assert_eq!(image.id, "sha256:c");
        store.tag_remote(&key_ref, &image, "127.0.0.1:5000/belay:r-001-x-success");
        // A refused name is made by the engine instead: pull, tag, push.
        store.tag_remote(&key_ref, &image, "127.0.0.1:5000/belay:deny-002");
        let (report, failed) = store.finish().await;
        assert!(failed.is_none(), "{failed:?}");
        assert_eq!((report.lookups, report.hits, report.remote_tags), (2, 1, 1));
        assert!(
            report.pulls.is_empty(),
            "the store's own pulls are for hits"
        );
        assert!(report.pushes[0].in_registry && !report.pushes[1].in_registry);
        let calls = ops.calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                "read 127.0.0.1:5000/belay-cache:key-miss",
                "read 127.0.0.1:5000/belay-cache:key-hit",
                "rtag 127.0.0.1:5000/belay-cache:key-hit 127.0.0.1:5000/belay:r-001-x-success",
                "rtag 127.0.0.1:5000/belay-cache:key-hit 127.0.0.1:5000/belay:deny-002",
                "pull 127.0.0.1:5000/belay-cache:key-hit",
                "tag 127.0.0.1:5000/belay-cache:key-hit 127.0.0.1:5000/belay:deny-002",
                "push 127.0.0.1:5000/belay:deny-002",
                "untag 127.0.0.1:5000/belay-cache:key-hit",
            ]
        );
    }

    #[tokio::test]
    async fn pushes_run_in_order_with_their_key_names_and_a_failure_stops_the_rest() {
        let ops = Arc::new(Recording::default());
        let mut store = RegistryStore::start("127.0.0.1:5000", ops.clone());
        store.push(
            "127.0.0.1:5000/belay:r-000-workspace-success",
            Some("k0"),
            None,
        );
        store.push(
            "127.0.0.1:5000/belay:r-001-bad-success",
            Some("k1"),
            Some("a1"),
        );
        store.push("127.0.0.1:5000/belay:r-002-x-success", Some("k2"), None);
        let (report, failed) = store.finish().await;
        let calls = ops.calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            vec![
                "push 127.0.0.1:5000/belay:r-000-workspace-success",
                "tag 127.0.0.1:5000/belay:r-000-workspace-success 127.0.0.1:5000/belay-cache:key-k0",
                "push 127.0.0.1:5000/belay-cache:key-k0",
                "untag 127.0.0.1:5000/belay-cache:key-k0",
                "push 127.0.0.1:5000/belay:r-001-bad-success",
            ]
        );
        assert!(failed.unwrap().contains("r-001-bad-success"));
        assert_eq!(report.pushes.len(), 3);
        assert_eq!(
            report.pushes[2].error.as_deref(),
            Some("not pushed: an earlier push failed")
        );
        assert_eq!(report.pushes[0].layers_pushed, 2);
    }

    #[tokio::test]
    async fn a_lookup_is_a_head_and_only_a_hit_pulls() {
        let ops = Arc::new(Recording::default());
        let mut store = RegistryStore::start("reg.example:5000/team", ops.clone());
        assert_eq!(store.lookup("miss", false).await.unwrap(), None);
        assert_eq!(
            store.lookup("hit", true).await.unwrap(),
            None,
            "alt-hit is not key-hit"
        );
        let hit = store.lookup("hit", false).await.unwrap();
        assert_eq!(
            hit,
            Some(Found::Pulled(
                "reg.example:5000/team/belay-cache:key-hit".into()
            ))
        );
        let (report, failed) = store.finish().await;
        assert!(failed.is_none());
        assert_eq!((report.lookups, report.hits), (3, 1));
        assert!(
            report.direct_off.unwrap().contains("unreachable"),
            "the reason the engine did the lookups is kept"
        );
        assert_eq!(report.pulls.len(), 1);
        assert_eq!(report.pulls[0].reason, "cache");
        let calls = ops.calls.lock().unwrap().clone();
        assert_eq!(
            calls.iter().filter(|c| c.starts_with("pull")).count(),
            1,
            "{calls:?}"
        );
        assert_eq!(
            store.remote_name("belay-base:bookworm"),
            "reg.example:5000/team/belay-base:bookworm"
        );
    }
}
