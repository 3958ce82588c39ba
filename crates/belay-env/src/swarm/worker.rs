//! `belay env worker`: one task of a distributed batch. It claims one item,
//! builds it with the registry store, writes its result, and exits.
//!
//! An item whose claim holder is gone (its task was killed, or its node
//! lost) is taken over: the build containers the old holder left are
//! removed, and the build resumes from the run's last checkpoint, which the
//! registry has (the same run id, so the same manifest and checkpoint names).

use std::path::Path;
use std::time::{Duration, Instant};

use belay_sandbox::ContainerRuntime;

use super::spec::{Claim, WorkDir, WorkSpec};
use super::BATCH_LABEL;
use crate::batch::build_prepared;
use crate::progress::{BuildEvent, BuildObserver};
use crate::EnvError;

/// What the worker did.
#[derive(Debug, Clone, PartialEq)]
pub enum Worked {
    /// Built item `index` (`took_over`: from a holder that was gone).
    Built {
        index: usize,
        took_over: bool,
        ok: bool,
    },
    /// Every item has its result.
    NothingLeft,
}

/// This task's name for itself: its container's host name (the container id).
pub fn holder_name() -> String {
    // host-owned: /etc of this task's own container, which runs belay.
    fs_err::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("pid-{}", std::process::id()))
}

/// How long a claim stays valid without its holder renewing it.
pub const LEASE_TTL: Duration = Duration::from_secs(90);
/// How often a working holder renews its claim.
const LEASE_RENEW: Duration = Duration::from_secs(20);

/// Whether the holder of item `i` is gone: its task container is on this
/// engine and not running, or (a holder on another node, which this engine
/// cannot see) its lease has expired.
async fn holder_gone(
    rt: &dyn ContainerRuntime,
    dir: &WorkDir,
    batch: &str,
    i: usize,
    holder: &str,
) -> Result<bool, EnvError> {
    let tasks = rt
        .list_containers(&[format!("{BATCH_LABEL}={batch}")])
        .await?;
    match tasks.iter().find(|c| c.id.starts_with(holder)) {
        Some(c) => Ok(c.state != "running"),
        None => Ok(dir.lease_expired(i, LEASE_TTL)),
    }
}

/// Claim one item: the first nobody holds, else one whose holder is gone.
/// The item, whether it was taken over, and the claim's generation.
async fn claim(
    rt: &dyn ContainerRuntime,
    dir: &WorkDir,
    spec: &WorkSpec,
    me: &str,
) -> Result<Option<(usize, bool, u32)>, EnvError> {
    for item in &spec.items {
        if dir.result(item.index).exists() {
            continue;
        }
        if dir.try_claim(item.index, me)? && !dir.result(item.index).exists() {
            return Ok(Some((item.index, false, 0)));
        }
    }
    for item in &spec.items {
        let i = item.index;
        if dir.result(i).exists() {
            continue;
        }
        let Some((g, current)) = dir.current_claim(i) else {
            continue;
        };
        let old = match current {
            // This task was restarted in place (the same container).
            Some(c) if c.holder == me => return Ok(Some((i, true, g))),
            Some(c) => {
                if !holder_gone(rt, dir, &spec.batch, i, &c.holder).await? {
                    continue;
                }
                c
            }
            // A claim torn by a crash between its creation and its write:
            // gone once its lease has run out.
            None if dir.lease_expired(i, LEASE_TTL) => Claim {
                holder: "unreadable-claim".into(),
                at: String::new(),
                earlier: Vec::new(),
            },
            None => continue,
        };
        if dir.take_over(i, me, g, &old)? {
            return Ok(Some((i, true, g + 1)));
        }
    }
    Ok(None)
}

/// Run one task. A build the engine or the registry stopped returns its
/// error without a result, so that the orchestrator runs the task again and
/// the next one resumes the item; any other outcome is the item's result.
///
/// With `only` (a Kubernetes index), the worker builds that item and no
/// other; a result it finds already there is its outcome.
/// The task's progress (its claims and its build) goes to `obs` as build
/// events: the worker prints nothing itself.
pub async fn work(
    rt: &dyn ContainerRuntime,
    spec_path: &Path,
    only: Option<usize>,
    obs: &dyn BuildObserver,
) -> Result<Worked, EnvError> {
    let say = |detail: String| {
        obs.event(&BuildEvent::Phase {
            name: "worker".into(),
            detail,
        })
    };
    let mut spec = WorkDir::read_spec(spec_path)?;
    if let Some(o) = only {
        spec.items.retain(|i| i.index == o);
        if spec.items.is_empty() {
            return Err(EnvError::Usage(format!(
                "item {o} is not in {}",
                spec_path.display()
            )));
        }
    }
    let dir = WorkDir::new(spec_path.parent().unwrap_or(Path::new(".")));
    let me = holder_name();
    // With nothing to claim while items are unfinished, their holders are
    // alive (or not yet seen to be gone): wait rather than exit, since a task
    // that exits 0 counts as one of the job's completions.
    let (index, took_over, generation) = loop {
        if let Some(c) = claim(rt, &dir, &spec, &me).await? {
            break c;
        }
        if let Some(o) = only {
            if let Some(r) = dir.read_result(o) {
                say(format!("{me}: item {o} has its result already"));
                return Ok(Worked::Built {
                    index: o,
                    took_over: false,
                    ok: r.status == "ok",
                });
            }
        }
        if spec.items.iter().all(|i| dir.result(i.index).exists()) {
            say(format!("{me}: nothing left to claim"));
            return Ok(Worked::NothingLeft);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let item = spec
        .items
        .iter()
        .find(|i| i.index == index)
        .ok_or_else(|| {
            EnvError::Usage(format!("item {index} is not in {}", spec_path.display()))
        })?;
    say(format!(
        "{me}: {} item {index} ({}, run {})",
        if took_over { "took over" } else { "claimed" },
        item.result.name,
        item.result.run_id
    ));
    if took_over {
        // The old holder's build containers: its run is this task's now.
        for c in rt
            .list_containers(&[format!(
                "{}={}",
                belay_sandbox::labels::RUN,
                item.result.run_id
            )])
            .await?
        {
            rt.remove(&c.id).await?;
        }
    }
    let b = item.options.to_build()?;
    let mut result = item.result.clone();
    let t0 = Instant::now();
    // The lease: renewed while this task works, so that a worker on another
    // node can tell a live holder from a lost one.
    let lease = {
        let dir = dir.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_RENEW).await;
                dir.renew(index, generation);
            }
        })
    };
    let built = build_prepared(rt, &b, obs, &mut result).await;
    lease.abort();
    result.duration_s = (t0.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    if let Err(e) = built {
        use belay_record::Classify;
        if e.exit_class() == belay_record::ExitClass::Infra {
            return Err(e);
        }
    }
    if !dir.write_result(index, &result)? {
        say(format!(
            "{me}: item {index} has a result already; this one is dropped"
        ));
    }
    Ok(Worked::Built {
        index,
        took_over,
        ok: result.status == "ok",
    })
}
