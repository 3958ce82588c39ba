//! The build's containers: the one a block runs in, the retired ones going
//! away in the background, and when the next block continues in the current
//! container rather than in a fresh one from the checkpoint just made.

use std::path::Path;
use std::time::Duration;

use belay_record::{JsonlAppender, Redactor};
use belay_sandbox::{ContainerRuntime, ContainerSpec};

use crate::EnvError;

/// The next block continues in the container while its writable layer (all
/// it changed since it started) is smaller than this...
const KEEP_LAYER_BELOW: i64 = 64 << 20;
/// ...and its last commit took less than this.
const KEEP_COMMIT_BELOW: Duration = Duration::from_secs(1);

/// The build container and the containers retired before it.
pub(crate) struct ContainerPool<'a> {
    rt: &'a dyn ContainerRuntime,
    /// The container blocks run in now.
    container: Option<String>,
    /// Retired containers, removed in the background once the next container
    /// has started (so that removal never competes with the start).
    retired: Vec<String>,
    /// Removals of retired containers, running in the background.
    removals: Vec<tokio::task::JoinHandle<()>>,
    /// Size of the image the current container started from (its writable
    /// layer is a checkpoint's size minus this).
    image_size: Option<i64>,
    /// The checkpoint the current container's state is (for records).
    checkpoint: Option<String>,
}

impl<'a> ContainerPool<'a> {
    /// No container yet.
    pub(crate) fn new(rt: &'a dyn ContainerRuntime) -> Self {
        Self {
            rt,
            container: None,
            retired: Vec::new(),
            removals: Vec::new(),
            image_size: None,
            checkpoint: None,
        }
    }

    /// The current container, if one runs.
    pub(crate) fn id(&self) -> Option<&str> {
        self.container.as_deref()
    }

    /// The current container, or the error of a step that needs one.
    pub(crate) fn require(&self) -> Result<String, EnvError> {
        self.container
            .clone()
            .ok_or_else(|| EnvError::Usage("no build container".into()))
    }

    /// The checkpoint the current container's state is, for the records.
    pub(crate) fn checkpoint(&self) -> Option<String> {
        self.checkpoint.clone()
    }

    /// The container's state is now `image`.
    pub(crate) fn set_checkpoint(&mut self, image: String) {
        self.checkpoint = Some(image);
    }

    /// Start a container of `spec` as the current one: the one it replaces
    /// is retired, and every retired container is removed in the background
    /// once this one exists. Each start is appended to `log`
    /// (`containers.jsonl`).
    pub(crate) async fn start(
        &mut self,
        spec: &ContainerSpec,
        log: &Path,
        redactor: &Redactor,
    ) -> Result<(), EnvError> {
        if let Some(old) = self.container.take() {
            self.retired.push(old);
        }
        let id = self.rt.create(spec).await?;
        self.image_size = self.rt.image(&spec.image).await?.map(|i| i.size);
        self.drain_retired();
        let mut log = JsonlAppender::open(log)?;
        log.append(
            &serde_json::json!({"container": id, "image": spec.image, "created_at": belay_record::now_rfc3339(), "pid": std::process::id()}),
            redactor,
        )?;
        self.container = Some(id);
        Ok(())
    }

    /// The retired container's work is checkpointed: it goes away in the background.
    pub(crate) fn retire(&mut self) {
        if let Some(c) = self.container.take() {
            self.retired.push(c);
        }
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
        let layer = match (self.image_size, self.rt.image(image_ref).await) {
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
            self.retire();
        }
    }

    /// Remove a container of this build (an oracle's) in the background.
    pub(crate) fn remove_later(&mut self, id: &str) {
        self.removals.push(self.rt.remove_detached(id));
    }

    /// Start removing every retired container in the background.
    pub(crate) fn drain_retired(&mut self) {
        for old in self.retired.drain(..) {
            self.removals.push(self.rt.remove_detached(&old));
        }
    }

    /// Start removing the current container in the background.
    pub(crate) fn remove_current(&mut self) {
        if let Some(c) = self.container.take() {
            self.removals.push(self.rt.remove_detached(&c));
        }
    }

    /// Wait for every background removal.
    pub(crate) async fn await_removals(&mut self) {
        for h in self.removals.drain(..) {
            let _ = h.await;
        }
    }
}
