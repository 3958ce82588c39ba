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
                    return Err(PipelineError::MissingSecret(format!(
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
    if let Some(f) = p
        .isolation
        .seccomp_profile
        .as_ref()
        .filter(|f| !f.starts_with(belay_sandbox::seccomp::PREFIX))
    {
        v.extend(rel(&p.dir.join(f)));
    }
    // The peer's tooling directories, when the repository has them.
    for d in ["tools", "aidlc-docs"] {
        if git_root.join(d).is_dir() {
            v.push(d.to_string());
        }
    }
    v.retain(|s| !s.is_empty());
    v
}

/// The `.env*` ban: such files in the workspace root refuse the run.
pub fn env_files(root: &Path) -> Vec<String> {
    // host-owned: the root is the user's work tree (a step cannot replace the mount
    // itself); only its entries' names are read, none is opened or followed.
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

/// The hash of a tooling file (the pipeline file), read as it was loaded.
pub(super) fn hash_file(path: &Path) -> Result<String, PipelineError> {
    let bytes = crate::schema::read_tooling(path).map_err(|e| {
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
/// ban, the secrets. Returns the git handle, the files the worktree has
/// uncommitted (outside `sync_excludes` and the caches), and the resolved
/// secrets.
pub(super) async fn host_checks(
    p: &Pipeline,
    state_dir: &Path,
) -> Result<(Git, Vec<String>, BTreeMap<String, String>), PipelineError> {
    let git = Git::open(&p.dir, &state_dir.join("no-hooks")).await?;
    let root = git.root().to_path_buf();
    if let Ok(sd) = fs_err::canonicalize(state_dir) {
        if sd.starts_with(&root) {
            return Err(PipelineError::NotReady(format!(
                "the state directory {} is inside the workspace {}, where steps could change it: set `state_dir` (or --state-dir) outside",
                sd.display(),
                root.display()
            )));
        }
    }
    self_check(p, &root)?;
    let tooling = tooling_paths(p, &root);
    let refs: Vec<&str> = tooling.iter().map(String::as_str).collect();
    let dirty = git.dirty(&refs).await?;
    if !dirty.is_empty() {
        return Err(PipelineError::NotReady(format!(
            "the pipeline's tooling must be committed before a run; these files differ from HEAD: {}. Commit them (git add + git commit) and rerun",
            dirty.join(", ")
        )));
    }
    let envs = env_files(&root);
    if !envs.is_empty() {
        return Err(PipelineError::NotReady(format!(
            "the workspace holds {}: secrets belong in the host environment and `secrets:` refs, not in files steps can read. Move them out of {} (.env.example, .env.template and .env.sample are allowed)",
            envs.join(", "),
            root.display()
        )));
    }
    let specs = commit_pathspecs(p);
    let refs: Vec<&str> = specs.iter().map(String::as_str).collect();
    let dirty = git.dirty(&refs).await?;
    let secrets = resolve_secrets(p)?;
    Ok((git, dirty, secrets))
}

/// The startup self-check: neither belay nor an agent's program may be
/// inside the workspace, where a step could replace what the host runs next.
fn self_check(p: &Pipeline, root: &Path) -> Result<(), PipelineError> {
    let root = fs_err::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    if let Some(exe) = std::env::current_exe()
        .ok()
        .and_then(|e| fs_err::canonicalize(e).ok())
    {
        if exe.starts_with(&root) {
            return Err(PipelineError::NotReady(format!(
                "belay itself ({}) is inside the workspace {}: a step could replace the program the host runs next. Run a belay installed outside it (e.g. `cargo install --path crates/belay`, or a copy in /usr/local/bin)",
                exe.display(),
                root.display()
            )));
        }
    }
    // The git the host runs (from PATH): a workspace directory on PATH
    // (direnv, `./bin`) would let a step plant it.
    if let Some(git) = belay_sandbox::path::find_program("git") {
        if git.starts_with(&root) {
            return Err(PipelineError::NotReady(format!(
                "the git on PATH ({}) is inside the workspace {}: a step could replace the git the host runs. Take the workspace's directories off PATH",
                git.display(),
                root.display()
            )));
        }
    }
    for def in p.agents.values() {
        let Ok(spec) = agent_spec(def) else { continue };
        for m in belay_agent::session::container_mounts(&spec).unwrap_or_default() {
            let host = fs_err::canonicalize(&m.host).unwrap_or(m.host.clone());
            if host.starts_with(&root) {
                return Err(PipelineError::NotReady(format!(
                    "agent `{}` runs {}, which is inside the workspace {}: a step could rewrite it before the next agent step runs it on the host's behalf. Keep agent programs outside the workspace",
                    def.name,
                    host.display(),
                    root.display()
                )));
            }
        }
    }
    Ok(())
}

/// What a commit never holds besides the tooling and the artifacts: the
/// workspace caches and the sandbox's own venv (agentic-dev-loop's
/// `.venv-sandbox`), as literal paths.
pub(super) fn never_committed(p: &Pipeline) -> Vec<String> {
    let mut v: Vec<String> = p
        .caches
        .iter()
        .filter_map(|c| c.in_workspace().map(String::from))
        .collect();
    v.push(".venv-sandbox".into());
    v
}

/// The pathspecs of "the worktree the commit would take": everything but
/// [`never_committed`] and `sync_excludes`.
pub(super) fn commit_pathspecs(p: &Pipeline) -> Vec<String> {
    let mut v = vec![".".to_string()];
    v.extend(
        never_committed(p)
            .into_iter()
            .map(|e| format!(":(exclude,literal){e}")),
    );
    v.extend(
        p.sync_excludes
            .iter()
            .map(|g| format!(":(exclude,glob){g}")),
    );
    v
}

/// The variable that holds the model key: `llm.api_key_env`, else the dialect's usual one.
/// The pipeline's model client and key, resolved the one way
/// (`belay_model::resolve`): `llm.api_key_env` (or the dialect's default
/// variable, from the environment or `./.env`, the one rule), `llm.base_url`
/// (never the environment's), `llm.model`.
pub(super) fn model_client(p: &Pipeline, path: PathBuf) -> Result<ModelAndKey, PipelineError> {
    use belay_model::resolve::{resolve, ModelWanted};
    let Some(llm) = &p.llm else {
        return Ok((None, None));
    };
    // A variable the file names must be set, with or without `base_url`:
    // the first agent step would fail late otherwise.
    let settings = belay_model::keys::Settings::for_cwd();
    if let Some(var) = &llm.api_key_env {
        if settings.var(var).is_none() {
            return Err(PipelineError::MissingSecret(format!(
                "the pipeline's llm names its key variable {var} (llm.api_key_env), which is not set: export {var}=..., or remove api_key_env for a server that needs no key"
            )));
        }
    }
    let wanted = ModelWanted {
        api: llm.api.unwrap_or(Api::Responses),
        model: Some(&llm.model),
        base_url: llm.base_url.as_deref(),
        key_env: llm.api_key_env.as_deref(),
        base_from_env: false,
        required: true,
    };
    let mut r = resolve(&wanted, &settings)
        .map_err(|e| match e {
            belay_model::ModelError::NoKey { var } => PipelineError::MissingSecret(format!(
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

/// `path` made absolute against the working directory, `.` and `..`
/// resolved by name.
fn lexical_absolute(path: &Path) -> std::io::Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A policy file, at most 1 MiB, a regular file opened non-blocking (a FIFO
/// is refused, never waited on): inside the workspace (where steps write)
/// through no link at any level; outside it, never through a link at its
/// last name (a step can plant a directory link that leads outside, and the
/// profile is read again at every step).
pub(super) fn read_policy(path: &Path, root: &Path) -> Result<String, PolicyError> {
    const MAX: u64 = 1 << 20;
    // Absolute by name only (no link on disk is followed to get there): a
    // step can swap a directory of the workspace for a link, so the path is
    // placed under `root` as named and read from there through no link.
    let abs = lexical_absolute(path).map_err(|source| PolicyError::Absolute {
        path: path.to_path_buf(),
        source,
    })?;
    let canon_root = fs_err::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let bytes = match abs
        .strip_prefix(&canon_root)
        .or_else(|_| abs.strip_prefix(root))
    {
        Ok(rel) => belay_sandbox::hostfs::read(&canon_root, &rel.to_string_lossy(), MAX + 1),
        Err(_) => belay_sandbox::hostfs::read_under(root, &abs, MAX + 1),
    }?
    .ok_or_else(|| PolicyError::Missing {
        path: path.to_path_buf(),
    })?;
    if bytes.len() as u64 > MAX {
        return Err(PolicyError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    String::from_utf8(bytes).map_err(|_| PolicyError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

/// Why a policy file ([`read_policy`]) cannot be used; the caller says which
/// setting names it.
#[derive(Debug, thiserror::Error)]
pub(super) enum PolicyError {
    #[error("{}: {source}", path.display())]
    Absolute {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Read(#[from] belay_sandbox::hostfs::HostFsError),
    #[error("{} does not exist", path.display())]
    Missing { path: PathBuf },
    #[error("{} is larger than 1 MiB", path.display())]
    TooLarge { path: PathBuf },
    #[error("{} is not UTF-8 text", path.display())]
    NotUtf8 { path: PathBuf },
}
