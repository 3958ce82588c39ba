//! `belay image bootstrap`: the base image, built offline from the host's apt
//! sources.

use belay_sandbox::bootstrap;
use belay_sandbox::ContainerRuntime;

use crate::cli::{BootstrapArgs, WorkerImageArgs};
use crate::context::connect;
use crate::exit::{infra, Failure};
use crate::output::Printer;

pub async fn bootstrap(p: &Printer, a: BootstrapArgs) -> Result<u8, Failure> {
    let tag = a
        .tag
        .clone()
        .unwrap_or_else(|| format!("belay-base:{}", a.suite));
    let rt = connect().await?;
    if !a.force && rt.image_exists(&tag).await? {
        p.out(format!("{tag} already exists (use --force to rebuild)"));
        return Ok(0);
    }
    let req = bootstrap::ImageRequest {
        suite: a.suite.clone(),
        tag: tag.clone(),
        include: a.include.clone(),
        mirror: a.mirror.clone(),
        work_dir: std::env::temp_dir().join(format!("belay-bootstrap-{}", std::process::id())),
    };
    let id = bootstrap::build_image(&rt, &req, &|m| p.note(m)).await?;
    p.out(format!("{tag} {id}"));
    Ok(0)
}

pub async fn worker(p: &Printer, a: WorkerImageArgs) -> Result<u8, Failure> {
    let tag = match (&a.tag, &a.registry) {
        (Some(t), _) => t.clone(),
        (None, Some(reg)) => {
            let reg = belay_sandbox::registry::parse_registry(reg)?;
            belay_env::swarm::default_worker_image(&reg)?
        }
        (None, None) => format!("belay-worker:{}", belay_env::swarm::worker_tag()?),
    };
    let rt = connect().await?;
    let tmp = tempfile::Builder::new()
        .prefix("belay-worker-image-")
        .tempdir()
        .map_err(|e| infra(format!("cannot make a temporary directory: {e}")))?;
    let img =
        belay_env::swarm::image::build(&rt, &a.base, &tag, &tmp.path().join("context")).await?;
    p.out(format!("{} {}", img.tag, img.id));
    if let Some(r) = &img.pushed {
        p.out(format!(
            "pushed {} ({} layer(s) uploaded, {} there already) in {:.1} s",
            r.digest.as_deref().unwrap_or("?"),
            r.layers_pushed,
            r.layers_existing,
            r.duration_ms as f64 / 1000.0
        ));
    }
    Ok(0)
}
