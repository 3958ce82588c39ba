//! [`FakeRuntime`]: a [`ContainerRuntime`] that runs nothing, for unit tests
//! of the engines' state machines (routing, attempts, resume, bookkeeping).
//! It is compiled only for tests (the `fake` feature); every end-to-end test
//! runs on the real engine.
//!
//! Each exec's argv is handed to a script that says how it ends; the fake
//! records every exec, container, network and image, so a test can assert what
//! the engine asked for and in which order.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use belay_record::Redactor;

use crate::{
    BuildRequest, ContainerInfo, ContainerRuntime, ContainerSpec, EngineInfo, ExecObserver,
    ExecOutcome, ExecSpec, ImageInfo, InfraFailure, NetworkInfo, SandboxError, StreamKind,
    TarFilter,
};

/// How one exec ends.
#[derive(Debug, Clone)]
pub enum Answer {
    /// It exits with this code and prints this on stdout.
    Exit(i64, String),
    /// The engine fails under it (the daemon went away).
    EngineGone,
}

type Script = dyn Fn(&[String]) -> Answer + Send + Sync;

#[derive(Default)]
struct State {
    execs: Vec<Vec<String>>,
    created: Vec<ContainerSpec>,
    removed: Vec<String>,
    networks: Vec<String>,
    images: BTreeMap<String, String>,
    gone: Vec<String>,
    next: u64,
}

/// A runtime whose execs are answered by a script.
#[derive(Clone)]
pub struct FakeRuntime {
    script: Arc<Script>,
    state: Arc<Mutex<State>>,
}

impl FakeRuntime {
    /// Every exec is answered by `script(argv)`.
    pub fn new(script: impl Fn(&[String]) -> Answer + Send + Sync + 'static) -> Self {
        FakeRuntime {
            script: Arc::new(script),
            state: Arc::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every exec's argv, in order.
    pub fn execs(&self) -> Vec<Vec<String>> {
        self.state().execs.clone()
    }

    /// The shell commands (`bash -c CMD`) exec'd, in order.
    pub fn commands(&self) -> Vec<String> {
        self.execs()
            .into_iter()
            .filter(|a| a.len() == 3 && a[0] == "bash" && a[1] == "-c")
            .map(|a| a[2].clone())
            .collect()
    }

    /// The containers created.
    pub fn created(&self) -> Vec<ContainerSpec> {
        self.state().created.clone()
    }

    /// The containers removed.
    pub fn removed(&self) -> Vec<String> {
        self.state().removed.clone()
    }

    /// The networks made and not removed.
    pub fn networks(&self) -> Vec<String> {
        self.state().networks.clone()
    }

    fn id(&self, prefix: &str) -> String {
        let mut s = self.state();
        s.next += 1;
        format!("{prefix}{:012}", s.next)
    }
}

fn gone() -> SandboxError {
    SandboxError::Infra(InfraFailure::DaemonGone {
        detail: "the fake engine was told to fail".into(),
    })
}

#[async_trait]
impl ContainerRuntime for FakeRuntime {
    async fn info(&self) -> Result<EngineInfo, SandboxError> {
        Ok(EngineInfo {
            server_version: "fake".into(),
            api_version: "1.41".into(),
            negotiated_api_version: "1.41".into(),
            os: "fake".into(),
            storage_driver: "none".into(),
        })
    }
    async fn image_exists(&self, image: &str) -> Result<bool, SandboxError> {
        Ok(!self.state().gone.iter().any(|g| g == image))
    }
    async fn import_rootfs(
        &self,
        _rootfs: &std::path::Path,
        image_ref: &str,
        _changes: Vec<String>,
    ) -> Result<String, SandboxError> {
        self.state().gone.retain(|g| g != image_ref);
        Ok(format!("sha256:fake-import-{image_ref}"))
    }
    /// Every image is there (a base image too), with an id derived from its
    /// name, unless the fake committed it (its own id) or removed it.
    async fn image(&self, image: &str) -> Result<Option<ImageInfo>, SandboxError> {
        let s = self.state();
        if s.gone.iter().any(|g| g == image) {
            return Ok(None);
        }
        let id = s
            .images
            .get(image)
            .cloned()
            .unwrap_or_else(|| format!("sha256:fake-{image}"));
        Ok(Some(ImageInfo {
            id,
            tags: vec![image.to_string()],
            labels: BTreeMap::new(),
            created: 0,
            size: 0,
        }))
    }
    async fn list_images(&self, _labels: &[String]) -> Result<Vec<ImageInfo>, SandboxError> {
        Ok(Vec::new())
    }
    async fn remove_image(&self, image: &str) -> Result<(), SandboxError> {
        let mut s = self.state();
        s.images.remove(image);
        s.gone.push(image.into());
        Ok(())
    }
    async fn tag_image(&self, image: &str, new_ref: &str) -> Result<(), SandboxError> {
        let mut s = self.state();
        let id = s.images.get(image).cloned().unwrap_or_else(|| image.into());
        s.images.insert(new_ref.into(), id);
        Ok(())
    }
    async fn create(&self, spec: &ContainerSpec) -> Result<String, SandboxError> {
        let id = self.id("c");
        self.state().created.push(spec.clone());
        Ok(id)
    }
    async fn end_step(&self, _container: &str) -> Result<usize, SandboxError> {
        Ok(0)
    }
    fn exec_user(&self, _container: &str) -> Option<String> {
        None
    }
    async fn remove(&self, container: &str) -> Result<(), SandboxError> {
        self.state().removed.push(container.into());
        Ok(())
    }
    async fn remove_volume(&self, _name: &str) -> Result<(), SandboxError> {
        Ok(())
    }
    async fn ensure_network(
        &self,
        name: &str,
        _internal: bool,
    ) -> Result<NetworkInfo, SandboxError> {
        self.state().networks.push(name.into());
        Ok(NetworkInfo {
            gateway: "127.0.0.1".into(),
            bridge: None,
        })
    }
    async fn remove_network(&self, name: &str) -> Result<(), SandboxError> {
        self.state().networks.retain(|n| n != name);
        Ok(())
    }
    async fn networks_named(&self, prefix: &str) -> Result<Vec<String>, SandboxError> {
        Ok(self
            .state()
            .networks
            .iter()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect())
    }
    async fn connect_network(
        &self,
        _container: &str,
        network: &str,
    ) -> Result<String, SandboxError> {
        self.state().networks.push(network.into());
        Ok("127.0.0.1".into())
    }
    fn remove_detached(&self, container: &str) -> tokio::task::JoinHandle<()> {
        self.state().removed.push(container.into());
        tokio::spawn(async {})
    }
    async fn list_containers(
        &self,
        _labels: &[String],
    ) -> Result<Vec<ContainerInfo>, SandboxError> {
        Ok(Vec::new())
    }
    async fn copy_dir_in(
        &self,
        _container: &str,
        _host_dir: &Path,
        _dest: &str,
        _filter: &TarFilter,
    ) -> Result<u64, SandboxError> {
        Ok(0)
    }
    async fn put_files(
        &self,
        _container: &str,
        _files: &[(String, Vec<u8>, u32)],
    ) -> Result<(), SandboxError> {
        Ok(())
    }
    async fn read_file(
        &self,
        _container: &str,
        _path: &str,
        _max: u64,
    ) -> Result<Option<Vec<u8>>, SandboxError> {
        Ok(None)
    }
    async fn exec(
        &self,
        _container: &str,
        spec: &ExecSpec,
        redactor: &Redactor,
        observer: &dyn ExecObserver,
    ) -> Result<ExecOutcome, SandboxError> {
        self.state().execs.push(spec.argv.clone());
        match (self.script)(&spec.argv) {
            Answer::EngineGone => Err(gone()),
            Answer::Exit(code, out) => {
                let out = redactor.redact(&out).into_owned();
                observer.output(StreamKind::Stdout, out.as_bytes());
                if let Some(dir) = spec.log_path.parent() {
                    let _ = fs_err::create_dir_all(dir);
                }
                let _ = fs_err::write(&spec.log_path, &out);
                Ok(ExecOutcome {
                    exit_code: code,
                    log_bytes: out.len() as u64,
                    stdout_tail: out,
                    ..Default::default()
                })
            }
        }
    }
    async fn commit(
        &self,
        _container: &str,
        image_ref: &str,
        _labels: &BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        let id = self.id("sha256:");
        let mut s = self.state();
        s.images.insert(image_ref.into(), id.clone());
        s.gone.retain(|g| g != image_ref);
        Ok(id)
    }
    async fn build(
        &self,
        req: &BuildRequest,
        _redactor: &Redactor,
    ) -> Result<String, SandboxError> {
        let id = self.id("sha256:");
        self.state().images.insert(req.tag.clone(), id.clone());
        Ok(id)
    }
}
