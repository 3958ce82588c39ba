//! `belay doctor`: can this machine run belay?

use std::path::{Path, PathBuf};

use belay_sandbox::bootstrap::DEFAULT_BASE_IMAGE;
use belay_sandbox::{ContainerRuntime, DockerRuntime};

use crate::cli::DoctorArgs;
use crate::exit::{Failure, EXIT_FAILED};
use crate::output::Printer;

pub async fn doctor(p: &Printer, a: DoctorArgs) -> Result<u8, Failure> {
    let mut failed = 0;
    let mut report = |ok: bool, what: &str, detail: String| {
        p.out(format!(
            "{} {what}: {detail}",
            if ok { "ok  " } else { "FAIL" }
        ));
        if !ok {
            failed += 1;
        }
    };
    match DockerRuntime::connect().await {
        Ok(rt) => {
            match rt.info().await {
                Ok(i) => report(
                    true,
                    "docker",
                    format!(
                        "Docker {} ({}), API {} (belay speaks {}), storage {}",
                        i.server_version,
                        i.os,
                        i.api_version,
                        i.negotiated_api_version,
                        i.storage_driver
                    ),
                ),
                Err(e) => report(false, "docker", e.to_string()),
            }
            match rt.image_exists(&a.base_image).await {
                Ok(true) => report(true, "base image", format!("{} is present", a.base_image)),
                Ok(false) => {
                    report(
                        false,
                        "base image",
                        if a.base_image == DEFAULT_BASE_IMAGE {
                            format!(
                                "{} is missing. Build it offline with `belay image bootstrap`",
                                a.base_image
                            )
                        } else {
                            format!("{} is missing. Build or load it (`docker images` lists what is there)", a.base_image)
                        },
                    )
                }
                Err(e) => report(false, "base image", e.to_string()),
            }
        }
        Err(e) => {
            report(false, "docker", e.to_string());
            report(
                false,
                "base image",
                "not checked: the Docker daemon is not reachable".into(),
            );
        }
    }
    match std::process::Command::new("git").arg("--version").output() {
        Ok(o) if o.status.success() => report(
            true,
            "git",
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        ),
        _ => report(
            false,
            "git",
            "git is not on PATH. Install it (`apt-get install -y git`)".into(),
        ),
    }
    for (what, path) in [
        ("disk (state dir)", a.state_dir.clone()),
        ("disk (docker)", PathBuf::from("/var/lib/docker")),
    ] {
        if !path.exists() {
            continue;
        }
        match free_bytes(&path) {
            Some(free) => {
                let gib = free as f64 / (1u64 << 30) as f64;
                if gib < 2.0 {
                    report(false, what, format!("only {gib:.1} GiB free under {}. Free at least 2 GiB (`docker system prune`, `belay env gc`)", path.display()));
                } else {
                    report(
                        true,
                        what,
                        format!("{gib:.1} GiB free under {}", path.display()),
                    );
                }
            }
            None => report(
                false,
                what,
                format!("cannot read free space of {}", path.display()),
            ),
        }
    }
    // The machine's package download caches: their size against their cap.
    let cache = belay_env::rundir::machine_cache_dir(&a.state_dir);
    let (bytes, files) = belay_env::package_cache::usage(&cache);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    match belay_env::package_cache::max_bytes() {
        Ok(cap) => report(
            true,
            "package caches",
            format!(
                "{:.2} GiB in {files} file(s) under {}; {}",
                gib(bytes),
                belay_env::package_cache::root(&cache).display(),
                match cap {
                    Some(c) => format!("cap {:.1} GiB (BELAY_PACKAGE_CACHE_MAX), least recently used trimmed when a build ends", gib(c)),
                    None => "no cap (BELAY_PACKAGE_CACHE_MAX=0): `belay env gc --package-caches` clears them".into(),
                }
            ),
        ),
        Err(e) => report(false, "package caches", e.to_string()),
    }
    Ok(if failed == 0 { 0 } else { EXIT_FAILED })
}

fn free_bytes(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}
