//! Binding, the access token, and the router.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use belay_record::{Redactor, Registry};
use tokio::net::TcpListener;

use crate::state::App;
use crate::{api, approvals, assets, auth, stream, UiError};

/// The seed's port for the live view of one run.
pub const DEFAULT_VIZ_PORT: u16 = 8321;

/// How to serve.
pub struct UiOptions {
    pub bind: IpAddr,
    pub port: u16,
    /// When the port is busy, take a free one (`--viz` does, as the seed).
    pub port_fallback: bool,
    /// Binding a non-loopback address was asked for explicitly.
    pub allow_remote: bool,
    pub registry: Registry,
    /// Job queues whose waiting jobs the page shows (more are found from the
    /// jobs runs in the registry).
    pub queues: Vec<PathBuf>,
    /// jobs.toml files, for queues whose config is not `<queue>/jobs.toml`.
    pub jobs_configs: Vec<PathBuf>,
    /// The token; a random one when `None`.
    pub token: Option<String>,
    /// The run the printed URL opens (`--viz`).
    pub focus: Option<String>,
    /// What no response may hold (the secrets this process knows).
    pub redactor: Redactor,
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    token: String,
    focus: Option<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// The URL to open: it carries the token, which the page keeps in its
    /// address (a reload works) and sends with every request.
    pub fn url(&self) -> String {
        let host = match self.addr.ip() {
            IpAddr::V6(ip) => format!("[{ip}]"),
            IpAddr::V4(ip) => ip.to_string(),
        };
        let mut u = format!("http://{host}:{}/?token={}", self.addr.port(), self.token);
        if let Some(f) = &self.focus {
            u.push_str(&format!("#/run/{f}"));
        }
        u
    }

    /// Serve until the task ends (it does not, unless the runtime stops).
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

fn random_token() -> Result<String, UiError> {
    let mut b = [0u8; 24];
    let path = PathBuf::from("/dev/urandom");
    // host-owned: the kernel's /dev/urandom.
    let mut f = fs_err::File::open(&path).map_err(|source| UiError::Io {
        path: path.clone(),
        source,
    })?;
    std::io::Read::read_exact(&mut f, &mut b).map_err(|source| UiError::Io { path, source })?;
    Ok(hex::encode(b))
}

async fn listen(o: &UiOptions) -> Result<TcpListener, UiError> {
    let addr = SocketAddr::new(o.bind, o.port);
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(l),
        Err(e) if o.port_fallback && e.kind() == std::io::ErrorKind::AddrInUse => {
            TcpListener::bind(SocketAddr::new(o.bind, 0))
                .await
                .map_err(|source| UiError::Bind {
                    addr: format!("{}:0", o.bind),
                    source,
                })
        }
        Err(source) => Err(UiError::Bind {
            addr: addr.to_string(),
            source,
        }),
    }
}

/// Bind and serve in a task of the current runtime.
pub async fn serve(o: UiOptions) -> Result<Server, UiError> {
    if !o.bind.is_loopback() && !o.allow_remote {
        return Err(UiError::Remote(o.bind.to_string()));
    }
    let listener = listen(&o).await?;
    let addr = listener.local_addr().map_err(|source| UiError::Bind {
        addr: o.bind.to_string(),
        source,
    })?;
    let token = match o.token.clone() {
        Some(t)
            if t.len() >= 8
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) =>
        {
            t
        }
        Some(_) => return Err(UiError::Token),
        None => random_token()?,
    };
    let loopback_port = o.bind.is_loopback().then_some(addr.port());
    let app = Arc::new(App {
        registry: o.registry,
        queues: o.queues,
        jobs_configs: o.jobs_configs,
        token: token.clone(),
        redactor: o.redactor,
        loopback_port,
    });
    let router = router(app);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::warn!("the dashboard stopped: {e}");
        }
    });
    Ok(Server {
        addr,
        token,
        focus: o.focus,
        task,
    })
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/assets/{file}", get(assets::asset))
        .route("/api/runs", get(api::runs))
        .route("/api/runs/{id}", get(api::run))
        .route("/api/runs/{id}/events", get(stream::events))
        .route("/api/runs/{id}/logs", get(api::logs))
        .route("/api/runs/{id}/log", get(api::log))
        .route("/api/runs/{id}/commits/{sha}", get(api::commit))
        .route("/api/runs/{id}/file/{name}", get(api::file))
        .route("/api/stream", get(stream::registry))
        .route("/api/attention", get(approvals::attention))
        .route("/api/act", post(approvals::act))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::guard,
        ))
        .with_state(app)
}
