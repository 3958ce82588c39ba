//! What a start reads back of an earlier start of the run (its manifest,
//! checkpoints, executions and blocks), and the manifest a start begins with.
//! The records are written by [`super::records::Records`].

use super::*;
use crate::manifest::{CacheStats, LlmUsage};

/// The previous manifest of a run, with its executions: an interim one (a
/// killed build) has them in `executions.jsonl` (whole lines only: a line
/// torn by the kill is skipped).
pub(super) fn read_manifest(dir: &RunDir) -> Result<Option<Manifest>, EnvError> {
    let p = dir.manifest();
    // host-owned: the run dir belay writes (records, never mounted into a build).
    let mut m: Manifest = match fs_err::read_to_string(&p) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| EnvError::BadState {
            path: p.clone(),
            message: format!(
                "line {}: {e}; move the run directory away or pick another --run-id",
                e.line()
            ),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(EnvError::io("cannot read", p, e)),
    };
    if !m.complete {
        let cps = dir.checkpoints();
        // host-owned: the run dir's checkpoint log, which belay appends to.
        m.checkpoints = match fs_err::read_to_string(&cps) {
            Ok(t) => crate::manifest::replay_checkpoints(&t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(EnvError::io("cannot read", cps, e)),
        };
        let log = dir.executions();
        // host-owned: the run dir's execution log, which belay appends to.
        m.executions = match fs_err::read_to_string(&log) {
            Ok(t) => t
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(EnvError::io("cannot read", log, e)),
        };
    }
    Ok(Some(m))
}

pub(super) fn read_blocks(dir: &RunDir) -> Result<Option<Vec<Block>>, EnvError> {
    let d = dir.blocks_dir();
    let mut blocks = Vec::new();
    // host-owned: the run dir's block files, which belay wrote.
    let rd = match fs_err::read_dir(&d) {
        Ok(rd) => rd,
        Err(_) => return Ok(None),
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            // host-owned: a block file belay wrote in the run dir.
            let t = fs_err::read_to_string(&p).map_err(|e| EnvError::io("cannot read", &p, e))?;
            let b: Block = serde_json::from_str(&t).map_err(|e| EnvError::BadState {
                path: p.clone(),
                message: format!("not a block file: {e}"),
            })?;
            blocks.push(b);
        }
    }
    if blocks.is_empty() {
        return Ok(None);
    }
    blocks.sort_by_key(|b| b.order);
    Ok(Some(blocks))
}

pub(super) fn new_manifest(
    dir: &RunDir,
    repo: &Path,
    previous: Option<&Manifest>,
    opts: &BuildOptions,
) -> Manifest {
    Manifest {
        ok: false,
        status: "running".into(),
        run_id: dir.run_id.clone(),
        repo_path: repo.to_path_buf(),
        state_dir: dir.state_dir.clone(),
        run_dir: dir.root.clone(),
        scripts_dir: dir.scripts_dir(),
        manifest_path: dir.manifest(),
        llm_usage_path: dir.llm_usage(),
        dockerfile_path: None,
        dockerfile_legacy_path: None,
        base_image: previous.and_then(|p| p.base_image.clone()),
        base_suite: None,
        final_image: None,
        error: None,
        failure_class: None,
        llm_usage: previous
            .map(|p| p.llm_usage.clone())
            .filter(|u| !u.planner.is_empty())
            .unwrap_or_else(|| LlmUsage {
                planner: "rules".into(),
                ..Default::default()
            }),
        ablation_mode: opts.ablation.as_str().into(),
        progress_control: opts.ablation.progress_control(),
        final_clean_replay_enabled: opts.ablation.final_clean_replay(),
        final_clean_replay_ok: None,
        final_clean_replay_image: None,
        final_clean_replay_failure_stage: None,
        final_clean_replay_note: None,
        toolchain: previous.and_then(|p| p.toolchain.clone()),
        oracle: None,
        cache: CacheStats {
            enabled: opts.cache,
            ..Default::default()
        },
        registry: None,
        repairs: previous.map(|p| p.repairs).unwrap_or(0),
        blocks: vec![],
        checkpoints: previous.map(|p| p.checkpoints.clone()).unwrap_or_default(),
        executions: previous.map(|p| p.executions.clone()).unwrap_or_default(),
        complete: false,
        started_at: previous
            .map(|p| p.started_at.clone())
            .unwrap_or_else(belay_record::now_rfc3339),
        finished_at: None,
        duration_s: 0.0,
        starts: previous.map(|p| p.starts).unwrap_or(0) + 1,
        belay_version: env!("CARGO_PKG_VERSION").to_string(),
        engine_api_version: None,
        host_trust: false,
    }
}
