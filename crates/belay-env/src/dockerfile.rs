//! The Dockerfile that rebuilds a run's final environment from its base image
//! with the final block scripts: the build, reproducible without belay.
//!
//! Two are written. `Dockerfile` gives each block BuildKit cache mounts for
//! pip, uv, npm, yarn and apt, as belay's own builds share the machine's
//! download caches: BuildKit is the builder of Docker 23 and later (and of
//! `DOCKER_BUILDKIT=1` before). `Dockerfile.legacy` is the same without them,
//! for the legacy builder, which refuses `RUN --mount`.

use std::path::Path;

use belay_sandbox::trust::{CA_VARS, CONTAINER_CA_PATH};

use crate::plan::{Block, REPO_DIR, SCRIPTS_DIR};

/// Which builder a rendered Dockerfile is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builder {
    /// BuildKit: every block with the package cache mounts.
    BuildKit,
    /// The legacy builder: no `RUN --mount`.
    Legacy,
}

impl Builder {
    /// The file name in the run directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Builder::BuildKit => "Dockerfile",
            Builder::Legacy => "Dockerfile.legacy",
        }
    }
}

/// Render the Dockerfile. `run_rel` is the run directory relative to the
/// repository root (the build context), when the state dir is inside the repo.
pub fn render(
    run_id: &str,
    base_image: &str,
    blocks: &[Block],
    with_ca: bool,
    run_rel: Option<&Path>,
    excluded: &[String],
    builder: Builder,
) -> String {
    let name = builder.file_name();
    let rel = run_rel
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "belay-run".to_string());
    let mut s = format!("# Rebuilds the environment of belay run {run_id} from its base image with the final block scripts.\n");
    match run_rel {
        Some(_) => s.push_str(&format!(
            "# The build context is the repository root:\n#   docker build -f {rel}/{name} .\n"
        )),
        None => s.push_str(
            &format!("# The build context is the repository root, with this run directory copied to ./belay-run:\n#   cp -r <run-dir> ./belay-run && docker build -f belay-run/{name} .\n"),
        ),
    }
    s.push_str(match builder {
        Builder::BuildKit => "# For BuildKit (Docker 23 and later, or DOCKER_BUILDKIT=1): each block gets\n# the package download caches as cache mounts, never in a layer. The legacy\n# builder refuses RUN --mount: use Dockerfile.legacy beside this file.\n",
        Builder::Legacy => "# For the legacy builder (no RUN --mount): every block downloads its packages.\n# With BuildKit, Dockerfile beside this file shares the download caches.\n",
    });
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
    let run = match builder {
        Builder::BuildKit => crate::package_cache::buildkit_run_prefix(),
        Builder::Legacy => "RUN".to_string(),
    };
    let step = |s: &mut String, b: &Block| {
        s.push_str(&format!(
            "# {}: {}\n{run} bash {}\n",
            b.id,
            b.title,
            b.container_script_path()
        ));
    };
    // The blocks that ran before the repository copy come first, with their
    // own scripts only: their layers do not depend on the repository.
    let under = blocks.iter().take_while(|b| b.before_workspace).count();
    if under > 0 {
        let scripts: Vec<String> = blocks[..under]
            .iter()
            .map(|b| format!("{rel}/scripts/{}.sh", b.id))
            .collect();
        s.push_str(&format!(
            "# Toolchain blocks: they read nothing of the repository.\nCOPY {} {SCRIPTS_DIR}/\nWORKDIR {REPO_DIR}\n",
            scripts.join(" ")
        ));
        for b in &blocks[..under] {
            step(&mut s, b);
        }
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
    for b in &blocks[under..] {
        step(&mut s, b);
    }
    s.push_str("# The project's own tools first on PATH, as in belay's final image.\n");
    s.push_str(&format!("ENV {}\n", final_env(blocks).join(" ")));
    s
}

/// The variables of a final image (and of the written Dockerfile's last
/// line): `node_modules/.bin` and the virtualenv's `bin` first on `PATH`
/// (`$PATH` is the base image's), and `VIRTUAL_ENV` when a block makes one,
/// so that `docker run IMAGE pytest`, `python3`, a console script or a
/// project's `node_modules` tool works as a developer types it. `SHELL`
/// as a terminal sets it (and CI runners do): a test of a tool that
/// installs shell completions reads it (pnpm-tabtab's, unset, wrote
/// `~/.bashrc` and then cleaned a literal `~/.bashrc`); bash itself sets
/// but does not export it.
pub fn final_env(blocks: &[Block]) -> Vec<String> {
    let mut env = vec![
        format!("PATH={REPO_DIR}/node_modules/.bin:{REPO_DIR}/.venv/bin:$PATH"),
        "SHELL=/bin/bash".to_string(),
    ];
    if blocks.iter().any(|b| b.script.contains(".venv")) {
        env.push(format!("VIRTUAL_ENV={REPO_DIR}/.venv"));
    }
    // A line a block's script exports, which the image keeps.
    let exported = |line: &str| {
        blocks
            .iter()
            .any(|b| b.script.lines().any(|l| l.trim() == line))
    };
    // Tests recorded on a colour terminal (`plan::COLOUR_TESTS`).
    if exported(crate::plan::COLOUR_TESTS) {
        env.push("FORCE_COLOR=1".to_string());
    }
    // yarn 2+'s linker, as the install used it (`plan::YARN_NODE_MODULES`).
    if exported(crate::plan::YARN_NODE_MODULES) {
        env.push("YARN_NODE_LINKER=node-modules".to_string());
    }
    // yarn 2+'s Plug'n'Play archives, unplugged packages and install
    // state, where the install put them (`plan::YARN_PNP`).
    if exported(crate::plan::YARN_PNP) {
        let vars = crate::plan::YARN_PNP.trim_start_matches("export ");
        env.extend(vars.split_whitespace().map(str::to_string));
    }
    // corepack's shims run the release it keeps under COREPACK_HOME: the
    // image's own, not `$HOME/.cache` (a sandbox's HOME is a fresh tmpfs).
    if blocks
        .iter()
        .any(|b| b.script.contains(crate::plan::COREPACK_HOME))
    {
        env.push(format!("COREPACK_HOME={}", crate::plan::COREPACK_HOME));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks() -> Vec<Block> {
        vec![
            Block::planned(
                "10-system-packages",
                "System packages",
                "apt",
                &["apt-get install -y git".into()],
                "git --version",
            ),
            Block::planned(
                "30-python",
                "Python deps",
                "pip",
                &["uv pip install -e .".into()],
                "python -c 'import pkg'",
            ),
        ]
    }

    #[test]
    fn toolchain_blocks_come_before_the_copy() {
        let mut b = blocks();
        b[0].before_workspace = true;
        let text = render(
            "r1",
            "belay-base:bookworm",
            &b,
            false,
            None,
            &[],
            Builder::Legacy,
        );
        let copy = text.find("COPY . /workspace/repo").unwrap();
        let sys = text
            .find("RUN bash /belay/scripts/10-system-packages.sh")
            .unwrap();
        let py = text.find("RUN bash /belay/scripts/30-python.sh").unwrap();
        assert!(sys < copy && copy < py, "{text}");
        assert!(text.contains("COPY belay-run/scripts/10-system-packages.sh /belay/scripts/\n"));
        assert_eq!(text.matches("10-system-packages.sh").count(), 2, "{text}");
    }

    #[test]
    fn buildkit_and_legacy() {
        let excluded = vec![".venv".to_string()];
        for builder in [Builder::BuildKit, Builder::Legacy] {
            let text = render(
                "r1",
                "belay-base:bookworm",
                &blocks(),
                true,
                Some(Path::new(".belay/runs/r1")),
                &excluded,
                builder,
            );
            insta::assert_snapshot!(builder.file_name(), text);
        }
    }

    #[test]
    fn the_legacy_file_has_no_mounts_and_the_buildkit_file_every_cache() {
        let legacy = render("r", "b", &blocks(), false, None, &[], Builder::Legacy);
        assert!(!legacy.contains("--mount="), "{legacy}");
        let bk = render("r", "b", &blocks(), false, None, &[], Builder::BuildKit);
        for want in [
            "target=/mnt/pip",
            "target=/mnt/uv",
            "target=/mnt/npm",
            "target=/mnt/yarn",
            "target=/var/cache/apt/archives,sharing=locked",
            "PIP_CACHE_DIR=/mnt/pip",
        ] {
            assert_eq!(bk.matches(want).count(), 2, "{want} on every block:\n{bk}");
        }
        assert!(bk.contains("belay-run/Dockerfile ."), "{bk}");
        assert!(legacy.contains("belay-run/Dockerfile.legacy ."), "{legacy}");
    }
}
