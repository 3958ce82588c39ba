//! `belay image bootstrap`: the base image, built offline from the host's apt
//! sources.

use belay_sandbox::bootstrap;
use belay_sandbox::ContainerRuntime;

use crate::cli::BootstrapArgs;
use crate::context::connect;
use crate::exit::Failure;
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
