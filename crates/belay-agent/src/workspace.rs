//! Where the built-in agent's tools act: a sandbox container.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use belay_record::Redactor;
use belay_sandbox::{ContainerRuntime, ExecSpec, NoopObserver};

/// What a command in the workspace produced.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandOutput {
    pub exit_code: i64,
    pub timed_out: bool,
    /// Combined stdout and stderr (the tail, redacted).
    pub output: String,
}

#[async_trait]
pub trait Workspace: Send + Sync {
    /// Run a shell command in the workspace directory.
    async fn run(&self, command: &str, timeout: Duration) -> Result<CommandOutput, String>;
    /// A file's bytes; paths are relative to the workspace directory.
    async fn read_file(&self, path: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, String>;
    async fn write_file(&self, path: &str, content: &[u8]) -> Result<(), String>;
    /// The workspace directory (absolute, as tools see it).
    fn root(&self) -> &str;
    /// The sandbox failure that ended this workspace (sticky): once the
    /// engine fails an exec, no further command runs and the agent stops.
    fn infra_error(&self) -> Option<String> {
        None
    }
}

/// How much command output a tool result carries.
pub const OUTPUT_TAIL: u64 = 16 * 1024;

/// A container from the sandbox runtime.
pub struct ContainerWorkspace {
    rt: Arc<dyn ContainerRuntime>,
    container: String,
    workdir: String,
    log_dir: PathBuf,
    redactor: Redactor,
    env: Vec<(String, String)>,
    seq: AtomicU64,
    /// The first engine failure (sticky).
    infra: std::sync::Mutex<Option<String>>,
    /// The workspace is this host directory, bind-mounted read-write at
    /// `workdir`: writes under it go straight to the host (a read-only root
    /// filesystem refuses the engine's archive upload).
    host_root: Option<PathBuf>,
    /// Other host directories bound read-write: (container dir, host dir).
    host_dirs: Vec<(String, PathBuf)>,
}

impl ContainerWorkspace {
    /// `log_dir`: where each command's full log is kept (host side).
    pub fn new(
        rt: Arc<dyn ContainerRuntime>,
        container: &str,
        workdir: &str,
        log_dir: PathBuf,
        redactor: Redactor,
        env: Vec<(String, String)>,
    ) -> Self {
        ContainerWorkspace {
            rt,
            container: container.to_string(),
            workdir: workdir.trim_end_matches('/').to_string(),
            log_dir,
            redactor,
            env,
            seq: AtomicU64::new(0),
            infra: std::sync::Mutex::new(None),
            host_root: None,
            host_dirs: Vec::new(),
        }
    }

    /// An engine error: the machine's (sticky, it ends the agent) or not.
    fn classify(&self, e: belay_sandbox::SandboxError) -> String {
        let text = e.to_string();
        if belay_record::Classify::exit_class(&e) == belay_record::ExitClass::Infra {
            if let Ok(mut g) = self.infra.lock() {
                g.get_or_insert_with(|| text.clone());
            }
        }
        text
    }

    /// Write files under `dir` (a container path) through the host directory
    /// bound there.
    pub fn with_host_dir(mut self, dir: &str, host: PathBuf) -> Self {
        self.host_dirs
            .push((dir.trim_end_matches('/').to_string(), host));
        self
    }

    /// Write files under the workspace through the host directory bound there.
    pub fn with_host_mount(mut self, host_root: PathBuf) -> Self {
        self.host_root = Some(host_root);
        self
    }

    fn abs(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{}", self.workdir, path.trim_start_matches("./"))
        }
    }
}

fn log_tail(path: &std::path::Path, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    // host-owned: a tool log belay's log sink wrote under the session's `logs`
    // (a run dir of belay's, never mounted into the container).
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    let mut s = String::from_utf8_lossy(&buf).into_owned();
    if start > 0 {
        s.insert_str(0, &format!("[… {start} earlier bytes not shown]\n"));
    }
    s
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[async_trait]
impl Workspace for ContainerWorkspace {
    async fn run(&self, command: &str, timeout: Duration) -> Result<CommandOutput, String> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        fs_err::create_dir_all(&self.log_dir)
            .map_err(|e| format!("cannot create {}: {e}", self.log_dir.display()))?;
        let log_path = self.log_dir.join(format!("tool-{n:04}.log"));
        let spec = ExecSpec {
            argv: vec!["bash".into(), "-c".into(), command.to_string()],
            working_dir: Some(self.workdir.clone()),
            env: self.env.clone(),
            timeout: Some(timeout),
            log_path: log_path.clone(),
            log_limit: None,
        };
        if let Some(e) = self.infra_error() {
            return Err(e);
        }
        let out = self
            .rt
            .exec(&self.container, &spec, &self.redactor, &NoopObserver)
            .await
            .map_err(|e| self.classify(e))?;
        let mut output = log_tail(&log_path, OUTPUT_TAIL);
        if output.is_empty() {
            output = format!("{}{}", out.stdout_tail, out.stderr_tail);
        }
        Ok(CommandOutput {
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            output,
        })
    }

    async fn read_file(&self, path: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, String> {
        if let Some(e) = self.infra_error() {
            return Err(e);
        }
        self.rt
            .read_file(&self.container, &self.abs(path), max_bytes)
            .await
            .map_err(|e| self.classify(e))
    }

    fn infra_error(&self) -> Option<String> {
        self.infra.lock().ok().and_then(|g| g.clone())
    }

    async fn write_file(&self, path: &str, content: &[u8]) -> Result<(), String> {
        let abs = self.abs(path);
        for (dir, host) in &self.host_dirs {
            if let Some(rel) = abs.strip_prefix(&format!("{dir}/")) {
                // Never through a link.
                return belay_sandbox::hostfs::write(host, rel, content).map_err(|e| e.to_string());
            }
        }
        if let Some(root) = &self.host_root {
            if let Some(rel) = abs.strip_prefix(&format!("{}/", self.workdir)) {
                // Never through a link, never into .git (belay_sandbox::hostfs).
                return belay_sandbox::hostfs::write(root, rel, content).map_err(|e| e.to_string());
            }
        }
        let dir = match abs.rsplit_once('/') {
            Some((d, _)) if !d.is_empty() => d.to_string(),
            _ => "/".to_string(),
        };
        // Create the directory, and keep an existing file's mode.
        let out = self
            .run(
                &format!(
                    "mkdir -p -- {} && {{ stat -c %a -- {} 2>/dev/null || echo 644; }}",
                    shell_quote(&dir),
                    shell_quote(&abs)
                ),
                Duration::from_secs(30),
            )
            .await?;
        if out.exit_code != 0 {
            return Err(format!("cannot create {dir}: {}", out.output.trim()));
        }
        let mode = out
            .output
            .lines()
            .last()
            .and_then(|l| u32::from_str_radix(l.trim(), 8).ok())
            .unwrap_or(0o644);
        self.rt
            .put_files(&self.container, &[(abs, content.to_vec(), mode)])
            .await
            .map_err(|e| self.classify(e))
    }

    fn root(&self) -> &str {
        &self.workdir
    }
}
