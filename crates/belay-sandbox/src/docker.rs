//! The Docker Engine API backend.

/// Where a container's lifeline is mounted.
/// Where a container sees its lifeline file.
pub const LIFELINE: &str = "/run/belay-lifeline";

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use belay_record::{ProcessIdentity, Redactor};
use bollard::models::{ContainerConfig, ContainerCreateBody, HostConfig};
use bollard::query_parameters as qp;
use bollard::Docker;
use futures_util::StreamExt;
use tokio_util::io::ReaderStream;

use crate::infra::{classify_api_error, classify_exit, Sticky};
use crate::logsink::LogSink;
use crate::runtime::*;
use crate::tarstream::{tar_dir_stream, tar_files};
use crate::{
    labels, split_image_ref, ExecObserver, InfraFailure, SandboxError, StreamKind, TarFilter,
};

mod registry;
mod swarm;

/// The default pids limit of a container (a fork bomb stops here).
pub const DEFAULT_PIDS: i64 = 4096;

/// The default memory limit of a container: 8 GiB, or three quarters of the
/// machine's memory when that is less.
pub fn default_memory() -> i64 {
    let total = fs_err::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map(|kb| kb * 1024);
    let cap = 8i64 << 30;
    total.map(|t| (t / 4 * 3).min(cap)).unwrap_or(cap)
}

/// The fallback sweep, run inside the container when its processes cannot be
/// seen from the host: kill every process but PID 1, PID 1's child with the
/// earliest start time (the main process, started before any exec: no later
/// process can claim an earlier start), and this shell's own chain.
const IN_CONTAINER_SWEEP: &str = r#"PATH=/usr/sbin:/usr/bin:/sbin:/bin
main=; best=
for c in $(cat /proc/1/task/1/children 2>/dev/null); do
  t=$(sed 's/.*) //' /proc/$c/stat 2>/dev/null | cut -d' ' -f20)
  [ -n "$t" ] || continue
  if [ -z "$best" ] || [ "$t" -lt "$best" ]; then best=$t; main=$c; fi
done
ppid_of() { sed -n 's/^PPid:[[:space:]]*//p' /proc/$1/status 2>/dev/null; }
skip=" 1 $main $$ "; p=$$
while [ -n "$p" ] && [ "$p" != 1 ] && [ "$p" != 0 ]; do p=$(ppid_of $p); skip="$skip$p "; done
n=0
for pass in 1 2 3 4 5; do
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$skip" in *" $p "*) continue ;; esac
    kill -KILL $p 2>/dev/null && n=$((n+1))
  done
done
find /tmp /dev/shm -mindepth 1 -delete 2>/dev/null
echo $n"#;

/// How long belay waits for the daemon to answer the first request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an ordinary Engine API call may take (`BELAY_ENGINE_TIMEOUT_S`,
/// default 120 s, bollard's own).
const API_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a long operation may take: a commit of a large layer, an upload,
/// an image import or build, a push or pull. Under load these take minutes,
/// and a short client timeout would call a busy engine unreachable.
const SLOW_API_TIMEOUT: Duration = Duration::from_secs(2 * 3600);

/// The ordinary calls' timeout: `BELAY_ENGINE_TIMEOUT_S` or 120 s.
fn api_timeout() -> Duration {
    secs_from_env("BELAY_ENGINE_TIMEOUT_S").unwrap_or(API_TIMEOUT)
}

/// The long operations' timeout: `BELAY_ENGINE_SLOW_TIMEOUT_S` or 2 h.
fn slow_api_timeout() -> Duration {
    secs_from_env("BELAY_ENGINE_SLOW_TIMEOUT_S").unwrap_or(SLOW_API_TIMEOUT)
}

fn secs_from_env(var: &str) -> Option<Duration> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}
/// After killing a timed-out command, how long to wait for its streams to close.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// A [`ContainerRuntime`] over the Docker Engine API.
#[derive(Clone)]
pub struct DockerRuntime {
    docker: Docker,
    /// The same client with [`SLOW_API_TIMEOUT`], for long operations.
    slow: Docker,
    sticky: Arc<Sticky>,
    owner: BTreeMap<String, String>,
    negotiated: String,
    /// The init and main process of each container this runtime started.
    procs: Arc<std::sync::Mutex<HashMap<String, crate::procs::ContainerProcs>>>,
    /// The user commands are exec'd as, for containers whose own processes
    /// run as another (`ContainerSpec::idle_user`).
    exec_users: Arc<std::sync::Mutex<HashMap<String, String>>>,
    /// One direct registry client per registry host (see
    /// [`crate::distribution`]), made on first use.
    distributions: Arc<tokio::sync::Mutex<HashMap<String, Arc<crate::distribution::Distribution>>>>,
}

impl std::fmt::Debug for DockerRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerRuntime")
            .field("negotiated", &self.negotiated)
            .finish()
    }
}

impl DockerRuntime {
    /// Connect (honouring `DOCKER_HOST`) and negotiate the API version, so that
    /// older daemons (20.10, API 1.41) are spoken to in their own version.
    pub async fn connect() -> Result<Self, SandboxError> {
        let docker =
            Docker::connect_with_local_defaults().map_err(|e| InfraFailure::DaemonGone {
                detail: e.to_string(),
            })?;
        let docker = match tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version()).await {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => {
                return Err(InfraFailure::DaemonGone {
                    detail: e.to_string(),
                }
                .into())
            }
            Err(_) => {
                return Err(InfraFailure::DaemonGone {
                    detail: format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
                }
                .into())
            }
        };
        let negotiated = docker.client_version().to_string();
        let slow = docker.clone().with_timeout(slow_api_timeout());
        let docker = docker.with_timeout(api_timeout());
        let mut owner = BTreeMap::new();
        if let Some(me) = ProcessIdentity::current() {
            owner.insert(labels::OWNER_PID.to_string(), me.pid.to_string());
            owner.insert(labels::OWNER_START.to_string(), me.start_ticks.to_string());
            owner.insert(labels::OWNER_BOOT.to_string(), me.boot_id);
        }
        owner.insert(labels::OWNER_MACHINE.to_string(), labels::machine_id());
        Ok(Self {
            docker,
            slow,
            sticky: Arc::new(Sticky::default()),
            owner,
            negotiated,
            procs: Default::default(),
            exec_users: Default::default(),
            distributions: Default::default(),
        })
    }

    /// The API version in use after negotiation.
    pub fn api_version(&self) -> &str {
        &self.negotiated
    }

    /// Whether a container is there and running.
    async fn is_running(&self, container: &str) -> bool {
        self.docker
            .inspect_container(container, None)
            .await
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.running)
            .unwrap_or(false)
    }

    /// Whether a container stops within a second: a command killed by
    /// SIGKILL is often the first sign of its container being killed, which
    /// the engine shows a moment later.
    async fn ends_soon(&self, container: &str) -> bool {
        for _ in 0..10 {
            if !self.is_running(container).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// The sticky failure of a container that ended under a running exec.
    fn container_gone(&self, container: &str) -> SandboxError {
        SandboxError::Infra(self.sticky.raise(InfraFailure::ContainerGone {
            container: container.chars().take(12).collect(),
        }))
    }

    /// Map an API error: infra failures become sticky, others keep their context.
    fn api_err(&self, op: &'static str, e: bollard::errors::Error) -> SandboxError {
        self.err_within(op, e, api_timeout())
    }

    /// [`Self::api_err`] for a call of the long operations' client.
    fn slow_err(&self, op: &'static str, e: bollard::errors::Error) -> SandboxError {
        self.err_within(op, e, slow_api_timeout())
    }

    fn err_within(
        &self,
        op: &'static str,
        e: bollard::errors::Error,
        limit: Duration,
    ) -> SandboxError {
        if matches!(e, bollard::errors::Error::RequestTimeoutError) {
            return SandboxError::Infra(self.sticky.raise(InfraFailure::EngineTimeout {
                op: op.to_string(),
                secs: limit.as_secs(),
            }));
        }
        match classify_api_error(&e) {
            Some(f) => SandboxError::Infra(self.sticky.raise(f)),
            None => SandboxError::Docker {
                op,
                message: docker_message(&e),
            },
        }
    }

    fn check(&self) -> Result<(), SandboxError> {
        self.sticky.check().map_err(SandboxError::Infra)
    }

    /// A container's labels: the spec's, belay's own and, unless it is
    /// unowned, this process's.
    fn container_labels(&self, spec: &ContainerSpec) -> BTreeMap<String, String> {
        let mut lbl = spec.labels.clone();
        lbl.insert(labels::BELAY.into(), "true".into());
        lbl.insert(labels::RUN.into(), spec.run_id.clone());
        lbl.insert(labels::KIND.into(), spec.kind.clone());
        if !spec.unowned {
            lbl.extend(self.owner.clone());
        }
        lbl
    }

    /// The user commands are exec'd as when the idle processes run as
    /// another: the image's (root when it names none).
    async fn exec_user_of(&self, spec: &ContainerSpec) -> Option<String> {
        match &spec.idle_user {
            Some(_) => Some(
                self.docker
                    .inspect_image(&spec.image)
                    .await
                    .ok()
                    .and_then(|i| i.config)
                    .and_then(|c| c.user)
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| "0:0".to_string()),
            ),
            None => None,
        }
    }

    /// The host's pid of a running container's main process.
    async fn main_pid(&self, id: &str) -> Option<i64> {
        let info = self.docker.inspect_container(id, None).await.ok()?;
        info.state.and_then(|s| s.pid).filter(|p| *p > 0)
    }

    /// Record a new container's own init and main process.
    async fn record_procs(&self, id: &str) {
        let Some(pid) = self.main_pid(id).await else {
            return;
        };
        if let Some(p) = u32::try_from(pid)
            .ok()
            .and_then(crate::procs::ContainerProcs::record)
        {
            if let Ok(mut m) = self.procs.lock() {
                m.insert(id.to_string(), p);
            }
        }
    }

    async fn kill_group(&self, container: &str, pidfile: &str) {
        let script = format!(
            "p=$(cat {pidfile} 2>/dev/null) && [ -n \"$p\" ] && (kill -KILL -\"$p\" 2>/dev/null || kill -KILL \"$p\")"
        );
        let cfg = bollard::exec::CreateExecOptions::<String> {
            cmd: Some(vec!["/bin/sh".into(), "-c".into(), script]),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            user: self.exec_user(container),
            ..Default::default()
        };
        if let Ok(ex) = self.docker.create_exec(container, cfg).await {
            let _ = self
                .docker
                .start_exec(
                    &ex.id,
                    Some(bollard::exec::StartExecOptions {
                        detach: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
    }
}

/// The host side of a container: network, mounts (the lifeline too),
/// confinement and limits.
fn host_config(spec: &ContainerSpec, files: Vec<Mount>) -> HostConfig {
    let lifeline = spec.lifeline.as_ref().map(|l| Mount {
        host: l.clone(),
        container: LIFELINE.into(),
        read_only: true,
    });
    let mounts: Vec<String> = spec
        .mounts
        .iter()
        .chain(lifeline.iter())
        .chain(files.iter())
        .map(|m| {
            format!(
                "{}:{}:{}",
                m.host.display(),
                m.container,
                if m.read_only { "ro" } else { "rw" }
            )
        })
        .collect();
    HostConfig {
        network_mode: Some(
            spec.network_name
                .clone()
                .unwrap_or_else(|| spec.network.as_docker().to_string()),
        ),
        binds: if mounts.is_empty() {
            None
        } else {
            Some(mounts)
        },
        readonly_rootfs: spec.read_only_rootfs.then_some(true),
        cap_drop: spec.drop_capabilities.then(|| vec!["ALL".to_string()]),
        security_opt: {
            let mut o = Vec::new();
            if spec.drop_capabilities {
                o.push("no-new-privileges".to_string());
            }
            if let Some(p) = &spec.seccomp_profile {
                o.push(format!("seccomp={p}"));
            }
            (!o.is_empty()).then_some(o)
        },
        tmpfs: (!spec.tmpfs.is_empty()).then(|| {
            spec.tmpfs
                .iter()
                .map(|p| (p.clone(), "rw,nosuid,size=1g".to_string()))
                .collect()
        }),
        memory: Some(spec.memory_bytes.unwrap_or_else(default_memory)).filter(|m| *m > 0),
        nano_cpus: spec.nano_cpus,
        pids_limit: Some(spec.pids_limit.unwrap_or(DEFAULT_PIDS)).filter(|p| *p > 0),
        init: Some(true),
        extra_hosts: (!spec.extra_hosts.is_empty()).then(|| spec.extra_hosts.clone()),
        sysctls: loopback_ipv6(),
        ..Default::default()
    }
}

/// Set once a container would not start with [`loopback_ipv6`]'s setting
/// (the engine runs on a kernel without IPv6): no later container asks.
static NO_IPV6: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// IPv6 on the container's loopback, as on a developer's machine. Docker
/// turns it off in a container's own network namespace, yet its
/// `/etc/hosts` names `::1 localhost`: node (which takes the first address
/// a lookup gives) then cannot listen on or reach `localhost`
/// (`EADDRNOTAVAIL ::1`). Only where the host's kernel has IPv6 at all
/// (booted with `ipv6.disable=1` it has no such setting, and the engine
/// would refuse the container). An engine on another kernel is found out
/// by its refusal: the container is made again without it.
fn loopback_ipv6() -> Option<std::collections::HashMap<String, String>> {
    static HAS_IPV6: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let here = *HAS_IPV6
        .get_or_init(|| std::path::Path::new("/proc/sys/net/ipv6/conf/lo/disable_ipv6").exists());
    (here && !NO_IPV6.load(std::sync::atomic::Ordering::Relaxed)).then(|| {
        std::collections::HashMap::from([(
            "net.ipv6.conf.lo.disable_ipv6".to_string(),
            "0".to_string(),
        )])
    })
}

const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The resolver configuration of a container whose lookups are refused: the
/// name server is the container's own loopback, where nothing listens, so a
/// query gets a port-unreachable at once (glibc, c-ares and Go fail on it
/// at once; musl, which does not see it, gives up after one second).
const REFUSING_RESOLV: &str = "# belay: this sandbox has no name service; its proxy resolves names\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n";

/// The host file mounted as `/etc/resolv.conf` where lookups are refused
/// (in belay's state, written once, atomically).
fn refusing_resolv_conf() -> Result<Mount, SandboxError> {
    state_mount("resolv.conf", REFUSING_RESOLV, RESOLV_CONF)
}

const HOSTS: &str = "/etc/hosts";

/// The hosts file of a container without network: the engine's names
/// (`localhost` is both 127.0.0.1 and `::1`), which is all the engine writes
/// there without network (no address of the container's own). A lookup of
/// `localhost` for IPv6 alone (node's `http.get(server.address())` of a
/// server on `::`) finds `::1`.
const LOOPBACK_HOSTS: &str = "# belay: this sandbox has no network
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
ff00::0\tip6-mcastprefix
ff02::1\tip6-allnodes
ff02::2\tip6-allrouters
";

/// The host file mounted as `/etc/hosts` in a container without network.
fn loopback_hosts() -> Result<Mount, SandboxError> {
    state_mount("hosts", LOOPBACK_HOSTS, HOSTS)
}

/// `text` as the file `name` in belay's state (written once, atomically),
/// mounted read-only at `container`: a sandbox reads it and cannot change it.
fn state_mount(name: &str, text: &str, container: &str) -> Result<Mount, SandboxError> {
    let dir = belay_record::state_home().join("sandbox");
    let path = dir.join(name);
    let now = belay_record::read_regular(&path, 4096).ok().flatten();
    if now.as_deref() != Some(text.as_bytes()) {
        std::fs::create_dir_all(&dir).map_err(|e| SandboxError::io("create", &dir, e))?;
        belay_record::atomic_write(&path, text.as_bytes())
            .map_err(|e| SandboxError::from_record("create container", e))?;
    }
    Ok(Mount {
        host: path,
        container: container.into(),
        read_only: true,
    })
}

/// What a container is created with, its host side `host` and labels `lbl`.
fn create_body(
    spec: &ContainerSpec,
    lbl: &BTreeMap<String, String>,
    host: HostConfig,
) -> ContainerCreateBody {
    let env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        user: spec.idle_user.clone(),
        cmd: Some(match (&spec.cmd, &spec.lifeline) {
            (Some(cmd), _) => cmd.clone(),
            // Ends (and with it the container) once belay's lock goes.
            (None, Some(_)) => {
                vec!["flock".into(), "-s".into(), LIFELINE.into(), "true".into()]
            }
            (None, None) => vec!["sleep".into(), "infinity".into()],
        }),
        entrypoint: Some(vec![]),
        env: Some(env),
        labels: Some(to_hash(lbl)),
        working_dir: spec.working_dir.clone(),
        host_config: Some(host),
        // No `network_disabled`: network mode `none` already gives a
        // namespace with only loopback, and disabling the network also
        // leaves `/etc/hosts` empty, so `localhost` does not resolve and a
        // test suite that binds a loopback server fails.
        networking_config: spec
            .network_name
            .as_ref()
            .map(|n| bollard::models::NetworkingConfig {
                endpoints_config: Some(HashMap::from([(n.clone(), Default::default())])),
            }),
        ..Default::default()
    }
}

fn docker_message(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            message,
            status_code,
        } => {
            format!("{message} (HTTP {status_code})")
        }
        other => other.to_string(),
    }
}

fn to_hash(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn label_filter(filters: &[String]) -> Option<HashMap<String, Vec<String>>> {
    let mut f = HashMap::new();
    f.insert("label".to_string(), filters.to_vec());
    Some(f)
}

static EXEC_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[async_trait]
impl ContainerRuntime for DockerRuntime {
    async fn engine_answers(&self, within: Duration) -> bool {
        matches!(
            tokio::time::timeout(within, self.docker.clone().with_timeout(within).ping()).await,
            Ok(Ok(_))
        )
    }

    fn clear_infra(&self) {
        self.sticky.clear();
    }

    async fn mount_attached(&self, id: &str, path: &str) -> bool {
        let Some(pid) = self.main_pid(id).await else {
            return false;
        };
        let table = std::path::PathBuf::from(format!("/proc/{pid}/mountinfo"));
        std::fs::read_to_string(&table).is_ok_and(|t| crate::procs::mounted_at(&t, path))
    }

    async fn wait_listening(&self, id: &str, port: u16, within: Duration) -> bool {
        let Some(pid) = self.main_pid(id).await else {
            return false;
        };
        // The container's own sockets, as the host sees its namespace.
        let table = std::path::PathBuf::from(format!("/proc/{pid}/net/tcp"));
        let want = format!("0100007F:{port:04X}");
        let deadline = Instant::now() + within;
        loop {
            match std::fs::read_to_string(&table) {
                Ok(t) if crate::procs::tcp_listens(&t, &want) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }

    async fn info(&self) -> Result<EngineInfo, SandboxError> {
        self.check()?;
        let v = self
            .docker
            .version()
            .await
            .map_err(|e| self.api_err("version", e))?;
        let storage = match self.docker.info().await {
            Ok(i) => i.driver.unwrap_or_default(),
            Err(_) => String::new(),
        };
        Ok(EngineInfo {
            server_version: v.version.unwrap_or_default(),
            api_version: v.api_version.unwrap_or_default(),
            negotiated_api_version: self.negotiated.clone(),
            os: format!(
                "{}/{}",
                v.os.unwrap_or_default(),
                v.arch.unwrap_or_default()
            ),
            storage_driver: storage,
        })
    }

    async fn image_exists(&self, image: &str) -> Result<bool, SandboxError> {
        Ok(self.image(image).await?.is_some())
    }

    async fn import_rootfs(
        &self,
        rootfs: &Path,
        image_ref: &str,
        changes: Vec<String>,
    ) -> Result<String, SandboxError> {
        self.import_rootfs_dir(rootfs, image_ref, changes).await
    }

    async fn image(&self, image: &str) -> Result<Option<ImageInfo>, SandboxError> {
        self.check()?;
        match self.docker.inspect_image(image).await {
            Ok(i) => Ok(Some(ImageInfo {
                id: i.id.unwrap_or_default(),
                tags: i.repo_tags.unwrap_or_default(),
                labels: i
                    .config
                    .and_then(|c| c.labels)
                    .map(|l| l.into_iter().collect())
                    .unwrap_or_default(),
                created: 0,
                size: i.size.unwrap_or(0),
            })),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(self.api_err("inspect image", e)),
        }
    }

    async fn list_images(&self, label_filters: &[String]) -> Result<Vec<ImageInfo>, SandboxError> {
        self.check()?;
        let opts = qp::ListImagesOptions {
            all: false,
            filters: label_filter(label_filters),
            ..Default::default()
        };
        let list = self
            .docker
            .list_images(Some(opts))
            .await
            .map_err(|e| self.api_err("list images", e))?;
        Ok(list
            .into_iter()
            .map(|i| ImageInfo {
                id: i.id,
                tags: i.repo_tags,
                labels: i.labels.into_iter().collect(),
                created: i.created,
                size: i.size,
            })
            .collect())
    }

    async fn remove_image(&self, image: &str) -> Result<(), SandboxError> {
        self.check()?;
        match self
            .docker
            .remove_image(
                image,
                Some(qp::RemoveImageOptions {
                    force: false,
                    noprune: false,
                    platforms: None,
                }),
                None,
            )
            .await
        {
            Ok(_)
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(self.api_err("remove image", e)),
        }
    }

    async fn tag_image(&self, image: &str, new_ref: &str) -> Result<(), SandboxError> {
        self.check()?;
        let (repo, tag) = split_image_ref(new_ref);
        self.docker
            .tag_image(
                image,
                Some(qp::TagImageOptions {
                    repo: Some(repo.to_string()),
                    tag: Some(tag.to_string()),
                }),
            )
            .await
            .map_err(|e| self.api_err("tag image", e))
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, SandboxError> {
        if let Some(l) = &spec.lifeline {
            if !l.is_file() {
                return Err(SandboxError::Docker {
                    op: "create container",
                    message: format!("the lifeline {} is not a file belay holds", l.display()),
                });
            }
        }
        self.check()?;
        let lbl = self.container_labels(spec);
        let mounted = |path: &str| spec.mounts.iter().any(|m| m.container == path);
        let mut files = Vec::new();
        if spec.refuse_dns && !mounted(RESOLV_CONF) {
            files.push(refusing_resolv_conf()?);
        }
        if spec.network == crate::Network::None
            && spec.network_name.is_none()
            && spec.extra_hosts.is_empty()
            && !mounted(HOSTS)
        {
            files.push(loopback_hosts()?);
        }
        let mut host = host_config(spec, files);
        // Commands keep the image's user; the idle processes get another.
        let exec_user = self.exec_user_of(spec).await;
        let t0 = Instant::now();
        let created = loop {
            let body = create_body(spec, &lbl, host.clone());
            let created = self
                .docker
                .create_container(None::<qp::CreateContainerOptions>, body)
                .await
                .map_err(|e| match &e {
                    bollard::errors::Error::DockerResponseServerError { status_code: 404, .. } => {
                        SandboxError::ImageMissing {
                            image: spec.image.clone(),
                            hint: "Build it (`belay image bootstrap`) or pass an image that exists (`docker images`).".into(),
                        }
                    }
                    _ => self.api_err("create container", e),
                })?;
            match self
                .docker
                .start_container(&created.id, None::<qp::StartContainerOptions>)
                .await
            {
                Ok(()) => break created,
                Err(e) => {
                    let _ = self.remove(&created.id).await;
                    // The engine's kernel has no IPv6 (another machine's,
                    // or a VM's): the loopback stays as the engine makes it.
                    if host.sysctls.is_some() && e.to_string().contains("disable_ipv6") {
                        NO_IPV6.store(true, std::sync::atomic::Ordering::Relaxed);
                        host.sysctls = None;
                        continue;
                    }
                    return Err(self.api_err("start container", e));
                }
            }
        };
        if let (Some(u), Ok(mut m)) = (exec_user, self.exec_users.lock()) {
            m.insert(created.id.clone(), u);
        }
        // Its own two processes, so that a step's leftovers can be told apart.
        self.record_procs(&created.id).await;
        tracing::debug!(image = %spec.image, took_ms = t0.elapsed().as_millis() as u64, "container created and started");
        Ok(created.id)
    }

    async fn ensure_network(
        &self,
        name: &str,
        internal: bool,
    ) -> Result<NetworkInfo, SandboxError> {
        self.check()?;
        let info = |n: bollard::models::NetworkInspect| -> Option<NetworkInfo> {
            let bridge = n
                .options
                .as_ref()
                .and_then(|o| o.get("com.docker.network.bridge.name").cloned())
                .or_else(|| {
                    n.id.as_ref()
                        .map(|id| format!("br-{}", &id[..id.len().min(12)]))
                });
            let gateway = n
                .ipam
                .and_then(|i| i.config)
                .and_then(|c| c.into_iter().find_map(|c| c.gateway))?;
            Some(NetworkInfo { gateway, bridge })
        };
        if let Ok(n) = self.docker.inspect_network(name, None).await {
            if let Some(i) = info(n) {
                return Ok(i);
            }
        }
        let mut labels = HashMap::new();
        labels.insert("belay".to_string(), "true".to_string());
        let mut options = HashMap::new();
        options.insert(
            "com.docker.network.bridge.name".to_string(),
            crate::firewall::bridge_name(name),
        );
        self.docker
            .create_network(bollard::models::NetworkCreateRequest {
                name: name.to_string(),
                driver: Some("bridge".into()),
                internal: Some(internal),
                labels: Some(labels),
                options: Some(options),
                ..Default::default()
            })
            .await
            .map_err(|e| self.api_err("create a network", e))?;
        let n = self
            .docker
            .inspect_network(name, None)
            .await
            .map_err(|e| self.api_err("inspect a network", e))?;
        info(n).ok_or_else(|| SandboxError::Docker {
            op: "create a network",
            message: format!("network {name} has no gateway address"),
        })
    }

    async fn connect_network(
        &self,
        container: &str,
        network: &str,
    ) -> Result<String, SandboxError> {
        self.check()?;
        self.docker
            .connect_network(
                network,
                bollard::models::NetworkConnectRequest {
                    container: container.to_string(),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| self.api_err("connect a network", e))?;
        let c = self
            .docker
            .inspect_container(container, None)
            .await
            .map_err(|e| self.api_err("inspect a container", e))?;
        c.network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(network))
            .and_then(|e| e.ip_address)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| SandboxError::Docker {
                op: "connect a network",
                message: format!("the container has no address on {network}"),
            })
    }

    async fn networks_named(&self, prefix: &str) -> Result<Vec<String>, SandboxError> {
        self.check()?;
        let mut f = HashMap::new();
        f.insert("name".to_string(), vec![prefix.to_string()]);
        let list = self
            .docker
            .list_networks(Some(qp::ListNetworksOptions { filters: Some(f) }))
            .await
            .map_err(|e| self.api_err("list networks", e))?;
        // The engine's name filter matches anywhere in the name: keep prefixes.
        Ok(list
            .into_iter()
            .filter_map(|n| n.name)
            .filter(|n| n.starts_with(prefix))
            .collect())
    }

    async fn volumes_named(&self, prefix: &str) -> Result<Vec<String>, SandboxError> {
        self.check()?;
        let mut f = HashMap::new();
        f.insert("name".to_string(), vec![prefix.to_string()]);
        let list = self
            .docker
            .list_volumes(Some(qp::ListVolumesOptions { filters: Some(f) }))
            .await
            .map_err(|e| self.api_err("list volumes", e))?;
        // As for networks: the name filter matches anywhere in the name.
        Ok(list
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .filter(|n| n.starts_with(prefix))
            .collect())
    }

    async fn remove_network(&self, name: &str) -> Result<(), SandboxError> {
        match self.docker.remove_network(name).await {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(self.api_err("remove a network", e)),
        }
    }

    async fn remove_volume(&self, name: &str) -> Result<(), SandboxError> {
        match self
            .docker
            .remove_volume(name, Some(qp::RemoveVolumeOptions { force: true }))
            .await
        {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(self.api_err("remove a volume", e)),
        }
    }

    async fn end_step(&self, container: &str) -> Result<usize, SandboxError> {
        self.end_processes(container, true).await
    }

    async fn end_call(&self, container: &str) -> Result<usize, SandboxError> {
        self.end_processes(container, false).await
    }

    fn sweeps_from_host(&self, container: &str) -> bool {
        self.procs
            .lock()
            .map(|m| m.contains_key(container))
            .unwrap_or(false)
    }

    fn exec_user(&self, container: &str) -> Option<String> {
        self.exec_users.lock().ok()?.get(container).cloned()
    }

    async fn remove(&self, container: &str) -> Result<(), SandboxError> {
        if let Ok(mut m) = self.procs.lock() {
            m.remove(container);
        }
        if let Ok(mut m) = self.exec_users.lock() {
            m.remove(container);
        }
        // Removal runs even after a sticky failure: cleaning up is always worth trying.
        match self
            .docker
            .remove_container(
                container,
                Some(qp::RemoveContainerOptions {
                    force: true,
                    v: true,
                    link: false,
                }),
            )
            .await
        {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            // "removal already in progress"
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(()),
            Err(e) => Err(self.api_err("remove container", e)),
        }
    }

    fn remove_detached(&self, container: &str) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let id = container.to_string();
        tokio::spawn(async move {
            if let Err(e) = me.remove(&id).await {
                tracing::warn!(container = %id, "cannot remove container: {e}");
            }
        })
    }

    async fn list_containers(
        &self,
        label_filters: &[String],
    ) -> Result<Vec<ContainerInfo>, SandboxError> {
        self.check()?;
        let list = self
            .docker
            .list_containers(Some(qp::ListContainersOptions {
                all: true,
                filters: label_filter(label_filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| self.api_err("list containers", e))?;
        Ok(list
            .into_iter()
            .map(|c| ContainerInfo {
                id: c.id.unwrap_or_default(),
                names: c.names.unwrap_or_default(),
                image: c.image.unwrap_or_default(),
                labels: c.labels.unwrap_or_default().into_iter().collect(),
                state: c.state.map(|s| s.to_string()).unwrap_or_default(),
            })
            .collect())
    }

    async fn copy_dir_in(
        &self,
        container: &str,
        host_dir: &Path,
        dest: &str,
        filter: &TarFilter,
    ) -> Result<u64, SandboxError> {
        self.check()?;
        let (rx, handle) = tar_dir_stream(host_dir, dest, filter);
        let stream = tokio_stream_from(rx);
        let upload = self.slow.upload_to_container(
            container,
            Some(qp::UploadToContainerOptions {
                path: "/".to_string(),
                ..Default::default()
            }),
            bollard::body_try_stream(stream),
        );
        let up = upload.await;
        let count = handle.await.map_err(|e| SandboxError::Docker {
            op: "archive",
            message: e.to_string(),
        })??;
        up.map_err(|e| self.slow_err("copy into container", e))?;
        Ok(count)
    }

    async fn put_files(
        &self,
        container: &str,
        files: &[(String, Vec<u8>, u32)],
    ) -> Result<(), SandboxError> {
        self.check()?;
        let tar = tar_files(files).map_err(|e| SandboxError::Docker {
            op: "archive files",
            message: e.to_string(),
        })?;
        self.slow
            .upload_to_container(
                container,
                Some(qp::UploadToContainerOptions {
                    path: "/".to_string(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await
            .map_err(|e| self.slow_err("copy files into container", e))
    }

    async fn read_file(
        &self,
        container: &str,
        path: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, SandboxError> {
        self.check()?;
        let mut stream = self.docker.download_from_container(
            container,
            Some(qp::DownloadFromContainerOptions {
                path: path.to_string(),
            }),
        );
        // The archive of one file: its header blocks, the content, padding.
        let limit = max_bytes.saturating_add(64 * 1024);
        let mut archive: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => return Ok(None),
                Err(e) => return Err(self.api_err("read a file from the container", e)),
            };
            archive.extend_from_slice(&chunk);
            if archive.len() as u64 > limit {
                return Err(SandboxError::Docker {
                    op: "read a file from the container",
                    message: format!("{path} is larger than {max_bytes} bytes"),
                });
            }
        }
        let mut ar = tar::Archive::new(archive.as_slice());
        let entries = ar.entries().map_err(|e| SandboxError::Docker {
            op: "read a file from the container",
            message: e.to_string(),
        })?;
        for entry in entries {
            let mut entry = entry.map_err(|e| SandboxError::Docker {
                op: "read a file from the container",
                message: e.to_string(),
            })?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            if entry.size() > max_bytes {
                return Err(SandboxError::Docker {
                    op: "read a file from the container",
                    message: format!("{path} is larger than {max_bytes} bytes"),
                });
            }
            let mut out = Vec::with_capacity(entry.size() as usize);
            std::io::Read::read_to_end(&mut entry, &mut out).map_err(|e| SandboxError::Docker {
                op: "read a file from the container",
                message: e.to_string(),
            })?;
            return Ok(Some(out));
        }
        Ok(None)
    }

    async fn exec(
        &self,
        container: &str,
        spec: &ExecSpec,
        redactor: &Redactor,
        observer: &dyn ExecObserver,
    ) -> Result<ExecOutcome, SandboxError> {
        self.check()?;
        let started = Instant::now();
        let seq = EXEC_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pidfile = format!("/tmp/.belay-exec-{}-{seq}.pid", std::process::id());
        // The command runs as the leader of a new process group (setsid), whose
        // id is written to a pidfile, so that a timeout can kill the whole tree.
        let inner = format!("echo $$ > {pidfile}; \"$@\"; rc=$?; rm -f {pidfile}; exit $rc");
        let wrapper = format!(
            "s=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v setsid); if [ -n \"$s\" ]; then exec \"$s\" -w /bin/sh -c '{inner}' belay-exec \"$@\"; \
             else exec /bin/sh -c '{inner}' belay-exec \"$@\"; fi"
        );
        let mut cmd = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            wrapper,
            "belay-exec".to_string(),
        ];
        cmd.extend(spec.argv.iter().cloned());
        let cfg = bollard::exec::CreateExecOptions::<String> {
            cmd: Some(cmd),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            attach_stdin: Some(false),
            tty: Some(false),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            working_dir: spec.working_dir.clone(),
            user: self.exec_user(container),
            ..Default::default()
        };
        let exec = self
            .docker
            .create_exec(container, cfg)
            .await
            .map_err(|e| self.api_err("create exec", e))?;
        let limit = spec.log_limit.unwrap_or(crate::logsink::DEFAULT_LOG_LIMIT);
        let mut sink = LogSink::with_limit(&spec.log_path, redactor, observer, limit)?;
        let started_exec = self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| self.api_err("start exec", e))?;
        let mut timed_out = false;
        if let bollard::exec::StartExecResults::Attached { mut output, .. } = started_exec {
            let deadline = spec.timeout.map(|t| tokio::time::Instant::now() + t);
            let mut killed_at: Option<tokio::time::Instant> = None;
            loop {
                let next = match (deadline, killed_at) {
                    (_, Some(k)) => {
                        match tokio::time::timeout_at(k + KILL_GRACE, output.next()).await {
                            Ok(n) => n,
                            Err(_) => break,
                        }
                    }
                    (Some(d), None) => match tokio::time::timeout_at(d, output.next()).await {
                        Ok(n) => n,
                        Err(_) => {
                            timed_out = true;
                            sink.note(&format!(
                                "\n[belay] command exceeded its timeout of {} s; killing its process group",
                                spec.timeout.map(|t| t.as_secs()).unwrap_or(0)
                            ))?;
                            self.kill_group(container, &pidfile).await;
                            killed_at = Some(tokio::time::Instant::now());
                            continue;
                        }
                    },
                    (None, None) => output.next().await,
                };
                match next {
                    None => break,
                    Some(Ok(bollard::container::LogOutput::StdOut { message })) => {
                        sink.push(StreamKind::Stdout, &message)?
                    }
                    Some(Ok(bollard::container::LogOutput::StdErr { message })) => {
                        sink.push(StreamKind::Stderr, &message)?
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        let _ = sink.finish();
                        return Err(self.api_err("read exec output", e));
                    }
                }
            }
        }
        let (stdout_tail, stderr_tail, log_bytes) = sink.finish()?;
        let inspect = match self.docker.inspect_exec(&exec.id).await {
            Ok(i) => i,
            Err(e) => {
                if !self.is_running(container).await {
                    return Err(self.container_gone(container));
                }
                return Err(self.api_err("inspect exec", e));
            }
        };
        let exit_code = match inspect.exit_code {
            Some(c) => c,
            None if timed_out => 137,
            // No exit code and no container: the command did not end, its
            // container did (killed or removed from outside).
            None if !self.is_running(container).await => {
                return Err(self.container_gone(container));
            }
            None => -1,
        };
        // A command killed with its container (SIGKILL from `docker rm -f`,
        // `docker kill`, the engine's OOM of the whole container) is the
        // machine's failure, not the command's.
        if exit_code == 137 && !timed_out && self.ends_soon(container).await {
            return Err(self.container_gone(container));
        }
        if !timed_out {
            let tail = format!("{stdout_tail}\n{stderr_tail}");
            if let Some(f) = classify_exit(exit_code, &tail) {
                return Err(SandboxError::Infra(self.sticky.raise(f)));
            }
        }
        Ok(ExecOutcome {
            exit_code,
            timed_out,
            duration: started.elapsed(),
            stdout_tail,
            stderr_tail,
            log_bytes,
        })
    }

    async fn commit(
        &self,
        container: &str,
        image_ref: &str,
        lbls: &BTreeMap<String, String>,
    ) -> Result<String, SandboxError> {
        self.check()?;
        let (repo, tag) = split_image_ref(image_ref);
        let mut all = lbls.clone();
        all.insert(labels::BELAY.into(), "true".into());
        // Blank the owner labels: only belay's own containers are ever "owned".
        for k in labels::OWNER_LABELS {
            all.insert(k.to_string(), String::new());
        }
        let config = ContainerConfig {
            labels: Some(to_hash(&all)),
            ..Default::default()
        };
        let opts = qp::CommitContainerOptions {
            container: Some(container.to_string()),
            repo: Some(repo.to_string()),
            tag: Some(tag.to_string()),
            comment: Some("belay checkpoint".to_string()),
            author: Some("belay".to_string()),
            pause: false,
            changes: None,
        };
        let id = self
            .slow
            .commit_container(opts, config)
            .await
            .map_err(|e| self.slow_err("commit", e))?;
        Ok(id.id)
    }

    fn image_registry(&self) -> Option<Arc<dyn crate::ImageRegistry>> {
        Some(Arc::new(self.clone()))
    }

    fn swarm_jobs(&self) -> Option<Arc<dyn crate::swarm::SwarmJobs>> {
        Some(Arc::new(self.clone()))
    }

    async fn build(&self, req: &BuildRequest, redactor: &Redactor) -> Result<String, SandboxError> {
        self.check()?;
        let context = req.context_dir.clone();
        let dockerfile_name = req
            .dockerfile
            .strip_prefix(&context)
            .map(|p| p.to_string_lossy().into_owned())
            .map_err(|_| SandboxError::Docker {
                op: "build",
                message: format!(
                    "the Dockerfile {} must be inside its build context {}",
                    req.dockerfile.display(),
                    context.display()
                ),
            })?;
        let mut sink = LogSink::create(&req.log_path, redactor, &crate::NoopObserver)?;
        sink.note(&format!(
            "[belay] docker build -f {} {}",
            req.dockerfile.display(),
            context.display()
        ))?;
        // The CLI applies .dockerignore on the client side; so must we.
        let filter = TarFilter {
            ignore: crate::tarstream::DockerIgnore::read(&context),
            ..Default::default()
        };
        let (rx, mut handle) = tar_dir_stream(&context, "", &filter);
        let opts = qp::BuildImageOptions {
            dockerfile: dockerfile_name,
            t: Some(req.tag.clone()),
            rm: true,
            forcerm: true,
            labels: Some(to_hash(&req.labels)),
            networkmode: Some(req.network.as_docker().to_string()),
            ..Default::default()
        };
        let stream = self.slow.build_image(
            opts,
            None,
            Some(bollard::body_try_stream(tokio_stream_from(rx))),
        );
        tokio::pin!(stream);
        let timeout = tokio::time::sleep(req.timeout);
        tokio::pin!(timeout);
        let mut image_id = None;
        loop {
            tokio::select! {
                _ = &mut timeout => {
                    let log = req.log_path.clone();
                    let _ = sink.finish();
                    return Err(SandboxError::BuildTimeout { dockerfile: req.dockerfile.clone(), secs: req.timeout.as_secs(), log });
                }
                item = stream.next() => match item {
                    None => break,
                    Some(Ok(info)) => {
                        if let Some(s) = info.stream { sink.push(StreamKind::Stdout, s.as_bytes())?; }
                        if let Some(s) = info.status { sink.push(StreamKind::Stdout, format!("{s}\n").as_bytes())?; }
                        if let Some(aux) = info.aux { image_id = aux.id; }
                        if let Some(err) = info.error_detail.and_then(|d| d.message) {
                            sink.push(StreamKind::Stderr, err.as_bytes())?;
                            let _ = sink.finish();
                            return Err(SandboxError::BuildFailed { dockerfile: req.dockerfile.clone(), message: err, log: req.log_path.clone() });
                        }
                    }
                    Some(Err(e)) => {
                        // A failure to read the context is reported as itself, not as
                        // the broken request it caused.
                        if handle.is_finished() {
                            if let Ok(Err(ctx_err)) = (&mut handle).await {
                                let _ = sink.finish();
                                return Err(ctx_err);
                            }
                        }
                        let msg = docker_message(&e);
                        sink.push(StreamKind::Stderr, msg.as_bytes())?;
                        let _ = sink.finish();
                        if let Some(f) = classify_api_error(&e) {
                            if !matches!(e, bollard::errors::Error::DockerStreamError { .. }) {
                                return Err(SandboxError::Infra(self.sticky.raise(f)));
                            }
                        }
                        return Err(SandboxError::BuildFailed { dockerfile: req.dockerfile.clone(), message: msg, log: req.log_path.clone() });
                    }
                }
            }
        }
        let _ = handle.await;
        sink.finish()?;
        match image_id {
            Some(id) => Ok(id),
            None => Ok(self
                .image(&req.tag)
                .await?
                .map(|i| i.id)
                .unwrap_or_default()),
        }
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

impl DockerRuntime {
    /// Import a root filesystem directory as an image (`docker import`), streaming
    /// `tar -C DIR -c .` (which keeps device nodes, hard links and ownership)
    /// straight into the Engine API.
    pub async fn import_rootfs_dir(
        &self,
        rootfs: &Path,
        image_ref: &str,
        changes: Vec<String>,
    ) -> Result<String, SandboxError> {
        self.check()?;
        let mut child = tokio::process::Command::new("tar")
            .arg("-C")
            .arg(rootfs)
            .args(["--numeric-owner", "-c", "."])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SandboxError::io("cannot run tar on", rootfs, e))?;
        let stdout = child.stdout.take().ok_or_else(|| SandboxError::Docker {
            op: "import",
            message: "tar has no stdout".into(),
        })?;
        let (repo, tag) = split_image_ref(image_ref);
        let opts = qp::CreateImageOptions {
            from_src: Some("-".to_string()),
            repo: Some(repo.to_string()),
            tag: Some(tag.to_string()),
            changes,
            ..Default::default()
        };
        let body = bollard::body_try_stream(ReaderStream::with_capacity(stdout, 256 * 1024));
        let mut stream = self.slow.create_image(Some(opts), Some(body), None);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                let _ = child.kill().await;
                return Err(self.api_err("import", e));
            }
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| SandboxError::io("cannot run tar on", rootfs, e))?;
        if !out.status.success() {
            return Err(SandboxError::Bootstrap(format!(
                "tar of {} failed: {}",
                rootfs.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(self
            .image(image_ref)
            .await?
            .map(|i| i.id)
            .unwrap_or_default())
    }
}

impl DockerRuntime {
    /// Kill every process in `container` but its init and main process
    /// (by recorded identity), and with `wipe` empty `/tmp` and `/dev/shm`.
    async fn end_processes(&self, container: &str, wipe: bool) -> Result<usize, SandboxError> {
        self.check()?;
        let recorded = self
            .procs
            .lock()
            .ok()
            .and_then(|m| m.get(container).cloned());
        if let Some(mut p) = recorded {
            // A sweep may wait for the processes it killed to die: off the
            // runtime's threads.
            let (back, swept) = tokio::task::spawn_blocking(move || {
                let r = p.sweep();
                (p, r)
            })
            .await
            .map_err(|e| SandboxError::Docker {
                op: "end a step's processes",
                message: e.to_string(),
            })?;
            p = back;
            let swept = swept?;
            if wipe {
                p.wipe_scratch()?;
            }
            if let Ok(mut m) = self.procs.lock() {
                m.insert(container.to_string(), p);
            }
            return Ok(swept.killed);
        }
        // The engine's processes are not visible from here (a remote
        // engine): the same, from inside, by recorded pid (never by name).
        let spec = ExecSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), IN_CONTAINER_SWEEP.into()],
            working_dir: None,
            env: vec![],
            timeout: Some(Duration::from_secs(30)),
            log_path: std::env::temp_dir().join(format!("belay-sweep-{}.log", std::process::id())),
            log_limit: None,
        };
        let out = self
            .exec(container, &spec, &Redactor::default(), &crate::NoopObserver)
            .await?;
        let _ = fs_err::remove_file(&spec.log_path);
        if !out.success() {
            return Err(SandboxError::Docker {
                op: "end a step's processes",
                message: format!("the sweep failed: {}", out.stderr_tail.trim()),
            });
        }
        Ok(out.stdout_tail.trim().parse().unwrap_or(0))
    }
}
