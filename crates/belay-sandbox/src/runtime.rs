use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use belay_record::Redactor;

use crate::{ExecObserver, SandboxError, TarFilter};

/// Container network mode. `None` is the default everywhere belay runs commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    None,
    Bridge,
}

impl Network {
    pub fn as_docker(&self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Bridge => "bridge",
        }
    }
}

/// A network belay made: the host's address on it, and its bridge interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkInfo {
    pub gateway: String,
    pub bridge: Option<String>,
}

/// A bind mount from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

/// What a container is created with.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    pub image: String,
    pub run_id: String,
    /// What the container is for, recorded as the `belay.kind` label.
    pub kind: String,
    pub network: Network,
    pub env: Vec<(String, String)>,
    pub labels: BTreeMap<String, String>,
    pub working_dir: Option<String>,
    pub mounts: Vec<Mount>,
    pub read_only_rootfs: bool,
    pub drop_capabilities: bool,
    /// Memory cap (`None`: [`crate::default_memory`]; `Some(0)`: none).
    pub memory_bytes: Option<i64>,
    pub nano_cpus: Option<i64>,
    /// Process cap (`None`: [`crate::DEFAULT_PIDS`]; `Some(0)`: none).
    pub pids_limit: Option<i64>,
    /// Leave the owner labels blank: a container kept for the user, which the
    /// reaper must not remove when this process is gone.
    pub unowned: bool,
    /// Writable tmpfs mounts (needed with a read-only root filesystem).
    pub tmpfs: Vec<String>,
    /// A seccomp profile (the JSON text) instead of the engine's default.
    pub seccomp_profile: Option<String>,
    /// Attach to this network instead of `network` (an internal network whose
    /// only way out is an egress proxy).
    pub network_name: Option<String>,
    /// Run the container's own processes (init and the idle main process) as
    /// this `uid:gid` instead of the image's user, while commands are still
    /// exec'd as the image's user: a command then cannot ptrace, write the
    /// memory of, or signal the processes that outlive every step (it has no
    /// CAP_SYS_PTRACE, CAP_KILL or CAP_SETUID). Not for containers that are
    /// committed as images (the user would be baked in).
    pub idle_user: Option<String>,
    /// A host file that belay holds an exclusive `flock` on for as long as it
    /// lives. The container's main process waits for that lock and then
    /// exits, which ends the container: whatever kills belay, even
    /// `kill -9`, ends everything in it. The image needs `flock`
    /// (util-linux).
    pub lifeline: Option<std::path::PathBuf>,
    /// The main process instead of the idle one (a relay).
    pub cmd: Option<Vec<String>>,
    /// `host:ip` entries for `/etc/hosts` (`host-gateway` is the engine's
    /// address of the host).
    pub extra_hosts: Vec<String>,
    /// The container's network has no name service: its only way out is a
    /// proxy that resolves names itself. Every lookup is refused at once
    /// (instead of waiting for the engine's resolver, which an internal
    /// network never answers), while `/etc/hosts` still resolves.
    pub refuse_dns: bool,
}

/// One command to execute in a running container.
#[derive(Debug, Clone)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    pub working_dir: Option<String>,
    pub env: Vec<(String, String)>,
    /// Hard limit; on expiry the whole process group of the command is killed.
    pub timeout: Option<Duration>,
    /// Full stdout and stderr go here, streamed, redacted.
    pub log_path: PathBuf,
    /// Cap of the log in bytes (`None`: [`crate::logsink::DEFAULT_LOG_LIMIT`],
    /// `Some(0)`: none); output past it is counted, not kept.
    pub log_limit: Option<u64>,
}

/// How an exec ended. Tails are bounded and redacted.
#[derive(Debug, Clone, Default)]
pub struct ExecOutcome {
    pub exit_code: i64,
    pub timed_out: bool,
    pub duration: Duration,
    pub stdout_tail: String,
    pub stderr_tail: String,
    pub log_bytes: u64,
}

impl ExecOutcome {
    pub fn success(&self) -> bool {
        self.exit_code == 0 && !self.timed_out
    }
}

/// A `docker build` request.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub dockerfile: PathBuf,
    pub context_dir: PathBuf,
    pub tag: String,
    pub labels: BTreeMap<String, String>,
    pub timeout: Duration,
    pub log_path: PathBuf,
    pub network: Network,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineInfo {
    pub server_version: String,
    pub api_version: String,
    pub negotiated_api_version: String,
    pub os: String,
    pub storage_driver: String,
}

#[derive(Debug, Clone)]
pub struct ImageInfo {
    pub id: String,
    pub tags: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub created: i64,
    pub size: i64,
}

#[derive(Debug, Clone)]
pub struct ContainerInfo {
    pub id: String,
    pub names: Vec<String>,
    pub image: String,
    pub labels: BTreeMap<String, String>,
    pub state: String,
}

/// The operations belay's engines need from a container engine.
#[async_trait]
pub trait ContainerRuntime: Send + Sync {
    async fn info(&self) -> Result<EngineInfo, SandboxError>;
    /// Whether the engine answers a ping within `within`, whatever failure
    /// this runtime holds (a batch waiting out a stalled engine asks this).
    async fn engine_answers(&self, _within: std::time::Duration) -> bool {
        true
    }
    /// Whether a process of the running container `id` listens on TCP
    /// `port` of the container's loopback, waiting up to `within`: false
    /// once the container has stopped, and where this host cannot see the
    /// container's network (an engine in a VM), so that the caller falls
    /// back to a network route.
    async fn wait_listening(&self, _id: &str, _port: u16, _within: std::time::Duration) -> bool {
        false
    }
    /// Whether the running container `id` still has a mount at `path` (a
    /// file bind mount is detached when its name is replaced on the host):
    /// false where this host cannot see the container's mounts.
    async fn mount_attached(&self, _id: &str, _path: &str) -> bool {
        false
    }
    /// Forget the engine failure this runtime holds (its calls fail at once
    /// with it until then): the engine answers again.
    fn clear_infra(&self) {}
    async fn image_exists(&self, image: &str) -> Result<bool, SandboxError>;
    async fn image(&self, image: &str) -> Result<Option<ImageInfo>, SandboxError>;
    async fn list_images(&self, label_filters: &[String]) -> Result<Vec<ImageInfo>, SandboxError>;
    async fn remove_image(&self, image: &str) -> Result<(), SandboxError>;
    async fn tag_image(&self, image: &str, new_ref: &str) -> Result<(), SandboxError>;
    /// Import a root filesystem directory as an image (`docker import`) with
    /// Dockerfile `changes` (`LABEL …`, `ENV …`); returns its id.
    async fn import_rootfs(
        &self,
        rootfs: &std::path::Path,
        image_ref: &str,
        changes: Vec<String>,
    ) -> Result<String, SandboxError>;

    /// Create and start a container that idles until commands are exec'd into it.
    /// It carries `belay=true`, `belay.run` and the owner labels.
    async fn create(&self, spec: &ContainerSpec) -> Result<String, SandboxError>;
    /// End a step: kill every process in the container except its own init
    /// and main process (by recorded identity, never by name), and empty its
    /// `/tmp` and `/dev/shm`. How many processes were killed.
    async fn end_step(&self, container: &str) -> Result<usize, SandboxError>;
    /// End an agent's call in a container kept for the same role's next
    /// call: kill every process but its init and main process, as
    /// [`ContainerRuntime::end_step`], but keep `/tmp` (mounts a box makes,
    /// a `cmd:` program or a login directory, can be under it).
    async fn end_call(&self, container: &str) -> Result<usize, SandboxError> {
        self.end_step(container).await
    }
    /// Whether [`ContainerRuntime::end_call`] ends the container's processes
    /// from the host, by sweeping its process namespace until none is left
    /// (a local engine whose processes belay may signal). Otherwise it is a
    /// sweep from inside, which a process that keeps forking can outrun: a
    /// box is then removed, never kept or retired.
    fn sweeps_from_host(&self, _container: &str) -> bool {
        false
    }
    /// The user commands run as in this container (`docker exec -u`): the
    /// image's user, or `None` for the container's own.
    fn exec_user(&self, container: &str) -> Option<String>;
    async fn remove(&self, container: &str) -> Result<(), SandboxError>;
    /// Remove a named volume (gone already counts as removed).
    async fn remove_volume(&self, name: &str) -> Result<(), SandboxError>;
    /// Create a network (or find the one of that name); the host's address on
    /// it (its gateway). `internal`: no route out of it.
    async fn ensure_network(&self, name: &str, internal: bool)
        -> Result<NetworkInfo, SandboxError>;
    async fn remove_network(&self, name: &str) -> Result<(), SandboxError>;
    /// The names of the networks whose name starts with `prefix` (a run's
    /// routes are `belay-<run>-…`). An engine that cannot list them says none.
    async fn networks_named(&self, _prefix: &str) -> Result<Vec<String>, SandboxError> {
        Ok(Vec::new())
    }
    /// The volumes whose names start with `prefix`.
    async fn volumes_named(&self, _prefix: &str) -> Result<Vec<String>, SandboxError> {
        Ok(Vec::new())
    }
    /// Attach a running container to another network; its address there.
    async fn connect_network(&self, container: &str, network: &str)
        -> Result<String, SandboxError>;
    /// Remove a container in the background; await the handle before exiting.
    fn remove_detached(&self, container: &str) -> tokio::task::JoinHandle<()>;
    async fn list_containers(
        &self,
        label_filters: &[String],
    ) -> Result<Vec<ContainerInfo>, SandboxError>;

    /// Copy a host directory to `dest` in the container, streamed as tar.
    async fn copy_dir_in(
        &self,
        container: &str,
        host_dir: &Path,
        dest: &str,
        filter: &TarFilter,
    ) -> Result<u64, SandboxError>;
    /// Write files (path in container -> content, mode) into the container.
    async fn put_files(
        &self,
        container: &str,
        files: &[(String, Vec<u8>, u32)],
    ) -> Result<(), SandboxError>;
    /// Read one regular file out of the container (at most `max_bytes`; a
    /// larger file is an error). `Ok(None)` when there is no such file.
    async fn read_file(
        &self,
        container: &str,
        path: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, SandboxError>;

    async fn exec(
        &self,
        container: &str,
        spec: &ExecSpec,
        redactor: &Redactor,
        observer: &dyn ExecObserver,
    ) -> Result<ExecOutcome, SandboxError>;

    /// Commit the container to `image_ref` with labels; returns the image id.
    async fn commit(
        &self,
        container: &str,
        image_ref: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<String, SandboxError>;

    async fn build(&self, req: &BuildRequest, redactor: &Redactor) -> Result<String, SandboxError>;

    /// Push, pull and look up images in a registry through this engine, as a
    /// handle that may outlive the borrow (background pushes hold it).
    /// `None`: this runtime cannot use a registry.
    fn image_registry(&self) -> Option<std::sync::Arc<dyn crate::ImageRegistry>> {
        None
    }

    /// Jobs on the swarm this engine manages. `None`: not supported.
    fn swarm_jobs(&self) -> Option<std::sync::Arc<dyn crate::swarm::SwarmJobs>> {
        None
    }
}
