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
//! Yarn's Plug'n'Play is a file, not a directory: `.pnp.cjs` (and the
//! files beside it) at the project's root, naming archives the env build
//! keeps outside the project. A probe copies those files ([`ENV_FILES`]) out
//! of the image into belay's cache by image id, and every set mounts
//! them read-only at the same paths.
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

/// The environment files looked for under the workspace path: yarn's
/// Plug'n'Play map (`.pnp.js` is yarn 2's name), its ESM loader, and its
/// data where the map does not inline it (`pnpEnableInlining: false`).
pub const ENV_FILES: [&str; 4] = [".pnp.cjs", ".pnp.js", ".pnp.loader.mjs", ".pnp.data.json"];

/// The largest environment file a probe copies out of an image.
const ENV_FILE_MAX: u64 = 64 * 1024 * 1024;

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
    /// Which of [`ENV_FILES`] the image has (regular files, not links).
    pub files: Vec<String>,
    /// Where the probe put its copies of `files` on the host (belay's cache,
    /// by image id); none when nothing was copied.
    pub files_dir: Option<PathBuf>,
    /// Which of [`TOOLS`] the image has on its `PATH`.
    pub tools: Vec<String>,
    /// The image's own `PATH` (its config's, else the engine's default).
    pub path: Option<String>,
}

/// The programs a probe looks for: what modes need in their image (round
/// agents commit with git) and what a gate command usually starts with.
pub const TOOLS: [&str; 14] = [
    "git", "python3", "python", "node", "npm", "yarn", "pnpm", "make", "cargo", "go", "java",
    "mvn", "ruby", "sh",
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
/// links), which of [`ENV_FILES`] (regular files, copied out into `cache`),
/// which of [`TOOLS`] and its `PATH`, found in one short container without
/// network. An image's id pins its files, so a probe that finished is cached
/// in `cache` by id (and by what was asked).
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
        "echo \"path:$PATH\"; for t in {}; do command -v \"$t\" >/dev/null 2>&1 && echo \"tool:$t\"; done; cd {workdir} 2>/dev/null || exit 0; for d in {}; do [ -d \"$d\" ] && [ ! -L \"$d\" ] && echo \"$d\"; done; for f in {}; do [ -f \"$f\" ] && [ ! -L \"$f\" ] && echo \"file:$f\"; done; true",
        TOOLS.join(" "),
        ENV_DIRS.join(" "),
        ENV_FILES.join(" ")
    );
    // (A file name only from a real content digest; the question is part of
    // the key, so a belay that asks more does not read an older answer.)
    let real_digest = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
    let cache = cache.filter(|_| real_digest);
    let cached = cache.map(|dir| {
        use sha2::Digest;
        let q = hex::encode(&sha2::Sha256::digest(script.as_bytes())[..6]);
        dir.join(format!("{digest}-{q}"))
    });
    // The copies of the image's environment files, by its id. (Absolute:
    // a relative bind source would be read as a volume's name.)
    let files_dir = cache
        .and_then(|dir| std::path::absolute(dir).ok())
        .map(|dir| dir.join(format!("{digest}-files")));
    // host-owned: belay's own cache directory, outside every work tree.
    if let Some(text) = cached.as_ref().and_then(|p| fs_err::read_to_string(p).ok()) {
        let mut found = parse(image, &id, &text);
        // (Files removed from the cache since are copied again.)
        if let Some(dir) = files_dir.as_ref().filter(|_| !found.files.is_empty()) {
            if copies_present(dir, &found.files) {
                found.files_dir = Some(dir.clone());
                return Ok(found);
            }
        } else {
            return Ok(found);
        }
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
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            let _ = rt.remove(&container).await;
            let _ = fs_err::remove_file(&log);
            return Err(e);
        }
    };
    let mut found = parse(image, &id, &out.stdout_tail);
    let copied = copy_env_files(rt, &container, workdir, &mut found, files_dir).await;
    let _ = rt.remove(&container).await;
    let _ = fs_err::remove_file(&log);
    copied?;
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

/// Copy the environment files the probe found out of its container into
/// `dir` (each written atomically; belay only mounts them, never reads them).
/// Without a cache to hold them, they are not carried.
async fn copy_env_files(
    rt: &dyn ContainerRuntime,
    container: &str,
    workdir: &str,
    found: &mut EnvDirs,
    dir: Option<PathBuf>,
) -> Result<(), SandboxError> {
    let Some(dir) = dir.filter(|_| !found.files.is_empty()) else {
        found.files.clear();
        return Ok(());
    };
    std::fs::create_dir_all(&dir).map_err(|e| SandboxError::io("create", &dir, e))?;
    // A bind mount follows links on the host: the copies must be belay's
    // own files in a real directory, never a link someone put there.
    if !fs_err::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Err(SandboxError::io(
            "use",
            &dir,
            std::io::Error::other("not a directory (a link?): remove it, and belay makes it again"),
        ));
    }
    let mut kept = Vec::new();
    for f in &found.files {
        let Some(bytes) = rt
            .read_file(container, &format!("{workdir}/{f}"), ENV_FILE_MAX)
            .await?
        else {
            continue;
        };
        belay_record::atomic_write(&dir.join(f), &bytes)
            .map_err(|e| SandboxError::from_record("copy an environment file", e))?;
        kept.push(f.clone());
    }
    found.files = kept;
    found.files_dir = Some(dir);
    Ok(())
}

/// Whether `dir` is a real directory (not a link) that holds each of `files`
/// as a regular file (not a link): copies a bind mount may use.
fn copies_present(dir: &Path, files: &[String]) -> bool {
    fs_err::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
        && files
            .iter()
            .all(|f| fs_err::symlink_metadata(dir.join(f)).is_ok_and(|m| m.is_file()))
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
    let files = ENV_FILES
        .iter()
        .filter(|f| seen.contains(&format!("file:{f}").as_str()))
        .map(|f| f.to_string())
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
        files,
        files_dir: None,
        tools,
        path,
    }
}

/// One run's volumes for one purpose, one per environment directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvVolumes {
    /// `(volume name, directory under the workspace path)`.
    pub volumes: Vec<(String, String)>,
    /// `(host copy, file under the workspace path)`: the image's environment
    /// files, mounted read-only in every set.
    pub files: Vec<(PathBuf, String)>,
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
            files: dirs
                .files_dir
                .iter()
                .flat_map(|host| dirs.files.iter().map(|f| (host.join(f), f.clone())))
                .collect(),
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
        self.volumes.is_empty() && self.files.is_empty()
    }

    /// The directories and files covered, e.g. `.venv`, `.pnp.cjs`.
    pub fn dirs(&self) -> Vec<String> {
        self.volumes
            .iter()
            .map(|(_, d)| d)
            .chain(self.files.iter().map(|(_, f)| f))
            .cloned()
            .collect()
    }

    /// The mounts over the work tree at `workdir` (a volume's source is its
    /// name, which the engine fills from the image the first time; a file's
    /// is belay's copy, read-only in every set: an agent's change to it
    /// would change it for every run of the image).
    pub fn mounts(&self, workdir: &str, read_only: bool) -> Vec<Mount> {
        self.volumes
            .iter()
            .map(|(name, dir)| Mount {
                host: PathBuf::from(name),
                container: format!("{workdir}/{dir}"),
                read_only,
            })
            .chain(self.files.iter().map(|(host, file)| Mount {
                host: host.clone(),
                container: format!("{workdir}/{file}"),
                read_only: true,
            }))
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
        // The image's own PATH, less its entries in the work tree (an env
        // image names `node_modules/.bin` and `.venv/bin` there): one no
        // volume covers holds whatever an agent put in the work tree, and a
        // gate must not run a program planted there (a `node_modules/.bin/yarn`
        // in a Plug'n'Play project, which has no `node_modules`).
        let base = self
            .base_path
            .clone()
            .unwrap_or_else(|| DEFAULT_PATH.into());
        let inside = format!("{workdir}/");
        let outside: Vec<&str> = base
            .split(':')
            .filter(|d| *d != workdir && !d.starts_with(&inside))
            .collect();
        if !path.is_empty() || outside.len() != base.split(':').count() {
            path.extend(outside.into_iter().map(String::from));
            out.push(("PATH".into(), path.join(":")));
        }
        out
    }

    /// The directories and files the engine will create in the host's work
    /// tree as mount points (those not there yet), for
    /// [`remove_mount_points`].
    pub fn missing_mount_points(&self, root: &Path) -> Vec<PathBuf> {
        self.dirs()
            .iter()
            .map(|d| root.join(d))
            .filter(|p| fs_err::symlink_metadata(p).is_err())
            .collect()
    }

    /// Remove the mount points the engine made for these directories and
    /// files in the work tree at `root`, once no container of the run is
    /// left: each that is an empty directory or an empty file (never a link,
    /// never one with content; an empty `.venv` or `.pnp.cjs` is nobody's
    /// work). Also what a killed run left, which its resume found already
    /// there.
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
/// agent replaced (a link, a file or directory with content) stays: only an
/// empty directory or empty regular file is removed, and removing does not
/// follow a link.
pub fn remove_mount_points(points: &[PathBuf]) {
    for p in points {
        match fs_err::symlink_metadata(p) {
            Ok(m) if m.is_dir() => {
                let _ = std::fs::remove_dir(p);
            }
            Ok(m) if m.is_file() && m.len() == 0 => {
                let _ = std::fs::remove_file(p);
            }
            _ => {}
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
            "path:/opt/tool/bin:/usr/bin\ntool:git\ntool:evil\nnode_modules\n.venv\nevil\ntool:sh\nfile:.pnp.loader.mjs\nfile:../x\nfile:.pnp.cjs\n",
        );
        assert_eq!(d.dirs, vec![".venv", "node_modules"]);
        assert_eq!(d.files, vec![".pnp.cjs", ".pnp.loader.mjs"]);
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
            files: vec![".pnp.cjs".into()],
            files_dir: Some("/state/cache/env-probe/abc-files".into()),
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
        // A file is belay's copy, read-only even in a writable set.
        let m = v.mounts("/workspace/repo", false);
        assert!(!m[0].read_only);
        assert_eq!(
            m[2].host,
            PathBuf::from("/state/cache/env-probe/abc-files/.pnp.cjs")
        );
        assert_eq!(m[2].container, "/workspace/repo/.pnp.cjs");
        assert!(m[2].read_only);
        assert_eq!(v.dirs(), vec![".venv", "node_modules", ".pnp.cjs"]);
        // Files the probe could not copy are not mounted.
        let uncopied = EnvDirs {
            files_dir: None,
            ..d.clone()
        };
        assert!(EnvVolumes::for_run(&uncopied, "r", "gate").files.is_empty());
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
        // The image's work-tree entries go unless a volume covers them.
        let planted = EnvVolumes {
            base_path: Some("/w/node_modules/.bin:/w/.venv/bin:/w:/usr/bin".into()),
            ..Default::default()
        };
        assert_eq!(planted.env("/w"), vec![("PATH".into(), "/usr/bin".into())]);
        let venv = EnvVolumes {
            volumes: vec![("v".into(), ".venv".into())],
            ..planted
        };
        assert_eq!(venv.env("/w")[1].1, "/w/.venv/bin:/usr/bin");
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
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(env.lacking("python3 -m pytest"), None);
    }

    #[test]
    fn only_real_copies_are_mounted() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("d-files");
        let files = vec![".pnp.cjs".to_string()];
        assert!(!copies_present(&dir, &files));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(".pnp.cjs"), "x").unwrap();
        assert!(copies_present(&dir, &files));
        // A link in place of the copy, or of its directory, is not one.
        std::fs::remove_file(dir.join(".pnp.cjs")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join(".pnp.cjs")).unwrap();
        assert!(!copies_present(&dir, &files));
        let linked = t.path().join("l-files");
        std::fs::remove_file(dir.join(".pnp.cjs")).unwrap();
        std::fs::write(dir.join(".pnp.cjs"), "x").unwrap();
        std::os::unix::fs::symlink(&dir, &linked).unwrap();
        assert!(!copies_present(&linked, &files));
    }

    #[test]
    fn mount_points_left_by_the_engine_are_removed_only_when_empty() {
        let t = tempfile::tempdir().unwrap();
        let d = EnvDirs {
            image: "i".into(),
            id: "x".into(),
            dirs: vec![".venv".into(), "node_modules".into()],
            files: vec![".pnp.cjs".into()],
            files_dir: Some(t.path().join("copies")),
            tools: vec![],
            path: None,
        };
        let v = EnvVolumes::for_run(&d, "r", "agent");
        std::fs::create_dir(t.path().join("node_modules")).unwrap();
        let points = v.missing_mount_points(t.path());
        assert_eq!(
            points,
            vec![t.path().join(".venv"), t.path().join(".pnp.cjs")]
        );
        // The engine's empty file goes; one with content stays.
        std::fs::write(t.path().join(".pnp.cjs"), "").unwrap();
        remove_mount_points(&points[1..]);
        assert!(!t.path().join(".pnp.cjs").exists());
        std::fs::write(t.path().join(".pnp.cjs"), "x").unwrap();
        remove_mount_points(&points[1..]);
        assert!(t.path().join(".pnp.cjs").exists());
        std::fs::create_dir(t.path().join(".venv")).unwrap();
        remove_mount_points(&points);
        assert!(!t.path().join(".venv").exists());
        std::fs::create_dir(t.path().join(".venv")).unwrap();
        std::fs::write(t.path().join(".venv/x"), "").unwrap();
        remove_mount_points(&points);
        assert!(t.path().join(".venv/x").exists());
    }
}
