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
    // Until the container is stopped (SIGTERM) or removed.
    crate::context::stop_on_signals()?.wait().await;
    Ok(0)
}
