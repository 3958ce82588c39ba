//! What several commands share: the engine connection and the redactor of
//! the host's own secrets. A leaf: it imports no command.

use belay_sandbox::DockerRuntime;

use crate::exit::Failure;

/// The one redaction policy's host part (`belay_sandbox::trust::host_redactor`).
pub fn build_redactor() -> belay_record::Redactor {
    belay_sandbox::trust::host_redactor()
}

pub async fn connect() -> Result<DockerRuntime, Failure> {
    DockerRuntime::connect()
        .await
        .map_err(|e| Failure::with_code(belay_record::ExitClass::Infra.code(), e))
}

/// The one cancellation token, tripped by SIGINT and SIGTERM
/// (`belay_record::Stop::on_signals`).
pub fn stop_on_signals() -> Result<belay_record::Stop, Failure> {
    Ok(belay_record::Stop::on_signals(|m| {
        eprintln!("[belay] {m}")
    })?)
}

/// The image a mode's sandboxes run in (`belay_env::sandbox_image`): `named`
/// (an image or an env build's run id), else the latest successful env build
/// of the repository around `dir` (none given: no repository to look for),
/// else `default`. Without an engine, what was named or the default. Says
/// which on the terminal unless named.
pub async fn sandbox_image(
    p: &crate::output::Printer,
    rt: Option<&dyn belay_sandbox::ContainerRuntime>,
    dir: Option<&std::path::Path>,
    named: Option<&str>,
    default: &str,
    needs: &[&str],
) -> Result<String, Failure> {
    let Some(rt) = rt.filter(|_| named.is_some() || dir.is_some()) else {
        return Ok(named.unwrap_or(default).to_string());
    };
    // The repository's root as git finds it (a subdirectory, a worktree).
    let repo = match dir {
        Some(d) => match belay_vcs::Git::open(d, &belay_record::no_hooks_dir()).await {
            Ok(g) => g.root().to_path_buf(),
            Err(_) => d.to_path_buf(),
        },
        None => std::path::PathBuf::new(),
    };
    let chosen = belay_env::sandbox_image::resolve(
        rt,
        &belay_record::Registry::default_location(),
        &repo,
        named,
        default,
        needs,
    )
    .await?;
    if chosen.source != belay_env::sandbox_image::ImageSource::Named {
        p.note(&chosen.describe());
    }
    Ok(chosen.image)
}
