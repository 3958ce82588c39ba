//! The sandbox service: where commands run.
//!
//! [`ContainerRuntime`] is the seam the engines program against; [`DockerRuntime`]
//! implements it over the Docker Engine API (bollard, version-negotiated, so a
//! Docker 20.10 / API 1.41 daemon works). Around it:
//!
//! * [`infra`]: the infra-failure classifier and the sticky error that stops a run
//!   at once when the engine itself is broken;
//! * [`reaper`]: removes containers whose owner process is gone (pid + start time +
//!   boot id, never heuristics);
//! * [`trust`]: the host's CA bundle and proxy settings, inherited into containers;
//! * [`bootstrap`]: an offline Debian base image from the host's apt mirror;
//! * [`logsink`]: streaming exec output to a log file with bounded tails;
//! * [`egress`] and [`route`]: the ways out of a sandbox (the model route, the
//!   egress proxy with its allow list), fenced by [`firewall`];
//! * [`envimage`]: an env build's image as a sandbox (its environment
//!   directories over the work tree's mount);
//! * [`hostfs`] and [`procs`]: host file access that never follows a link a
//!   sandbox planted, and the end of every process a step left.

pub mod bootstrap;
pub mod distribution;
mod docker;
pub mod egress;
pub mod envimage;
mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod firewall;
pub mod hostfs;
pub mod infra;
pub mod labels;
pub mod layout;
pub mod logsink;
pub mod path;
pub mod procs;
pub mod reaper;
pub mod registry;
pub mod route;
mod runtime;
pub mod seccomp;
pub mod swarm;
mod tarstream;
pub mod trust;

pub use docker::{default_memory, DockerRuntime, DEFAULT_PIDS, LIFELINE};
pub use error::SandboxError;
pub use infra::InfraFailure;
pub use logsink::{ExecObserver, NoopObserver, StreamKind};
pub use registry::{ImageRegistry, PushReport};
pub use runtime::{
    BuildRequest, ContainerInfo, ContainerRuntime, ContainerSpec, EngineInfo, ExecOutcome,
    ExecSpec, ImageInfo, Mount, Network, NetworkInfo,
};
pub use tarstream::{DockerIgnore, TarFilter};

/// Split `repo:tag` (the tag is after the last ':' that follows the last '/').
pub fn split_image_ref(image: &str) -> (&str, &str) {
    // `repo@sha256:…` names a manifest by digest: the Engine API takes the
    // digest where a tag goes.
    if let Some((repo, digest)) = image.split_once('@') {
        return (repo, digest);
    }
    let slash = image.rfind('/').map(|i| i + 1).unwrap_or(0);
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], &image[slash + i + 1..]),
        None => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::split_image_ref;

    #[test]
    fn splits_refs() {
        assert_eq!(
            split_image_ref("belay:run-001-x-success"),
            ("belay", "run-001-x-success")
        );
        assert_eq!(
            split_image_ref("localhost:5000/a/b"),
            ("localhost:5000/a/b", "latest")
        );
        assert_eq!(
            split_image_ref("localhost:5000/a/b:t"),
            ("localhost:5000/a/b", "t")
        );
        assert_eq!(split_image_ref("debian"), ("debian", "latest"));
    }
}
