//! Load-time checks on the host: the state directory, the tooling and `.env` rules,
//! the secrets, the model client, and policy files read without following links.

use super::*;

/// The state directory of a pipeline: `--state-dir`, the file's `state_dir`,
/// or `~/.local/state/belay/pipelines/<name>-<hash>` (outside the workspace, so
/// that no step can touch it).
pub fn state_dir_for(p: &Pipeline, cli: Option<&Path>) -> PathBuf {
    if let Some(d) = cli {
        return d.to_path_buf();
    }
    if let Some(d) = &p.state_dir {
        return p.dir.join(d);
    }
    let canon = fs_err::canonicalize(&p.path).unwrap_or_else(|_| p.path.clone());
    let h = hex::encode(Sha256::digest(canon.to_string_lossy().as_bytes()));
    belay_record::state_home()
        .join("pipelines")
        .join(format!("{}-{}", sanitize(&p.name), &h[..12]))
}

pub(super) fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Resolve the secret refs host-side. Every ref a step lists must resolve; the
/// error names the ref, the step and the variable.
pub fn resolve_secrets(p: &Pipeline) -> Result<BTreeMap<String, String>, PipelineError> {
    let mut out = BTreeMap::new();
    for s in &p.steps {
        for r in &s.secrets {
            if out.contains_key(r) {
                continue;
            }
            let Some(def) = p.secrets.get(r) else {
                return Err(PipelineError::Config(format!(
                    "step `{}` lists secret `{r}`, which is not declared",
                    s.name
                )));
            };
            match std::env::var(&def.key) {
                Ok(v) if !v.is_empty() => {
                    out.insert(r.clone(), v);
                }
                _ => {
                    return Err(PipelineError::Config(format!(
                        "secret `{r}` (used by step `{}`) is missing: set the environment variable {} (provider `{}`)",
                        s.name, def.key, def.from
                    )))
                }
            }
        }
    }
    Ok(out)
}

/// The workspace's tooling, relative to the git root: the pipeline file,
/// `agents_dir` and `additional_files`.
pub fn tooling_paths(p: &Pipeline, git_root: &Path) -> Vec<String> {
    let rel = |x: &Path| -> Option<String> {
        let abs = fs_err::canonicalize(x).unwrap_or_else(|_| x.to_path_buf());
        abs.strip_prefix(git_root)
            .ok()
            .map(|r| r.to_string_lossy().into_owned())
    };
    let mut v = Vec::new();
    v.extend(rel(&p.path));
    if let Some(a) = &p.agents_dir {
        v.extend(rel(&p.dir.join(a)));
    }
    for f in &p.additional_files {
        v.extend(rel(&p.dir.join(f)));
    }
    // Policy files: a step must not be able to swap them, nor get them committed.
    if let Some(f) = &p.isolation.seccomp_profile {
        v.extend(rel(&p.dir.join(f)));
    }
    v.retain(|s| !s.is_empty());
    v
}

/// The `.env*` ban: such files in the workspace root refuse the run.
pub fn env_files(root: &Path) -> Vec<String> {
    let mut hits: Vec<String> = fs_err::read_dir(root)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| n.starts_with(".env") && !ALLOWED_ENV_FILES.contains(&n.as_str()))
                .collect()
        })
        .unwrap_or_default();
    hits.sort();
    hits
}

pub(super) fn hash_file(path: &Path) -> Result<String, PipelineError> {
    let bytes = fs_err::read(path).map_err(|e| {
        PipelineError::Config(format!(
            "cannot read {}: {e}; check the path and its permissions",
            path.display()
        ))
    })?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// A relative path inside the workspace, or an error.
pub(super) fn workspace_path(root: &Path, rel: &str) -> Result<PathBuf, PipelineError> {
    let p = Path::new(rel);
    if p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(PipelineError::Config(format!(
            "`{rel}` must be a path inside the workspace"
        )));
    }
    Ok(root.join(p))
}

/// Load-time checks that need the host: git state of the tooling, the `.env`
/// ban, the secrets. Returns the git handle, whether the worktree was clean,
/// and the resolved secrets.
pub(super) async fn host_checks(
    p: &Pipeline,
    state_dir: &Path,
) -> Result<(Git, bool, BTreeMap<String, String>), PipelineError> {
    let git = Git::open(&p.dir, &state_dir.join("no-hooks")).await?;
    let root = git.root().to_path_buf();
    if let Ok(sd) = fs_err::canonicalize(state_dir) {
        if sd.starts_with(&root) {
            return Err(PipelineError::Config(format!(
                "the state directory {} is inside the workspace {}, where steps could change it: set `state_dir` (or --state-dir) outside",
                sd.display(),
                root.display()
            )));
        }
    }
    let tooling = tooling_paths(p, &root);
    let refs: Vec<&str> = tooling.iter().map(String::as_str).collect();
    let dirty = git.dirty(&refs).await?;
    if !dirty.is_empty() {
        return Err(PipelineError::Config(format!(
            "the pipeline's tooling must be committed before a run; these files differ from HEAD: {}. Commit them (git add + git commit) and rerun",
            dirty.join(", ")
        )));
    }
    let envs = env_files(&root);
    if !envs.is_empty() {
        return Err(PipelineError::Config(format!(
            "the workspace holds {}: secrets belong in the host environment and `secrets:` refs, not in files steps can read. Move them out of {} (.env.example, .env.template and .env.sample are allowed)",
            envs.join(", "),
            root.display()
        )));
    }
    let clean = git.dirty(&[]).await?.is_empty();
    let secrets = resolve_secrets(p)?;
    Ok((git, clean, secrets))
}

/// The variable that holds the model key: `llm.api_key_env`, else the dialect's usual one.
/// The pipeline's model client and key, resolved the one way
/// (`belay_model::resolve`): `llm.api_key_env` (or the dialect's default
/// variable), `llm.base_url` (never the environment's), `llm.model`.
pub(super) fn model_client(p: &Pipeline, path: PathBuf) -> Result<ModelAndKey, PipelineError> {
    use belay_model::resolve::{resolve, ModelWanted};
    let Some(llm) = &p.llm else {
        return Ok((None, None));
    };
    let wanted = ModelWanted {
        api: llm.api.unwrap_or(Api::Responses),
        model: Some(&llm.model),
        base_url: llm.base_url.as_deref(),
        key_env: llm.api_key_env.as_deref(),
        base_from_env: false,
        required: true,
    };
    let mut r = resolve(&wanted, &belay_model::keys::Settings::env_only())
        .map_err(|e| match e {
            belay_model::ModelError::NoKey { var } => PipelineError::Config(format!(
                "the pipeline's llm needs its key: set {var} (named by llm.api_key_env), or give llm.base_url for a server that needs none"
            )),
            e => PipelineError::Config(e.to_string()),
        })?
        .ok_or_else(|| PipelineError::Config("the pipeline's llm block names no model".into()))?;
    r.setup.config.timeout = llm.timeout.map(Duration::from_secs);
    let client = r
        .setup
        .client(Some(path))
        .map_err(|e| PipelineError::Config(e.to_string()))?;
    Ok((
        Some(client),
        r.key.map(|(name, k)| (name, k.expose().to_string())),
    ))
}

/// A policy file: inside the workspace (where steps write) through hostfs (no
/// link, no FIFO, regular file), at most 1 MiB; outside it, plainly.
pub(super) fn read_policy(path: &Path, root: &Path) -> Result<String, String> {
    const MAX: u64 = 1 << 20;
    let abs = fs_err::canonicalize(path.parent().unwrap_or(path))
        .map(|d| d.join(path.file_name().unwrap_or_default()))
        .unwrap_or_else(|_| path.to_path_buf());
    let bytes = match abs.strip_prefix(root) {
        Ok(rel) => belay_sandbox::hostfs::read(root, &rel.to_string_lossy(), MAX + 1)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{} does not exist", path.display()))?,
        Err(_) => {
            let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX + 1), &mut b)
                .map_err(|e| e.to_string())?;
            b
        }
    };
    if bytes.len() as u64 > MAX {
        return Err(format!("{} is larger than 1 MiB", path.display()));
    }
    String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))
}
