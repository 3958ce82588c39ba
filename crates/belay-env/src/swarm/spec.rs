//! The work of a distributed batch, on a directory every task mounts: the
//! spec (one item per project), a claim file per item being built, and a
//! result file per item finished.
//!
//! - A worker claims an item by creating `claims/<i>.0.json` (`O_EXCL`), with
//!   its holder (the task container's host name, which is its id).
//! - A claim whose holder is gone (its container is not running on this
//!   engine, or its lease, the claim file's mtime, which a working holder
//!   renews, has expired), and whose item has no result, may be taken over.
//!   Claims have generations (`claims/<i>.<g>.json`): the taker of generation
//!   `g` creates `g + 1` with `O_EXCL`, so exactly one taker wins, and one
//!   that read an older generation loses.
//! - A result is written once: it is linked into place, which fails when a
//!   result is there already.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ablation::Ablation;
use crate::batch::ProjectResult;
use crate::build::{BaseSpec, BuildOptions};
use crate::EnvError;

/// The build options a task needs, without secrets or a model client.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PortableOptions {
    pub repo: PathBuf,
    pub state_dir: PathBuf,
    pub run_id: String,
    pub image_prefix: String,
    pub registry: String,
    /// `None`: the default base (per suite); else an image.
    pub base_image: Option<String>,
    pub base_dockerfile: Option<PathBuf>,
    pub command_timeout_s: u64,
    pub docker_build_timeout_s: u64,
    pub oracle_file: Option<PathBuf>,
    pub oracle_timeout_s: u64,
    pub oracle_collect_only: bool,
    pub network: belay_sandbox::Network,
    pub host_trust: bool,
    pub ablation: String,
    pub max_repair_attempts: u32,
    pub max_probe_failures: u32,
    pub cache: bool,
    pub package_cache: bool,
    pub force_clean_replay: bool,
    /// `source`, `latest` or an RFC 3339 time (`--resolve-as-of`).
    #[serde(default = "source")]
    pub resolve_as_of: String,
}

fn source() -> String {
    "source".into()
}

impl PortableOptions {
    pub fn from_build(b: &BuildOptions) -> Result<Self, EnvError> {
        let registry = b.registry.clone().ok_or_else(|| {
            EnvError::Usage("a distributed batch needs --registry: its tasks share checkpoints and the cache through it".into())
        })?;
        let (base_image, base_dockerfile) = match &b.base {
            BaseSpec::Default => (None, None),
            BaseSpec::Image(i) => (Some(i.clone()), None),
            BaseSpec::Dockerfile(d) => (None, Some(d.clone())),
        };
        Ok(Self {
            repo: b.repo.clone(),
            state_dir: b.state_dir.clone().unwrap_or_else(|| b.repo.join(".belay")),
            run_id: b.run_id.clone().unwrap_or_default(),
            image_prefix: b.image_prefix.clone(),
            registry,
            base_image,
            base_dockerfile,
            command_timeout_s: b.command_timeout.as_secs(),
            docker_build_timeout_s: b.docker_build_timeout.as_secs(),
            oracle_file: b.oracle_file.clone(),
            oracle_timeout_s: b.oracle_timeout.as_secs(),
            oracle_collect_only: b.oracle_collect_only,
            network: b.network,
            host_trust: b.host_trust,
            ablation: b.ablation.as_str().to_string(),
            max_repair_attempts: b.max_repair_attempts,
            max_probe_failures: b.max_probe_failures,
            cache: b.cache,
            package_cache: b.package_cache,
            force_clean_replay: b.force_clean_replay,
            resolve_as_of: b.resolve_as_of.as_arg(),
        })
    }

    pub fn to_build(&self) -> Result<BuildOptions, EnvError> {
        let mut b = BuildOptions::new(&self.repo);
        b.state_dir = Some(self.state_dir.clone());
        b.run_id = Some(self.run_id.clone());
        b.image_prefix = self.image_prefix.clone();
        b.registry = Some(self.registry.clone());
        // The submitter reads the result in the registry: a fully cached
        // project moves no layer onto the node.
        b.pull_final = false;
        b.base = match (&self.base_image, &self.base_dockerfile) {
            (Some(i), _) => BaseSpec::Image(i.clone()),
            (None, Some(d)) => BaseSpec::Dockerfile(d.clone()),
            (None, None) => BaseSpec::Default,
        };
        b.command_timeout = Duration::from_secs(self.command_timeout_s);
        b.docker_build_timeout = Duration::from_secs(self.docker_build_timeout_s);
        b.oracle_file = self.oracle_file.clone();
        b.oracle_timeout = Duration::from_secs(self.oracle_timeout_s);
        b.oracle_collect_only = self.oracle_collect_only;
        b.network = self.network;
        b.host_trust = self.host_trust;
        b.ablation = self
            .ablation
            .parse::<Ablation>()
            .map_err(|e| EnvError::Usage(format!("the work spec's ablation mode: {e}")))?;
        b.max_repair_attempts = self.max_repair_attempts;
        b.max_probe_failures = self.max_probe_failures;
        b.cache = self.cache;
        b.package_cache = self.package_cache;
        b.force_clean_replay = self.force_clean_replay;
        b.resolve_as_of = crate::as_of::AsOfChoice::parse(&self.resolve_as_of)?;
        Ok(b)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkItem {
    pub index: usize,
    /// The result as it stands before the build (name, source, run id, …).
    pub result: ProjectResult,
    pub options: PortableOptions,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkSpec {
    pub batch: String,
    pub items: Vec<WorkItem>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Claim {
    pub holder: String,
    pub at: String,
    /// The claims this item had before (a resumed item lists its earlier holders).
    #[serde(default)]
    pub earlier: Vec<String>,
}

/// The directory of one batch's work.
#[derive(Debug, Clone)]
pub struct WorkDir {
    pub root: PathBuf,
}

impl WorkDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn spec(&self) -> PathBuf {
        self.root.join("spec.json")
    }
    /// Generation `g` of item `i`'s claim.
    fn claim_file(&self, i: usize, g: u32) -> PathBuf {
        self.root.join("claims").join(format!("{i}.{g}.json"))
    }

    /// The newest claim of item `i`: its generation, and its content
    /// (`None`: torn by a crash between its creation and its write).
    pub fn current_claim(&self, i: usize) -> Option<(u32, Option<Claim>)> {
        let prefix = format!("{i}.");
        // host-owned: the batch's work dir, written only by belay and its worker tasks.
        let g = fs_err::read_dir(self.root.join("claims"))
            .ok()?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix(&prefix)?
                    .strip_suffix(".json")?
                    .parse::<u32>()
                    .ok()
            })
            .max()?;
        // host-owned: a claim belay or one of its worker tasks wrote.
        let claim = fs_err::read_to_string(self.claim_file(i, g))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        Some((g, claim))
    }

    pub fn has_claim(&self, i: usize) -> bool {
        self.current_claim(i).is_some()
    }

    pub fn result(&self, i: usize) -> PathBuf {
        self.root.join("results").join(format!("{i}.json"))
    }

    pub fn create(&self, spec: &WorkSpec) -> Result<(), EnvError> {
        for d in ["claims", "results"] {
            let p = self.root.join(d);
            fs_err::create_dir_all(&p).map_err(|e| EnvError::io("cannot create", &p, e))?;
        }
        belay_record::write_json_atomic(&self.spec(), spec)?;
        Ok(())
    }

    pub fn read_spec(path: &Path) -> Result<WorkSpec, EnvError> {
        // host-owned: the spec belay wrote for its worker tasks.
        let text =
            fs_err::read_to_string(path).map_err(|e| EnvError::io("cannot read", path, e))?;
        serde_json::from_str(&text).map_err(|e| EnvError::BadManifest {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })
    }

    pub fn read_claim(&self, i: usize) -> Option<Claim> {
        self.current_claim(i).and_then(|(_, c)| c)
    }

    pub fn read_result(&self, i: usize) -> Option<ProjectResult> {
        // host-owned: a result one of belay's worker tasks wrote.
        let t = fs_err::read_to_string(self.result(i)).ok()?;
        serde_json::from_str(&t).ok()
    }

    /// Claim item `i` if nobody has. `Ok(false)`: it is claimed.
    pub fn try_claim(&self, i: usize, holder: &str) -> Result<bool, EnvError> {
        self.create_claim(
            i,
            0,
            &Claim {
                holder: holder.to_string(),
                at: belay_record::now_rfc3339(),
                earlier: Vec::new(),
            },
        )
    }

    fn create_claim(&self, i: usize, g: u32, claim: &Claim) -> Result<bool, EnvError> {
        let path = self.claim_file(i, g);
        let body = serde_json::to_vec(claim).map_err(|e| EnvError::Usage(e.to_string()))?;
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(&body)
                    .and_then(|_| f.sync_all())
                    .map_err(|e| EnvError::io("cannot write", &path, e))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(EnvError::io("cannot create", &path, e)),
        }
    }

    /// Take over item `i` from the holder of its claim generation `g`, who
    /// is gone: claim generation `g + 1`, which only one worker can create.
    /// `Ok(false)`: another worker took it first, or it has a result by now.
    pub fn take_over(&self, i: usize, holder: &str, g: u32, old: &Claim) -> Result<bool, EnvError> {
        let mut earlier = old.earlier.clone();
        earlier.push(old.holder.clone());
        let claim = Claim {
            holder: holder.to_string(),
            at: belay_record::now_rfc3339(),
            earlier,
        };
        if !self.create_claim(i, g + 1, &claim)? {
            return Ok(false);
        }
        // The old holder may have finished between the check and the claim.
        Ok(!self.result(i).exists())
    }

    /// Whether the lease of item `i`'s newest claim has run out: its file
    /// was not renewed for `ttl`.
    pub fn lease_expired(&self, i: usize, ttl: Duration) -> bool {
        let Some((g, _)) = self.current_claim(i) else {
            return false;
        };
        fs_err::metadata(self.claim_file(i, g))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > ttl)
    }

    /// Renew the lease of claim generation `g` of item `i`.
    pub fn renew(&self, i: usize, g: u32) {
        if let Ok(f) = std::fs::OpenOptions::new()
            .write(true)
            .open(self.claim_file(i, g))
        {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
    }

    /// Write item `i`'s result, once: `Ok(false)` when it has one already.
    pub fn write_result(&self, i: usize, r: &ProjectResult) -> Result<bool, EnvError> {
        let path = self.result(i);
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        belay_record::write_json_atomic(&tmp, r)?;
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(EnvError::io("cannot write", &path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_claim_per_item_and_a_take_over_is_recorded() {
        let d = tempfile::tempdir().unwrap();
        let w = WorkDir::new(d.path());
        w.create(&WorkSpec {
            batch: "b".into(),
            items: vec![],
        })
        .unwrap();
        assert!(w.try_claim(0, "task-a").unwrap());
        assert!(
            !w.try_claim(0, "task-b").unwrap(),
            "a claimed item is not claimed twice"
        );
        let old = w.read_claim(0).unwrap();
        assert_eq!(old.holder, "task-a");
        assert!(w.take_over(0, "task-b", 0, &old).unwrap());
        // A second taker that read the same old claim loses.
        assert!(!w.take_over(0, "task-c", 0, &old).unwrap());
        assert_eq!(w.current_claim(0).unwrap().0, 1);
        let now = w.read_claim(0).unwrap();
        assert_eq!(now.holder, "task-b");
        assert_eq!(now.earlier, ["task-a"]);
        assert!(w.read_result(0).is_none());
        assert!(!w.lease_expired(0, Duration::from_secs(60)));
        // A result is written once.
        let r: ProjectResult = serde_json::from_value(serde_json::json!({
            "name": "x", "line": 1, "source": "./x", "reference": null, "status": "ok",
            "stage": null, "checkout_dir": "/p/x", "run_id": "b-x", "image_prefix": "belay-x",
            "duration_s": 1.0, "repairs": 0, "cache_hits": 0, "cache_misses": 0, "blocks": 1,
            "final_image": null, "manifest": null, "error": null
        }))
        .unwrap();
        assert!(w.write_result(0, &r).unwrap());
        let mut other = r.clone();
        other.status = "failed".into();
        assert!(!w.write_result(0, &other).unwrap());
        assert_eq!(w.read_result(0).unwrap().status, "ok");
        // A taker after the result changes nothing.
        let now = w.read_claim(0).unwrap();
        assert!(!w.take_over(0, "task-d", 1, &now).unwrap());
    }

    #[test]
    fn options_survive_the_spec() {
        let mut b = BuildOptions::new("/p/x");
        b.use_registry("127.0.0.1:5000").unwrap();
        b.state_dir = Some("/p/.belay-state".into());
        b.run_id = Some("batch-x".into());
        b.base = BaseSpec::Image("belay-base:trixie".into());
        b.max_repair_attempts = 4;
        b.cache = false;
        let p = PortableOptions::from_build(&b).unwrap();
        let back: PortableOptions =
            serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        let b2 = back.to_build().unwrap();
        assert_eq!(b2.image_prefix, "127.0.0.1:5000/belay");
        assert_eq!(b2.registry.as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(b2.max_repair_attempts, 4);
        assert!(!b2.cache);
        assert!(matches!(b2.base, BaseSpec::Image(ref i) if i == "belay-base:trixie"));
        // Without a registry there is nothing for the tasks to share.
        assert!(PortableOptions::from_build(&BuildOptions::new("/p/x")).is_err());
    }
}
