//! `belay image bootstrap`: the base image, built offline from the host's apt
//! sources.

use std::path::Path;

use anyhow::Context;
use belay_sandbox::bootstrap;
use belay_sandbox::ContainerRuntime;

use crate::cli::BootstrapArgs;
use crate::context::connect;
use crate::exit::{usage, Failure};
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
    let sources = bootstrap::host_sources(Path::new("/"), &a.suite);
    let mirror = match a.mirror.clone().or_else(|| bootstrap::mirror_for(&sources, &a.suite)) {
        Some(m) => m,
        None => {
            return Err(usage(format!(
                "no apt source for suite {} in /etc/apt/sources.list or /etc/apt/sources.list.d; pass --mirror URL",
                a.suite
            )))
        }
    };
    let work = std::env::temp_dir().join(format!("belay-bootstrap-{}", std::process::id()));
    let rootfs = work.join("rootfs");
    fs_err::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let log = work.join("debootstrap.log");
    p.note(&format!(
        "debootstrap {} from {mirror} (log: {})",
        a.suite,
        log.display()
    ));
    let result = async {
        bootstrap::debootstrap(&a.suite, &rootfs, &mirror, &a.include, &log).await?;
        let list = if sources.is_empty() {
            vec![bootstrap::AptSource {
                uri: mirror.clone(),
                suites: vec![a.suite.clone()],
                components: vec!["main".into()],
                signed_by: None,
            }]
        } else {
            sources.clone()
        };
        let text = bootstrap::render_sources(&list, &rootfs);
        let apt = rootfs.join("etc/apt");
        fs_err::create_dir_all(apt.join("sources.list.d"))
            .with_context(|| format!("cannot create {}", apt.display()))?;
        let _ = fs_err::remove_file(apt.join("sources.list"));
        fs_err::write(apt.join("sources.list.d/belay.sources"), text).with_context(|| {
            format!(
                "cannot write {}",
                apt.join("sources.list.d/belay.sources").display()
            )
        })?;
        p.note(&format!("importing {tag}"));
        let changes = vec![
            "LABEL belay=true".to_string(),
            "LABEL belay.kind=base".to_string(),
            format!("LABEL belay.suite={}", a.suite),
            "ENV LANG=C.UTF-8".to_string(),
            "CMD [\"bash\"]".to_string(),
        ];
        let id = rt.import_rootfs(&rootfs, &tag, changes).await?;
        anyhow::Ok(id)
    }
    .await;
    let _ = fs_err::remove_dir_all(&rootfs);
    let id = result?;
    let _ = fs_err::remove_dir_all(&work);
    p.out(format!("{tag} {id}"));
    Ok(0)
}
