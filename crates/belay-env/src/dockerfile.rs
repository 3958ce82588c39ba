//! The Dockerfile that rebuilds a run's final environment from its base image
//! with the final block scripts: the build, reproducible without belay.

use std::path::Path;

use belay_sandbox::trust::{CA_VARS, CONTAINER_CA_PATH};

use crate::plan::{Block, REPO_DIR, SCRIPTS_DIR};

/// Render the Dockerfile. `run_rel` is the run directory relative to the
/// repository root (the build context), when the state dir is inside the repo.
pub fn render(
    run_id: &str,
    base_image: &str,
    blocks: &[Block],
    with_ca: bool,
    run_rel: Option<&Path>,
    excluded: &[String],
) -> String {
    let rel = run_rel
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "belay-run".to_string());
    let mut s = format!("# Rebuilds the environment of belay run {run_id} from its base image with the final block scripts.\n");
    match run_rel {
        Some(_) => s.push_str(&format!(
            "# The build context is the repository root:\n#   docker build -f {rel}/Dockerfile .\n"
        )),
        None => s.push_str(
            "# The build context is the repository root, with this run directory copied to ./belay-run:\n#   cp -r <run-dir> ./belay-run && docker build -f belay-run/Dockerfile .\n",
        ),
    }
    s.push_str(&format!("FROM {base_image}\n"));
    if with_ca {
        s.push_str("# The host's CA bundle, at a path no package update rewrites.\n");
        s.push_str(&format!("COPY {rel}/belay-ca.crt {CONTAINER_CA_PATH}\n"));
        let env: Vec<String> = CA_VARS
            .iter()
            .map(|v| format!("{v}={CONTAINER_CA_PATH}"))
            .collect();
        s.push_str(&format!("ENV {}\n", env.join(" \\\n    ")));
    }
    s.push_str(&format!("COPY . {REPO_DIR}\n"));
    let mut rm: Vec<String> = excluded.iter().map(|e| format!("{REPO_DIR}/{e}")).collect();
    if run_rel.is_none() {
        rm.push(format!("{REPO_DIR}/belay-run"));
    }
    if !rm.is_empty() {
        s.push_str(&format!(
            "# belay copies the repository without these.\nRUN rm -rf {}\n",
            rm.join(" ")
        ));
    }
    s.push_str(&format!(
        "COPY {rel}/scripts/ {SCRIPTS_DIR}/\nWORKDIR {REPO_DIR}\n"
    ));
    for b in blocks {
        s.push_str(&format!(
            "# {}: {}\nRUN bash {}\n",
            b.id,
            b.title,
            b.container_script_path()
        ));
    }
    s
}
