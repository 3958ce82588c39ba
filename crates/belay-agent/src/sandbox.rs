//! [`AgentBox`]: the container an agent works in, for every mode that runs
//! an agent on a work tree (`belay agent run`, `belay plan run`, and the
//! modes after them).
//!
//! The box has the step policy of the pipeline: no capabilities, a read-only
//! root, a scratch `/tmp`, the container's own processes under an idle user.
//! It mounts the whole work tree read-write at [`WORKDIR`] with its git dir
//! read-only (also a git dir a `.git` file names inside the tree) and the
//! repository's config as a credential-free copy; where the tree is no
//! repository, an empty read-only `.git` keeps the agent from making one. A
//! CLI reaches only its model endpoint (through [`belay_sandbox::route`]),
//! the built-in agent's tools no network unless asked.
//!
//! Closing the box removes the container and its network and sweeps the
//! work tree: what the agent wrote is untrusted, so no set-id file stays and
//! planted repositories are named. A sweep that cannot finish is an error
//! (fail closed).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use belay_sandbox::envimage::EnvVolumes;
use belay_sandbox::hostfs::WorkspaceSweep;
use belay_sandbox::route::{Route, SocketRoute};
use belay_sandbox::{ContainerRuntime, ContainerSpec, Mount, Network};

use crate::session::container_mounts;
use crate::{AgentError, AgentSpec, Placement};

/// Where the work tree is in the container.
pub const WORKDIR: &str = belay_sandbox::layout::REPO;

/// What to open a box for.
pub struct BoxSpec<'a> {
    pub rt: Arc<dyn ContainerRuntime>,
    pub image: String,
    /// The run the container belongs to (its labels, its network's name).
    pub run_id: String,
    /// The container's `belay.kind` label (`agent`, `plan-developer`, …).
    pub kind: String,
    /// The work tree's root on the host.
    pub repo: PathBuf,
    /// The work tree's repository, if it is one.
    pub git: Option<&'a belay_vcs::Git>,
    /// A directory of belay's own, outside the work tree, for the files the
    /// box mounts (the sanitized git config, the empty `.git`).
    pub records: PathBuf,
    pub agent: &'a AgentSpec,
    /// The model endpoint a CLI must reach, if it needs one.
    pub model_url: Option<String>,
    /// The built-in agent's tools get the network (CLIs never do: they get
    /// their endpoint only).
    pub network: bool,
    /// Leave the container for the user (not removed, not reaped).
    pub keep: bool,
    pub extras: BoxExtras,
}

/// What a mode adds to the default box.
#[derive(Debug, Clone, Default)]
pub struct BoxExtras {
    /// Mount the git dir read-write, so that the agent can commit (the round
    /// supervisor; hooks still never run on the host, and the config stays
    /// belay's credential-free copy).
    pub git_writable: bool,
    /// More mounts: a CLI's own login directory (`~/.claude` at
    /// `/tmp/.claude`).
    pub mounts: Vec<Mount>,
    /// A file belay holds a lock on for as long as it lives: the container
    /// ends when belay does (see [`belay_sandbox::ContainerSpec::lifeline`]).
    pub lifeline: Option<PathBuf>,
    /// The built-in agent's tools get the network (`belay agent run
    /// --network`; CLIs never do).
    pub network: bool,
    /// Keep the container after the call (`belay agent run --keep-container`).
    pub keep: bool,
    /// The image's environment directories over the work tree (an env
    /// build's image as the sandbox), and whether they are read-only (a
    /// gate's set, which no agent mounts writable).
    pub env: EnvVolumes,
    pub env_read_only: bool,
}

/// How long a socket route's relay may take to listen in a new container.
const RELAY_START: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether CLIs reach their model through a socket route (`BELAY_SOCKET_ROUTE=0`:
/// always a network route).
fn socket_routes() -> bool {
    std::env::var_os("BELAY_SOCKET_ROUTE").is_none_or(|v| v != "0")
}

/// A box's way to its model.
enum BoxRoute {
    None,
    /// An internal network with its forwarder or proxy.
    Net(Route),
    /// No network: a socket and the relay in the container.
    Socket(SocketRoute),
}

impl BoxRoute {
    fn url(&self) -> Option<&str> {
        match self {
            BoxRoute::None => None,
            BoxRoute::Net(r) => Some(&r.url),
            BoxRoute::Socket(r) => Some(&r.url),
        }
    }

    fn env(&self) -> &[(String, String)] {
        match self {
            BoxRoute::None => &[],
            BoxRoute::Net(r) => &r.env,
            BoxRoute::Socket(r) => &r.env,
        }
    }

    async fn close(self, rt: &dyn ContainerRuntime) {
        match self {
            BoxRoute::None | BoxRoute::Socket(_) => {}
            BoxRoute::Net(r) => r.close(rt).await,
        }
    }
}

/// One open container for an agent.
pub struct AgentBox {
    rt: Arc<dyn ContainerRuntime>,
    id: String,
    route: BoxRoute,
    repo: PathBuf,
    keep: bool,
    /// The empty mount points the engine makes in the work tree for the
    /// environment volumes, removed with the container.
    mount_points: Vec<PathBuf>,
}

impl AgentBox {
    /// Create and start the container. A CLI's way to its model is a
    /// socket route (no network in the container at all) where belay's
    /// relay runs in the image, and a network route otherwise.
    pub async fn open(s: BoxSpec<'_>) -> Result<AgentBox, AgentError> {
        if !s.rt.image_exists(&s.image).await? {
            return Err(AgentError::Config(format!(
                "image {} is not on this Docker engine: run `belay image bootstrap`, or pass --image (an image from `belay env build` works)",
                s.image
            )));
        }
        let url = s.model_url.clone().filter(|_| !s.agent.is_builtin());
        if let (Some(url), true) = (&url, socket_routes()) {
            if let Ok(route) = belay_sandbox::route::model_socket_route(url).await {
                match Self::open_with(&s, BoxRoute::Socket(route)).await? {
                    Ok(b) => return Ok(b),
                    // The relay did not come up in this image: the network.
                    Err(()) => {
                        tracing::debug!(image = %s.image, "the socket route's relay did not start; a network route instead")
                    }
                }
            }
        }
        let route = match url {
            Some(url) => BoxRoute::Net(
                belay_sandbox::route::model_route(
                    s.rt.as_ref(),
                    &format!("belay-{}-{:06x}", s.run_id, fastrand::u32(..0xff_ffff)),
                    &url,
                )
                .await?,
            ),
            None => BoxRoute::None,
        };
        Self::open_with(&s, route)
            .await?
            .map_err(|()| AgentError::Io("the agent's container did not start".into()))
    }

    /// The container on `route`; `Err(())` when a socket route's relay did
    /// not come up (the container and route are gone then).
    async fn open_with(
        s: &BoxSpec<'_>,
        route: BoxRoute,
    ) -> Result<Result<AgentBox, ()>, AgentError> {
        let mut mounts = vec![Mount {
            host: s.repo.clone(),
            container: WORKDIR.into(),
            read_only: false,
        }];
        // Each kind of box its own files: two boxes may open at once (the
        // plan's reviewer opens while the developer's does).
        let records = s.records.join(&s.kind);
        mounts.extend(git_mounts(s.git, &s.repo, &records, s.extras.git_writable).await?);
        mounts.extend(container_mounts(s.agent)?);
        mounts.extend(s.extras.mounts.iter().cloned());
        mounts.extend(s.extras.env.mounts(WORKDIR, s.extras.env_read_only));
        let mut env = vec![("HOME".to_string(), "/tmp".to_string())];
        env.extend(s.extras.env.env(WORKDIR));
        env.extend(quiet_cli_env());
        env.extend(route.env().iter().cloned());
        let mut spec = ContainerSpec {
            image: s.image.clone(),
            run_id: s.run_id.clone(),
            kind: s.kind.clone(),
            network: if s.network && s.agent.is_builtin() {
                Network::Bridge
            } else {
                Network::None
            },
            refuse_dns: !matches!(route, BoxRoute::None),
            working_dir: Some(WORKDIR.into()),
            mounts,
            env,
            unowned: s.keep,
            read_only_rootfs: true,
            drop_capabilities: true,
            tmpfs: vec!["/tmp".into()],
            idle_user: Some("65534:65534".into()),
            lifeline: s.extras.lifeline.clone(),
            ..Default::default()
        };
        match &route {
            BoxRoute::Net(r) => spec.network_name = Some(r.network.clone()),
            BoxRoute::Socket(r) => {
                spec.mounts.extend(r.mounts());
                let lifeline = spec.lifeline.as_ref().map(|_| belay_sandbox::LIFELINE);
                spec.cmd = Some(r.relay_cmd(lifeline));
            }
            BoxRoute::None => {}
        }
        let mount_points = s.extras.env.missing_mount_points(&s.repo);
        let id = match s.rt.create(&spec).await {
            Ok(id) => id,
            Err(e) => {
                route.close(s.rt.as_ref()).await;
                belay_sandbox::envimage::remove_mount_points(&mount_points);
                return Err(e.into());
            }
        };
        if matches!(route, BoxRoute::Socket(_)) {
            let port = belay_sandbox::route::SOCKET_RELAY_PORT;
            if !s.rt.wait_listening(&id, port, RELAY_START).await {
                let _ = s.rt.remove(&id).await;
                route.close(s.rt.as_ref()).await;
                belay_sandbox::envimage::remove_mount_points(&mount_points);
                return Ok(Err(()));
            }
        }
        Ok(Ok(AgentBox {
            rt: s.rt.clone(),
            id,
            route,
            repo: s.repo.clone(),
            keep: s.keep,
            mount_points,
        }))
    }

    /// The container's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether belay ends this box's processes from the host (see
    /// [`ContainerRuntime::sweeps_from_host`]): only then is it kept warm or
    /// retired rather than removed.
    pub fn sweeps_from_host(&self) -> bool {
        self.rt.sweeps_from_host(&self.id)
    }

    /// The model endpoint as the container reaches it.
    pub fn endpoint_url(&self) -> Option<&str> {
        self.route.url()
    }

    /// Where an [`crate::AgentSession`] runs in this box. Its processes are
    /// ended by the box's owner after the call ([`AgentBox::recycle`] for a
    /// box kept warm for the role's next call, [`AgentBox::close`]); only a
    /// box left for the user (`keep`) has the session clean up after itself.
    pub fn placement(&self) -> Placement {
        Placement::Container {
            rt: self.rt.clone(),
            id: self.id.clone(),
            workdir: WORKDIR.into(),
            env: self.route.env().to_vec(),
            host_root: Some(self.repo.clone()),
            host_dirs: vec![],
            // A container left for the user gets the session's cleanup. The
            // others are removed after the call, or kept warm only where
            // belay ends their processes from the host.
            ended_by_owner: !self.keep,
        }
    }

    /// Ready the container for the same role's next call instead of
    /// removing it: every process but its init and idle main process killed
    /// (by recorded identity), and the work tree swept as after any call.
    /// The root is read-only; what the call left in `/tmp` is the same
    /// role's, for its next call.
    pub async fn recycle(&self) -> Result<WorkspaceSweep, AgentError> {
        self.rt.end_call(&self.id).await?;
        sweep(&self.repo).await
    }

    /// Close the box with the container's removal in the background: its
    /// processes ended now (by recorded identity, as [`AgentBox::recycle`]
    /// does) and the work tree swept, so that nothing of the call can write
    /// the tree once this returns; the container, its mount points and its
    /// route go in the returned task (returned also when the sweep failed).
    /// A box left for the user, or one whose processes belay cannot sweep
    /// from the host (a remote engine) or end (its container gone), is
    /// closed at once.
    pub async fn retire(
        self,
    ) -> (
        Result<WorkspaceSweep, AgentError>,
        Option<tokio::task::JoinHandle<()>>,
    ) {
        // Only a sweep from the host is sure to leave nothing running.
        if self.keep || !self.sweeps_from_host() || self.rt.end_call(&self.id).await.is_err() {
            return (self.close().await, None);
        }
        let swept = sweep(&self.repo).await;
        let AgentBox {
            rt,
            id,
            route,
            mount_points,
            ..
        } = self;
        let removal = tokio::spawn(async move {
            let _ = rt.remove(&id).await;
            belay_sandbox::envimage::remove_mount_points(&mount_points);
            route.close(rt.as_ref()).await;
        });
        (swept, Some(removal))
    }

    /// Remove the container (unless kept) and its network, then sweep the
    /// work tree.
    pub async fn close(self) -> Result<WorkspaceSweep, AgentError> {
        if !self.keep {
            let _ = self.rt.remove(&self.id).await;
            belay_sandbox::envimage::remove_mount_points(&self.mount_points);
        }
        self.route.close(self.rt.as_ref()).await;
        sweep(&self.repo).await
    }
}

/// The work tree swept after an agent (`hostfs::sweep_workspace`: set-id
/// bits cleared, planted repositories named); one that cannot finish is an
/// error (fail closed).
async fn sweep(repo: &Path) -> Result<WorkspaceSweep, AgentError> {
    let root = repo.to_path_buf();
    tokio::task::spawn_blocking(move || belay_sandbox::hostfs::sweep_workspace(&root))
        .await
        .map_err(|e| AgentError::Io(format!("the workspace sweep stopped: {e}")))?
        .map_err(|e| {
            AgentError::Io(format!(
                "cannot check the workspace for set-id files after the agent: {e}; remove that path and check {} by hand",
                repo.display()
            ))
        })
}

/// What every agent container gets so that a CLI calls only its model: its
/// telemetry, feature-flag, update and error-report calls switched off.
/// Those hosts are unreachable from belay's sandbox, and a CLI waits for each
/// lookup to time out (Claude Code about 10 s a call, codex 5 s); off, a call
/// costs in a container what it costs on the host. codex has no variable for
/// it: its flags are [`crate::cli::CODEX_QUIET_ARGS`].
pub fn quiet_cli_env() -> Vec<(String, String)> {
    [
        // Claude Code: telemetry, GrowthBook, the auto-updater, error
        // reporting and the feedback survey, all at once.
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        // gemini: its usage statistics.
        ("GEMINI_TELEMETRY_ENABLED", "false"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// What keeps the agent from git: the repository's git dir read-only (also
/// where `.git` is a file naming a git dir inside the tree), its config seen
/// as a copy without credentials, and, in a directory that is no repository,
/// an empty read-only `.git` so that the agent cannot make one.
async fn git_mounts(
    git: Option<&belay_vcs::Git>,
    repo: &Path,
    records: &Path,
    writable: bool,
) -> Result<Vec<Mount>, AgentError> {
    let in_container = |host: &Path| -> Option<String> {
        host.strip_prefix(repo)
            .ok()
            .map(|rel| format!("{WORKDIR}/{}", rel.display()))
    };
    let mut mounts = Vec::new();
    fs_err::create_dir_all(records)
        .map_err(|e| AgentError::Io(format!("cannot create {}: {e}", records.display())))?;
    let Some(git) = git else {
        let empty = records.join("no-git");
        fs_err::create_dir_all(&empty)
            .map_err(|e| AgentError::Io(format!("cannot create {}: {e}", empty.display())))?;
        mounts.push(Mount {
            host: empty,
            container: format!("{WORKDIR}/.git"),
            read_only: true,
        });
        return Ok(mounts);
    };
    let dot_git = repo.join(".git");
    mounts.push(Mount {
        host: dot_git.clone(),
        container: format!("{WORKDIR}/.git"),
        read_only: !writable,
    });
    let git_dir = git.git_dir().to_path_buf();
    if git_dir != dot_git {
        if let Some(c) = in_container(&git_dir) {
            mounts.push(Mount {
                host: git_dir.clone(),
                container: c,
                read_only: !writable,
            });
        }
    }
    if git_dir.join("config").is_file() {
        if let Some(c) = in_container(&git_dir.join("config")) {
            let view = records.join("git-config.sandbox");
            git.write_sanitized_config(&view).await?;
            mounts.push(Mount {
                host: view,
                container: c,
                read_only: true,
            });
        }
    }
    Ok(mounts)
}
