//! `belay relay`: the main process of a route's relay container
//! (`belay_sandbox::route`), carrying each connection from the run's internal
//! network to belay's forwarder or proxy on the host, byte for byte, until
//! the container is removed.

use crate::cli::RelayArgs;
use crate::exit::{infra, Failure};

pub async fn relay(a: RelayArgs) -> Result<u8, Failure> {
    let fwd = belay_sandbox::egress::TcpForward::start(a.listen, a.to.clone())
        .await
        .map_err(|e| infra(format!("cannot listen on {}: {e}", a.listen)))?;
    eprintln!("belay relay: {} -> {}", fwd.addr, a.to);
    let stop = crate::context::stop_on_signals()?;
    // Until the container is stopped (SIGTERM) or removed, or the lifeline's
    // lock comes free (belay is gone, even after a `kill -9`).
    match a.lifeline {
        Some(path) => {
            let freed = tokio::task::spawn_blocking(move || lock_shared(&path));
            tokio::select! {
                _ = stop.wait() => {}
                _ = freed => {}
            }
        }
        None => {
            stop.wait().await;
        }
    }
    Ok(0)
}

/// Wait for a shared lock on `path` (free once its holder is gone).
fn lock_shared(path: &std::path::Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)?;
    Ok(())
}
