//! An environment image as a sandbox.
//!
//! `belay env build` leaves the project's environment under the workspace
//! path of its image: the venv at `/workspace/repo/.venv`, `node_modules`
//! beside the sources. Every mode mounts its work tree at that same path,
//! which would hide them. So the environment directories the image has there
//! ([`probe`]) are mounted over the work tree as named volumes, which the
//! engine fills from the image on first use: the interpreter, the
//! dependencies and the tools stay at the paths the image has them, and
//! [`EnvVolumes::env`] puts their `bin` directories on `PATH`.
//!
//! A volume set belongs to one run and one purpose (its name says both):
//! agents get a writable set, belay's own gates a set no agent ever mounts
//! writable, so what a gate runs is the image's environment and not one an
//! agent could have changed. A finished run removes its sets.

use std::path::{Path, PathBuf};
use std::time::Duration;

use belay_record::Redactor;

use crate::{
    ContainerRuntime, ContainerSpec, ExecSpec, Mount, Network, NoopObserver, SandboxError,
};

/// The environment directories looked for under the workspace path.
pub const ENV_DIRS: [&str; 5] = [".venv", "venv", "node_modules", ".tox", "target"];

/// What a run's volume sets are for: a pipeline's steps, agents, belay's
/// own gates and checks.
pub const PURPOSES: [&str; 3] = ["step", "agent", "gate"];

/// The engine's default `PATH` (what a container has when its image sets none).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment directories an image has under a workspace path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvDirs {
    pub image: String,
    /// The first 12 characters of the image's id (volumes are named by it:
    /// a volume is filled from the image only once, when it is new).
    pub id: String,
    pub dirs: Vec<String>,
    /// Which of [`TOOLS`] the image has on its `PATH`.
    pub tools: Vec<String>,
    /// The image's own `PATH` (its config's, else the engine's default).
    pub path: Option<String>,
}

/// The programs a probe looks for: what modes need in their image (round
/// agents commit with git) and what a gate command usually starts with.
pub const TOOLS: [&str; 12] = [
    "git", "python3", "python", "node", "npm", "make", "cargo", "go", "java", "mvn", "ruby", "sh",
];

/// The programs `command` starts (the first word of each of its `&&`,
/// `||`, `;`, `|` or line parts, past variable assignments, `exec`, `env`
/// and `time`) that are among [`TOOLS`]: what a probe can judge.
pub fn probed_programs(command: &str) -> impl Iterator<Item = &str> {
    command
        .split(['&', '|', ';', '\n'])
        .filter_map(|part| {
            part.split_whitespace()
                .find(|w| !w.contains('=') && !matches!(*w, "exec" | "env" | "time"))
        })
        .filter(|w| TOOLS.contains(w))
}

/// Which of [`ENV_DIRS`] `image` has under `workdir` (real directories, not
/// links), which of [`TOOLS`] and its `PATH`, found in one short container
/// without network. An image's id pins its files, so a probe that finished
/// is cached in `cache` by id (and by what was asked).
pub async fn probe(
    rt: &dyn ContainerRuntime,
    image: &str,
    run_id: &str,
    workdir: &str,
    cache: Option<&Path>,
    redactor: &Redactor,
) -> Result<EnvDirs, SandboxError> {
    // An image that is not there has nothing to bring: whoever uses it next
    // says how to get it.
    let Some(info) = rt.image(image).await? else {
        return Ok(EnvDirs {
            image: image.into(),
            ..Default::default()
        });
    };
    let digest = info.id.trim_start_matches("sha256:");
    let id: String = digest.chars().take(12).collect();
    let script = format!(
        "echo \"path:$PATH\"; for t in {}; do command -v \"$t\" >/dev/null 2>&1 && echo \"tool:$t\"; done; cd {workdir} 2>/dev/null || exit 0; for d in {}; do [ -d \"$d\" ] && [ ! -L \"$d\" ] && echo \"$d\"; done; true",
        TOOLS.join(" "),
        ENV_DIRS.join(" ")
    );
    // (A file name only from a real content digest; the question is part of
    // the key, so a belay that asks more does not read an older answer.)
    let cached = cache
        .filter(|_| digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|dir| {
            use sha2::Digest;
            let q = hex::encode(&sha2::Sha256::digest(script.as_bytes())[..6]);
            dir.join(format!("{digest}-{q}"))
        });
    // host-owned: belay's own cache directory, outside every work tree.
    if let Some(text) = cached.as_ref().and_then(|p| fs_err::read_to_string(p).ok()) {
        return Ok(parse(image, &id, &text));
    }
    let container = rt
        .create(&ContainerSpec {
            image: image.into(),
            run_id: run_id.into(),
            kind: "env-probe".into(),
            network: Network::None,
            read_only_rootfs: true,
            drop_capabilities: true,
            tmpfs: vec!["/tmp".into()],
            ..Default::default()
        })
        .await?;
    let log = std::env::temp_dir().join(format!("belay-env-probe-{}.log", fastrand::u64(..)));
    let out = rt
        .exec(
            &container,
            &ExecSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), script],
                working_dir: None,
                env: vec![],
                timeout: Some(Duration::from_secs(30)),
                log_path: log.clone(),
                log_limit: None,
            },
            redactor,
            &NoopObserver,
        )
        .await;
    let _ = rt.remove(&container).await;
    let _ = fs_err::remove_file(&log);
    let out = out?;
    let found = parse(image, &id, &out.stdout_tail);
    // Only a probe that finished is remembered (a timed-out one is asked
    // again next time).
    if let Some(p) = cached.filter(|_| out.success()) {
        if let Some(d) = p.parent() {
            let _ = fs_err::create_dir_all(d);
        }
        let _ = belay_record::atomic_write(&p, out.stdout_tail.as_bytes());
    }
    Ok(found)
}

/// Whether `image` is one of belay's checkpoint images (an env build's),
/// the only kind that brings an environment under the workspace path.
pub async fn is_env_image(rt: &dyn ContainerRuntime, image: &str) -> Result<bool, SandboxError> {
    Ok(rt
        .image(image)
        .await?
        .is_some_and(|i| i.labels.get("belay.kind").map(String::as_str) == Some("checkpoint")))
}

/// Where probes are remembered: belay's state directory, by image id.
pub fn probe_cache() -> PathBuf {
    belay_record::state_home().join("cache").join("env-probe")
}

/// What a probe's output says: the known directory names and tools, in
/// [`ENV_DIRS`] and [`TOOLS`] order, and the image's `PATH` (when it is a
/// plain list of absolute directories).
fn parse(image: &str, id: &str, text: &str) -> EnvDirs {
    let seen: Vec<&str> = text.lines().map(str::trim).collect();
    let dirs = ENV_DIRS
        .iter()
        .filter(|d| seen.contains(d))
        .map(|d| d.to_string())
        .collect();
    let tools = TOOLS
        .iter()
        .filter(|t| seen.contains(&format!("tool:{t}").as_str()))
        .map(|t| t.to_string())
        .collect();
    let path = seen
        .iter()
        .find_map(|l| l.strip_prefix("path:"))
        .filter(|p| {
            !p.is_empty()
                && p.split(':')
                    .all(|d| d.starts_with('/') && d.chars().all(|c| !c.is_control() && c != ' '))
        })
        .map(String::from);
    EnvDirs {
        image: image.into(),
        id: id.into(),
        dirs,
        tools,
        path,
    }
}

/// One run's volumes for one purpose, one per environment directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvVolumes {
    /// `(volume name, directory under the workspace path)`.
    pub volumes: Vec<(String, String)>,
    /// The image's own `PATH`, which the environment's directories go before.
    pub base_path: Option<String>,
}

impl EnvVolumes {
    /// The volumes of run `run_id` for `purpose` (`agent`, `gate`, …), from
    /// this image: `belay-<run>-<hash of the run id>-<purpose>-<image id>-<dir>`
    /// (the hash keeps runs whose ids sanitize alike apart).
    pub fn for_run(dirs: &EnvDirs, run_id: &str, purpose: &str) -> EnvVolumes {
        EnvVolumes {
            base_path: dirs.path.clone(),
            volumes: dirs
                .dirs
                .iter()
                .map(|d| {
                    (
                        format!(
                            "{}{purpose}-{}-{}",
                            run_prefix(run_id),
                            sanitize(&dirs.id),
                            sanitize(d.trim_start_matches('.'))
                        ),
                        d.clone(),
                    )
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }

    /// The directories covered, e.g. `.venv`.
    pub fn dirs(&self) -> Vec<String> {
        self.volumes.iter().map(|(_, d)| d.clone()).collect()
    }

    /// The mounts over the work tree at `workdir` (a volume's source is its
    /// name, which the engine fills from the image the first time).
    pub fn mounts(&self, workdir: &str, read_only: bool) -> Vec<Mount> {
        self.volumes
            .iter()
            .map(|(name, dir)| Mount {
                host: PathBuf::from(name),
                container: format!("{workdir}/{dir}"),
                read_only,
            })
            .collect()
    }

    /// `PATH` with the environment's `bin` directories first, and
    /// `VIRTUAL_ENV` for a venv: the project's interpreter is `python3`.
    pub fn env(&self, workdir: &str) -> Vec<(String, String)> {
        let mut path = Vec::new();
        let mut out = Vec::new();
        for (_, d) in &self.volumes {
            match d.as_str() {
                ".venv" | "venv" => {
                    path.push(format!("{workdir}/{d}/bin"));
                    if !out
                        .iter()
                        .any(|(k, _): &(String, String)| k == "VIRTUAL_ENV")
                    {
                        out.push(("VIRTUAL_ENV".to_string(), format!("{workdir}/{d}")));
                    }
                }
                "node_modules" => path.push(format!("{workdir}/node_modules/.bin")),
                _ => {}
            }
        }
        if !path.is_empty() {
            path.push(
                self.base_path
                    .clone()
                    .unwrap_or_else(|| DEFAULT_PATH.into()),
            );
            out.push(("PATH".into(), path.join(":")));
        }
        out
    }

    /// The directories the engine will create in the host's work tree as
    /// mount points (those not there yet), for [`remove_mount_points`].
    pub fn missing_mount_points(&self, root: &Path) -> Vec<PathBuf> {
        self.volumes
            .iter()
            .map(|(_, d)| root.join(d))
            .filter(|p| fs_err::symlink_metadata(p).is_err())
            .collect()
    }

    /// Remove the mount points the engine made for these directories in
    /// the work tree at `root`, once no container of the run is left: each
    /// that is an empty directory (never a link, never one with content; an
    /// empty `.venv` is nobody's work, and git does not keep it). Also what
    /// a killed run left, which its resume found already there.
    pub fn tidy(&self, root: &Path) {
        let points: Vec<PathBuf> = self.dirs().iter().map(|d| root.join(d)).collect();
        remove_mount_points(&points);
    }

    /// Remove the run's volumes.
    pub async fn remove(&self, rt: &dyn ContainerRuntime) {
        for (name, _) in &self.volumes {
            let _ = rt.remove_volume(name).await;
        }
    }
}

/// A run's environment over its work trees: the image's directories as a
/// writable set for agents and a read-only set for belay's gates.
#[derive(Debug, Clone, Default)]
pub struct RunEnv {
    pub image: String,
    pub agent: EnvVolumes,
    pub gate: EnvVolumes,
    /// Which of [`TOOLS`] the image has.
    pub tools: Vec<String>,
    /// Whether the probe found the image (else nothing is known of it).
    pub probed: bool,
}

impl RunEnv {
    /// Probe `image` (cached in belay's state directory) and name the run's
    /// two sets. Only an env build's image (a belay checkpoint) brings an
    /// environment; another is probed only when `tools` are asked for (a
    /// gate to check), so a run on the base image starts no probe.
    pub async fn open(
        rt: &dyn ContainerRuntime,
        image: &str,
        run_id: &str,
        workdir: &str,
        redactor: &Redactor,
        tools: bool,
    ) -> Result<RunEnv, SandboxError> {
        if !tools && !is_env_image(rt, image).await? {
            return Ok(RunEnv {
                image: image.into(),
                ..Default::default()
            });
        }
        let dirs = probe(rt, image, run_id, workdir, Some(&probe_cache()), redactor).await?;
        Ok(RunEnv {
            image: image.into(),
            agent: EnvVolumes::for_run(&dirs, run_id, "agent"),
            gate: EnvVolumes::for_run(&dirs, run_id, "gate"),
            probed: !dirs.id.is_empty(),
            tools: dirs.tools,
        })
    }

    /// The directories the image brings (none: an image without an
    /// environment under the workspace path).
    pub fn dirs(&self) -> Vec<String> {
        self.agent.dirs()
    }

    /// The first program `command` starts (in any of its `&&`, `||`, `;`
    /// or `|` parts) that is one of [`TOOLS`] and that neither the image's
    /// `PATH` nor its environment directories have: a gate that cannot run
    /// there. Programs belay does not probe for are not judged.
    pub fn lacking(&self, command: &str) -> Option<String> {
        if !self.probed {
            return None;
        }
        let venv = self.dirs().iter().any(|d| d == ".venv" || d == "venv");
        let node = self.dirs().iter().any(|d| d == "node_modules");
        probed_programs(command)
            .find(|prog| {
                !self.tools.iter().any(|t| t == prog)
                    && !(venv && (*prog == "python3" || *prog == "python"))
                    && !(node && *prog == "npm" && self.tools.iter().any(|t| t == "node"))
            })
            .map(str::to_string)
    }

    /// [`EnvVolumes::tidy`] for the run's directories.
    pub fn tidy(&self, root: &Path) {
        self.agent.tidy(root);
    }

    /// Remove both sets.
    pub async fn remove(&self, rt: &dyn ContainerRuntime) {
        self.agent.remove(rt).await;
        self.gate.remove(rt).await;
    }
}

/// Remove the empty mount points the engine left in a work tree. A path an
/// agent replaced (a link, a file, a directory with content) stays: only an
/// empty directory is removed, and removing does not follow a link.
pub fn remove_mount_points(points: &[PathBuf]) {
    for p in points {
        if fs_err::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// The start of every volume name of run `run_id`: its id as Docker takes
/// it, and a hash of the exact id.
fn run_prefix(run_id: &str) -> String {
    use sha2::Digest;
    let h = hex::encode(&sha2::Sha256::digest(run_id.as_bytes())[..4]);
    format!("belay-{}-{h}-", sanitize(run_id))
}

/// Remove every environment volume of run `run_id` (`belay runs gc`).
pub async fn remove_run_volumes(rt: &dyn ContainerRuntime, run_id: &str) {
    for purpose in PURPOSES {
        let prefix = format!("{}{purpose}-", run_prefix(run_id));
        for name in rt.volumes_named(&prefix).await.unwrap_or_default() {
            let _ = rt.remove_volume(&name).await;
        }
    }
    // The names pipeline runs used before (one per directory, no purpose).
    for d in ["venv", "node_modules", "target", "tox"] {
        let _ = rt.remove_volume(&format!("belay-{run_id}-{d}")).await;
    }
}

/// A name part Docker accepts.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_dirs_in_order() {
        let d = parse(
            "i",
            "x",
            "path:/opt/tool/bin:/usr/bin\ntool:git\ntool:evil\nnode_modules\n.venv\nevil\ntool:sh\n",
        );
        assert_eq!(d.dirs, vec![".venv", "node_modules"]);
        assert_eq!(d.tools, vec!["git", "sh"]);
        assert_eq!(d.path.as_deref(), Some("/opt/tool/bin:/usr/bin"));
        assert_eq!(parse("i", "x", "path:rel/bin:/x").path, None);
        assert!(parse("i", "x", "").dirs.is_empty());
    }

    #[test]
    fn volumes_mounts_and_path() {
        let d = EnvDirs {
            image: "i".into(),
            id: "0123456789ab".into(),
            dirs: vec![".venv".into(), "node_modules".into()],
            tools: vec![],
            path: None,
        };
        let v = EnvVolumes::for_run(&d, "r/1", "gate");
        let prefix = run_prefix("r/1");
        assert!(prefix.starts_with("belay-r-1-") && prefix.len() == "belay-r-1-".len() + 9);
        assert_eq!(v.volumes[0].0, format!("{prefix}gate-0123456789ab-venv"));
        assert_eq!(
            v.volumes[1].0,
            format!("{prefix}gate-0123456789ab-node_modules")
        );
        // Ids that sanitize alike are kept apart.
        assert_ne!(run_prefix("a.b"), run_prefix("a-b"));
        let m = v.mounts("/workspace/repo", true);
        assert_eq!(m[0].container, "/workspace/repo/.venv");
        assert!(m[0].read_only);
        let env = v.env("/workspace/repo");
        assert_eq!(
            env[0],
            ("VIRTUAL_ENV".into(), "/workspace/repo/.venv".into())
        );
        assert!(env[1].1.starts_with(
            "/workspace/repo/.venv/bin:/workspace/repo/node_modules/.bin:/usr/local/sbin"
        ));
        assert!(EnvVolumes::default().env("/w").is_empty());
        // The image's own PATH stays, after the environment's directories.
        let mut own = v.clone();
        own.base_path = Some("/opt/tool/bin:/usr/bin".into());
        assert!(own.env("/w")[1]
            .1
            .ends_with(":/w/node_modules/.bin:/opt/tool/bin:/usr/bin"));
    }

    #[test]
    fn a_gate_the_image_cannot_run_is_named() {
        let base = RunEnv {
            tools: vec!["sh".into(), "git".into()],
            probed: true,
            ..Default::default()
        };
        assert_eq!(RunEnv::default().lacking("python3 x"), None);
        assert_eq!(
            base.lacking("python3 -m pytest -q").as_deref(),
            Some("python3")
        );
        assert_eq!(base.lacking("CI=1 make test").as_deref(), Some("make"));
        assert_eq!(
            base.lacking("git diff --check && npm test").as_deref(),
            Some("npm")
        );
        assert_eq!(base.lacking("./run-tests.sh"), None);
        assert_eq!(base.lacking("git status"), None);
        let env = RunEnv {
            tools: vec!["sh".into()],
            probed: true,
            agent: EnvVolumes {
                volumes: vec![("v".into(), ".venv".into())],
                base_path: None,
            },
            ..Default::default()
        };
        assert_eq!(env.lacking("python3 -m pytest"), None);
    }

    #[test]
    fn mount_points_left_by_the_engine_are_removed_only_when_empty() {
        let t = tempfile::tempdir().unwrap();
        let d = EnvDirs {
            image: "i".into(),
            id: "x".into(),
            dirs: vec![".venv".into(), "node_modules".into()],
            tools: vec![],
            path: None,
        };
        let v = EnvVolumes::for_run(&d, "r", "agent");
        std::fs::create_dir(t.path().join("node_modules")).unwrap();
        let points = v.missing_mount_points(t.path());
        assert_eq!(points, vec![t.path().join(".venv")]);
        std::fs::create_dir(t.path().join(".venv")).unwrap();
        remove_mount_points(&points);
        assert!(!t.path().join(".venv").exists());
        std::fs::create_dir(t.path().join(".venv")).unwrap();
        std::fs::write(t.path().join(".venv/x"), "").unwrap();
        remove_mount_points(&points);
        assert!(t.path().join(".venv/x").exists());
    }
}
