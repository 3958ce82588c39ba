//! `jobs.toml`: the queue, the owners, the agent, the repositories a job may
//! write and the front ends. Every table denies unknown keys, and every
//! error names the file with its line and column.
//!
//! Relative paths are relative to the file. Without a file, a queue still
//! works: the owner is `local` (the command line), jobs name their
//! repositories by path, and agents run in containers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::JobsError;

/// The name of the command line's own sender: always an owner.
pub const LOCAL_SENDER: &str = "local";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    queue: Option<PathBuf>,
    #[serde(default)]
    owners: Vec<String>,
    workers: Option<usize>,
    #[serde(default)]
    agent: RawAgent,
    #[serde(default, rename = "repo")]
    repos: Vec<RawRepo>,
    #[serde(default)]
    commit: RawCommit,
    #[serde(default)]
    hooks: RawHooks,
    xmpp: Option<RawXmpp>,
    http: Option<RawHttp>,
    drop: Option<RawDrop>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    spec: Option<String>,
    image: Option<String>,
    placement: Option<String>,
    model_url: Option<String>,
    model_api: Option<String>,
    model_key_env: Option<String>,
    #[serde(default)]
    auto_approve: bool,
    wall_time_s: Option<f64>,
    idle_s: Option<f64>,
    max_cost_usd: Option<f64>,
    #[serde(default)]
    pass_env: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRepo {
    name: Option<String>,
    path: PathBuf,
    branch: Option<String>,
    remote: Option<String>,
    push: Option<bool>,
    #[serde(default)]
    commit_approval: bool,
    #[serde(default)]
    checks: Vec<String>,
    #[serde(default)]
    default: bool,
    #[serde(default)]
    update_checkout: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommit {
    author_name: Option<String>,
    author_email: Option<String>,
    check_timeout_s: Option<f64>,
    lock_wait_s: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHooks {
    #[serde(default)]
    on_commit: Vec<String>,
    on_commit_timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawXmpp {
    jid: String,
    password_env: String,
    server: Option<String>,
    #[serde(default)]
    insecure_plaintext_loopback: bool,
    #[serde(default)]
    allow: Vec<String>,
    batch_window_ms: Option<u64>,
    chunk_chars: Option<usize>,
    chunk_pause_ms: Option<u64>,
    long_answer_chars: Option<usize>,
    dashboard_url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    listen: Option<String>,
    token_env: String,
    name: Option<String>,
    #[serde(default)]
    trusted: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDrop {
    dir: PathBuf,
    poll_ms: Option<u64>,
    #[serde(default)]
    trusted: bool,
}

/// Where agents run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Container,
    /// The opt-out: on the host, in the worktree.
    Host,
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The default spec; a job's `agent`, then its `runtime`, win.
    pub spec: String,
    /// The image agents and checks run in: as the config names it (an image
    /// or an env build's run id) until the binary resolves it
    /// (`belay_env::sandbox_image`).
    pub image: String,
    /// Whether the config named `image` (else the one repository's latest
    /// env build with git may take the default's place).
    pub image_named: bool,
    pub placement: Placement,
    pub model_url: Option<String>,
    pub model_api: belay_model::Api,
    pub model_key_env: Option<String>,
    pub auto_approve: bool,
    pub wall_time: Duration,
    pub idle: Option<Duration>,
    pub max_cost_usd: Option<f64>,
    pub pass_env: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct RepoConfig {
    pub name: String,
    pub path: PathBuf,
    /// The branch pushed to; `None`: the checkout's upstream branch.
    pub branch: Option<String>,
    pub remote: String,
    pub push: bool,
    pub commit_approval: bool,
    pub checks: Vec<String>,
    pub default: bool,
    /// After a push, fast-forward the main checkout when it is on the
    /// pushed branch (for a hook that deploys from the checkout); its
    /// foreign changes are put back on top.
    pub update_checkout: bool,
}

impl RepoConfig {
    /// A repository no config names (the owner's `submit --repo PATH`).
    pub fn unconfigured(path: &Path) -> RepoConfig {
        RepoConfig {
            name: repo_name(path),
            path: path.to_path_buf(),
            branch: None,
            remote: "origin".into(),
            push: true,
            commit_approval: false,
            checks: vec![],
            default: false,
            update_checkout: false,
        }
    }
}

fn repo_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "repo".into())
}

#[derive(Debug, Clone)]
pub struct XmppConfig {
    pub jid: String,
    pub password_env: String,
    /// `host:port`; `None`: the domain's SRV records.
    pub server: Option<String>,
    pub insecure_plaintext_loopback: bool,
    pub allow: Vec<String>,
    pub batch_window: Duration,
    pub chunk_chars: usize,
    pub chunk_pause: Duration,
    /// An answer longer than this is sent as its head and a pointer to the
    /// whole text, kept in the job's run (`answer.md`).
    pub long_answer_chars: usize,
    /// The dashboard's address (`belay ui`), for links to a job's run.
    pub dashboard_url: Option<String>,
}

#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub listen: std::net::SocketAddr,
    pub token_env: String,
    pub name: String,
    pub trusted: bool,
}

#[derive(Debug, Clone)]
pub struct DropConfig {
    pub dir: PathBuf,
    pub poll: Duration,
    /// The directory is the owner's alone: its jobs are the owner's.
    /// Otherwise they are `drop`'s, and wait for an owner's approval.
    pub trusted: bool,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file, if there is one.
    pub path: Option<PathBuf>,
    pub queue: PathBuf,
    pub owners: Vec<String>,
    pub workers: usize,
    pub agent: AgentConfig,
    pub repos: Vec<RepoConfig>,
    pub author: (String, String),
    pub check_timeout: Duration,
    pub lock_wait: Duration,
    pub on_commit: Vec<String>,
    pub on_commit_timeout: Duration,
    pub xmpp: Option<XmppConfig>,
    pub http: Option<HttpConfig>,
    pub drop: Option<DropConfig>,
}

fn at(path: &Path, text: &str, span: Option<std::ops::Range<usize>>, msg: &str) -> JobsError {
    let (l, c) = span
        .map(|s| belay_record::line_col(text, s.start))
        .unwrap_or((1, 1));
    JobsError::Config(format!("{}:{l}:{c}: {msg}", path.display()))
}

fn secs(path: &Path, key: &str, v: Option<f64>, default: f64) -> Result<Duration, JobsError> {
    let v = v.unwrap_or(default);
    if !(v.is_finite() && v > 0.0) {
        return Err(JobsError::Config(format!(
            "{}: {key} is {v}: give a positive number of seconds",
            path.display()
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Is `jid` a bare address (`local@domain`, no resource)?
fn bare(jid: &str) -> bool {
    let Some((l, d)) = jid.split_once('@') else {
        return false;
    };
    !l.is_empty() && !d.is_empty() && !d.contains('/') && !d.contains('@')
}

/// The `[agent]` table over the defaults in `agent`.
fn agent_config(path: &Path, a: RawAgent, agent: &mut AgentConfig) -> Result<(), JobsError> {
    if let Some(s) = a.spec {
        s.parse::<belay_agent::AgentSpec>()
            .map_err(|e| JobsError::Config(format!("{}: [agent] spec: {e}", path.display())))?;
        agent.spec = s;
    }
    if let Some(i) = a.image {
        agent.image = i;
        agent.image_named = true;
    }
    agent.placement = match a.placement.as_deref() {
        None | Some("container") => Placement::Container,
        Some("host") => Placement::Host,
        Some(o) => {
            return Err(JobsError::Config(format!(
                "{}: [agent] placement `{o}`: container or host",
                path.display()
            )))
        }
    };
    agent.model_url = a.model_url;
    // Unset, the dialect is the one the agent speaks; set, it must be one.
    let spec: Option<belay_agent::AgentSpec> = agent.spec.parse().ok();
    let native = spec.as_ref().and_then(|s| s.kind.native_dialect());
    agent.model_api = match a.model_api {
        None => native.unwrap_or(belay_model::Api::Responses),
        Some(api) => {
            let api = api.parse().map_err(|e: belay_model::ModelError| {
                JobsError::Config(format!("{}: [agent] {e}", path.display()))
            })?;
            if let (Some(url), Some(spec)) = (&agent.model_url, &spec) {
                spec.check_dialect("job", api, url, |native| {
                    format!("set [agent] model_api = \"{native}\" (or remove it: the agent's own dialect is the default)")
                })
                .map_err(|e| JobsError::Config(format!("{}: {e}", path.display())))?;
            }
            api
        }
    };
    agent.model_key_env = a.model_key_env;
    agent.auto_approve = a.auto_approve;
    agent.wall_time = secs(path, "[agent] wall_time_s", a.wall_time_s, 900.0)?;
    if let Some(i) = a.idle_s {
        agent.idle = Some(secs(path, "[agent] idle_s", Some(i), 600.0)?);
    }
    agent.max_cost_usd = a.max_cost_usd;
    agent.pass_env = a.pass_env;
    Ok(())
}

/// The `[[repo]]` tables; one alone is the default.
fn repo_configs(
    path: &Path,
    raws: Vec<RawRepo>,
    rel: impl Fn(&Path) -> PathBuf,
) -> Result<Vec<RepoConfig>, JobsError> {
    let mut repos = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for r in raws {
        let p = rel(&r.path);
        let name = r.name.unwrap_or_else(|| repo_name(&p));
        if !names.insert(name.clone()) {
            return Err(JobsError::Config(format!(
                "{}: two [[repo]] tables are named `{name}`: give each a distinct name",
                path.display()
            )));
        }
        if name.contains('/') || name.starts_with('.') || name.is_empty() {
            return Err(JobsError::Config(format!(
                "{}: [[repo]] name `{name}` must be a plain name (no `/`, not starting with `.`)",
                path.display()
            )));
        }
        repos.push(RepoConfig {
            name,
            path: p,
            branch: r.branch,
            remote: r.remote.unwrap_or_else(|| "origin".into()),
            push: r.push.unwrap_or(true),
            commit_approval: r.commit_approval,
            checks: r.checks,
            default: r.default,
            update_checkout: r.update_checkout,
        });
    }
    if repos.len() == 1 {
        repos[0].default = true;
    }
    Ok(repos)
}

/// The `[xmpp]` table; `owners` must be bare chat addresses too.
fn xmpp_config(path: &Path, x: RawXmpp, owners: &[String]) -> Result<XmppConfig, JobsError> {
    if !bare(&x.jid) {
        return Err(JobsError::Config(format!(
            "{}: [xmpp] jid `{}` is not a bare address (name@domain)",
            path.display(),
            x.jid
        )));
    }
    for a in owners.iter().chain(&x.allow) {
        if !bare(a) && a != LOCAL_SENDER {
            return Err(JobsError::Config(format!(
                "{}: `{a}` is not a bare chat address (name@domain): owners and [xmpp] allow list addresses",
                path.display()
            )));
        }
    }
    if x.insecure_plaintext_loopback {
        let loopback = x
            .server
            .as_deref()
            .and_then(|s| s.parse::<std::net::SocketAddr>().ok())
            .is_some_and(|a| a.ip().is_loopback());
        if !loopback {
            return Err(JobsError::Config(format!(
                "{}: [xmpp] insecure_plaintext_loopback needs server = \"127.0.0.1:PORT\": plain TCP is for a loopback test server only; everything else uses TLS",
                path.display()
            )));
        }
    }
    Ok(XmppConfig {
        jid: x.jid,
        password_env: x.password_env,
        server: x.server,
        insecure_plaintext_loopback: x.insecure_plaintext_loopback,
        allow: x.allow,
        batch_window: Duration::from_millis(x.batch_window_ms.unwrap_or(3000)),
        chunk_chars: x.chunk_chars.unwrap_or(3000).clamp(200, 60_000),
        chunk_pause: Duration::from_millis(x.chunk_pause_ms.unwrap_or(700)),
        long_answer_chars: x.long_answer_chars.unwrap_or(6000).clamp(500, 200_000),
        dashboard_url: x
            .dashboard_url
            .map(|u| u.trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty()),
    })
}

/// The `[http]` table: a loopback endpoint.
fn http_config(path: &Path, h: RawHttp) -> Result<HttpConfig, JobsError> {
    let listen: std::net::SocketAddr = h
        .listen
        .as_deref()
        .unwrap_or("127.0.0.1:8470")
        .parse()
        .map_err(|e| JobsError::Config(format!("{}: [http] listen: {e}", path.display())))?;
    if !listen.ip().is_loopback() {
        return Err(JobsError::Config(format!(
            "{}: [http] listen {listen} is not a loopback address: the endpoint is for tools on this machine (127.0.0.1)",
            path.display()
        )));
    }
    Ok(HttpConfig {
        listen,
        token_env: h.token_env,
        name: h.name.unwrap_or_else(|| "http".into()),
        trusted: h.trusted,
    })
}

impl Config {
    /// No file: a queue directory alone.
    pub fn bare(queue: PathBuf) -> Config {
        Config {
            path: None,
            queue,
            owners: vec![],
            workers: 1,
            agent: AgentConfig {
                spec: "codex".into(),
                image: belay_sandbox::bootstrap::AGENT_IMAGE.to_string(),
                image_named: false,
                placement: Placement::Container,
                model_url: None,
                model_api: belay_model::Api::Responses,
                model_key_env: None,
                auto_approve: false,
                wall_time: Duration::from_secs(900),
                idle: Some(Duration::from_secs(600)),
                max_cost_usd: None,
                pass_env: vec![],
            },
            repos: vec![],
            author: ("belay builder".into(), "builder@belay.invalid".into()),
            check_timeout: Duration::from_secs(600),
            lock_wait: Duration::from_secs(3600),
            on_commit: vec![],
            on_commit_timeout: Duration::from_secs(300),
            xmpp: None,
            http: None,
            drop: None,
        }
    }

    /// Read `path`.
    pub fn load(path: &Path) -> Result<Config, JobsError> {
        // host-owned: jobs.toml, the owner's config (never mounted).
        let text = fs_err::read_to_string(path).map_err(|e| {
            JobsError::Config(format!(
                "cannot read the jobs config {}: {e}",
                path.display()
            ))
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config, JobsError> {
        let raw: Raw = toml::from_str(text).map_err(|e| {
            at(
                path,
                text,
                e.span(),
                &format!("{} (see docs/jobs.md for the keys)", e.message()),
            )
        })?;
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let base = abs
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let rel = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        let Some(queue) = raw.queue.as_deref().map(rel) else {
            return Err(JobsError::Config(format!(
                "{}: no `queue`: say where the queue lives (queue = \"/var/lib/belay/jobs\")",
                path.display()
            )));
        };
        let mut c = Config::bare(queue);
        c.path = Some(path.to_path_buf());
        for o in &raw.owners {
            if o.trim().is_empty() {
                return Err(JobsError::Config(format!(
                    "{}: owners holds an empty address",
                    path.display()
                )));
            }
        }
        c.owners = raw.owners;
        if let Some(w) = raw.workers {
            if w == 0 || w > 64 {
                return Err(JobsError::Config(format!(
                    "{}: workers is {w}: give 1 to 64",
                    path.display()
                )));
            }
            c.workers = w;
        }
        agent_config(path, raw.agent, &mut c.agent)?;
        c.repos = repo_configs(path, raw.repos, rel)?;
        if let Some(n) = raw.commit.author_name {
            c.author.0 = n;
        }
        if let Some(e) = raw.commit.author_email {
            c.author.1 = e;
        }
        c.check_timeout = secs(
            path,
            "[commit] check_timeout_s",
            raw.commit.check_timeout_s,
            600.0,
        )?;
        c.lock_wait = secs(path, "[commit] lock_wait_s", raw.commit.lock_wait_s, 3600.0)?;
        c.on_commit = raw.hooks.on_commit;
        c.on_commit_timeout = secs(
            path,
            "[hooks] on_commit_timeout_s",
            raw.hooks.on_commit_timeout_s,
            300.0,
        )?;
        if let Some(x) = raw.xmpp {
            c.xmpp = Some(xmpp_config(path, x, &c.owners)?);
        }
        if let Some(h) = raw.http {
            c.http = Some(http_config(path, h)?);
        }
        if let Some(d) = raw.drop {
            c.drop = Some(DropConfig {
                dir: rel(&d.dir),
                poll: Duration::from_millis(d.poll_ms.unwrap_or(500).max(50)),
                trusted: d.trusted,
            });
        }
        Ok(c)
    }

    /// Is `who` an owner (the command line always is)?
    pub fn is_owner(&self, who: &str) -> bool {
        who == LOCAL_SENDER || self.owners.iter().any(|o| o == who)
    }

    /// May `who` send requests over chat (owners, and the allow list)?
    pub fn may_request(&self, who: &str) -> bool {
        self.is_owner(who)
            || self
                .xmpp
                .as_ref()
                .is_some_and(|x| x.allow.iter().any(|a| a == who))
    }

    /// The repository a job names: a configured name or path, or (for an
    /// owner's job) any path.
    pub fn repo_for(&self, name: &str, owner: bool) -> Result<RepoConfig, JobsError> {
        if let Some(r) = self.repos.iter().find(|r| r.name == name) {
            return Ok(r.clone());
        }
        let p = Path::new(name);
        let canon = fs_err::canonicalize(p).ok();
        if let Some(r) = self
            .repos
            .iter()
            .find(|r| canon.is_some() && fs_err::canonicalize(&r.path).ok() == canon)
        {
            return Ok(r.clone());
        }
        if owner && p.is_absolute() {
            return Ok(RepoConfig::unconfigured(canon.as_deref().unwrap_or(p)));
        }
        Err(JobsError::Refused(format!(
            "the job names the repository `{name}`, which {} does not list: only the owner's jobs may name other repositories, by absolute path",
            self.path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "the config".into())
        )))
    }

    /// The repositories of a job that names none.
    pub fn default_repos(&self) -> Vec<RepoConfig> {
        self.repos.iter().filter(|r| r.default).cloned().collect()
    }
}

/// Find the config: `--config`, else `<queue>/jobs.toml` (with `--queue`),
/// else `./jobs.toml`, else `$XDG_CONFIG_HOME/belay/jobs.toml`. With none, a
/// `--queue` alone is enough.
pub fn locate(config: Option<&Path>, queue: Option<&Path>) -> Result<Config, JobsError> {
    let queue = queue.map(|q| std::path::absolute(q).unwrap_or_else(|_| q.to_path_buf()));
    let queue = queue.as_deref();
    if let Some(c) = config {
        let mut cfg = Config::load(c)?;
        if let Some(q) = queue {
            cfg.queue = q.to_path_buf();
        }
        return Ok(cfg);
    }
    let mut candidates = vec![];
    if let Some(q) = queue {
        candidates.push(q.join("jobs.toml"));
    }
    candidates.push(PathBuf::from("jobs.toml"));
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
    {
        candidates.push(x.join("belay/jobs.toml"));
    }
    for c in candidates {
        if c.is_file() {
            let mut cfg = Config::load(&c)?;
            if let Some(q) = queue {
                cfg.queue = q.to_path_buf();
            }
            return Ok(cfg);
        }
    }
    match queue {
        Some(q) => Ok(Config::bare(q.to_path_buf())),
        None => Err(JobsError::Config(
            "no queue: pass --queue DIR, or write a jobs.toml with `queue = \"DIR\"` (here, or in ~/.config/belay/)".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_line_and_column() {
        let p = Path::new("/etc/jobs.toml");
        let e = Config::parse(p, "queue = \"q\"\n[agent]\nspek = \"codex\"\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/jobs.toml:3:1: unknown field `spek`"),
            "{e}"
        );
        let e = Config::parse(p, "queue = \"q\"\n[[repo]]\npath = 3\n").unwrap_err();
        assert!(e.to_string().starts_with("/etc/jobs.toml:3:8"), "{e}");
        let e = Config::parse(p, "[agent]\n").unwrap_err();
        assert!(e.to_string().contains("no `queue`"), "{e}");
        let e = Config::parse(
            p,
            "queue = \"q\"\n[xmpp]\njid = \"b@x\"\npassword_env = \"P\"\nserver = \"10.0.0.1:5222\"\ninsecure_plaintext_loopback = true\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        let e = Config::parse(
            p,
            "queue = \"q\"\n[http]\nlisten = \"0.0.0.0:1\"\ntoken_env = \"T\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("not a loopback"), "{e}");
    }

    #[test]
    fn paths_are_relative_to_the_file_and_one_repo_is_the_default() {
        let p = Path::new("/etc/belay/jobs.toml");
        let c = Config::parse(
            p,
            "queue = \"q\"\nowners = [\"a@x\"]\n[[repo]]\npath = \"site\"\nchecks = [\"make test\"]\n",
        )
        .unwrap();
        assert_eq!(c.queue, Path::new("/etc/belay/q"));
        assert_eq!(c.repos[0].name, "site");
        assert!(c.repos[0].default);
        assert!(c.is_owner("a@x") && c.is_owner("local") && !c.is_owner("b@x"));
        assert!(c.repo_for("/elsewhere", false).is_err());
        assert!(c.repo_for("/elsewhere", true).is_ok());
        assert!(c.repo_for("site", false).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn any_text_is_a_config_or_an_error_naming_the_file(s in "\\PC{0,200}") {
            if let Err(e) = Config::parse(Path::new("/j.toml"), &s) {
                proptest::prop_assert!(e.to_string().starts_with("/j.toml"));
            }
        }
    }
}
