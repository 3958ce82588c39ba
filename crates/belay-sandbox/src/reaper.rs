//! The orphan reaper.
//!
//! Every container belay creates carries its owner's pid, process start time,
//! boot id and machine id. At start, belay removes the containers whose owner is
//! provably gone: same machine and boot but the pid is dead or reused, or same
//! machine and an earlier boot. Containers of a live owner, of another machine
//! sharing the daemon, or without owner labels are never touched.

use std::collections::BTreeMap;

use belay_record::ProcessIdentity;

use crate::{labels, ContainerRuntime, SandboxError};

/// What the evidence on a container says about its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The owner process is running: leave the container alone.
    Alive,
    /// The owner is provably gone: the container is an orphan.
    Gone,
    /// Not owned by a belay process on this machine: not ours to judge.
    Unknown,
}

/// Judge ownership from labels, for the machine `machine` in boot `boot`.
pub fn owner_state(lbl: &BTreeMap<String, String>, machine: &str, boot: &str) -> Owner {
    let get = |k: &str| lbl.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let (Some(m), Some(b), Some(pid), Some(start)) = (
        get(labels::OWNER_MACHINE),
        get(labels::OWNER_BOOT),
        get(labels::OWNER_PID),
        get(labels::OWNER_START),
    ) else {
        return Owner::Unknown;
    };
    if m != machine {
        return Owner::Unknown;
    }
    if b != boot {
        return Owner::Gone;
    }
    let (Ok(pid), Ok(start_ticks)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return Owner::Unknown;
    };
    let id = ProcessIdentity {
        pid,
        start_ticks,
        boot_id: b.to_string(),
    };
    if id.is_alive() {
        Owner::Alive
    } else {
        Owner::Gone
    }
}

#[derive(Debug, Default, Clone)]
pub struct ReapReport {
    pub removed: Vec<String>,
    pub live: usize,
    pub foreign: usize,
}

/// Remove every belay container whose owner is gone.
pub async fn reap_orphans(rt: &dyn ContainerRuntime) -> Result<ReapReport, SandboxError> {
    let me = ProcessIdentity::current();
    let boot = me.map(|m| m.boot_id).unwrap_or_default();
    let machine = labels::machine_id();
    let mut report = ReapReport::default();
    for c in rt
        .list_containers(&[format!("{}=true", labels::BELAY)])
        .await?
    {
        match owner_state(&c.labels, &machine, &boot) {
            Owner::Alive => report.live += 1,
            Owner::Unknown => report.foreign += 1,
            Owner::Gone => {
                tracing::info!(container = %c.id, run = ?c.labels.get(labels::RUN), "removing orphaned container");
                rt.remove(&c.id).await?;
                report.removed.push(c.id);
            }
        }
    }
    Ok(report)
}

/// Remove the containers this very process made for `run` (after a stop:
/// a create that was abandoned half-way still made its container), then the
/// run's route networks (`belay-<run>-…`) that no container uses any more.
pub async fn remove_own(rt: &dyn ContainerRuntime, run: &str) -> Result<Vec<String>, SandboxError> {
    let Some(me) = ProcessIdentity::current() else {
        return Ok(Vec::new());
    };
    let mut removed = Vec::new();
    for c in rt
        .list_containers(&[
            format!("{}=true", labels::BELAY),
            format!("{}={run}", labels::RUN),
        ])
        .await?
    {
        let mine = c.labels.get(labels::OWNER_PID) == Some(&me.pid.to_string())
            && c.labels.get(labels::OWNER_START) == Some(&me.start_ticks.to_string());
        if mine {
            rt.remove(&c.id).await?;
            removed.push(c.id);
        }
    }
    // The uplinks (`…-up`) first: a relay joined both.
    let mut nets = rt.networks_named(&format!("belay-{run}-")).await?;
    nets.sort_by_key(|n| !n.ends_with("-up"));
    for n in nets {
        // A network still in use (another process's) is refused by the engine.
        let _ = rt.remove_network(&n).await;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels_for(id: &ProcessIdentity, machine: &str) -> BTreeMap<String, String> {
        [
            (labels::OWNER_PID, id.pid.to_string()),
            (labels::OWNER_START, id.start_ticks.to_string()),
            (labels::OWNER_BOOT, id.boot_id.clone()),
            (labels::OWNER_MACHINE, machine.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// After a stop, the run's route networks go (an uplink first); another
    /// run's stay.
    #[tokio::test]
    async fn a_stopped_runs_route_networks_are_removed() {
        let rt = crate::fake::FakeRuntime::new(|_| crate::fake::Answer::Exit(0, String::new()));
        for n in ["belay-r1-0a0b0c", "belay-r1-0a0b0c-up", "belay-r12-0d0e0f"] {
            rt.ensure_network(n, true).await.unwrap();
        }
        remove_own(&rt, "r1").await.unwrap();
        assert_eq!(rt.networks(), ["belay-r12-0d0e0f"]);
    }

    #[test]
    fn judges_by_evidence_only() {
        let me = ProcessIdentity::current().unwrap();
        let boot = me.boot_id.clone();
        assert_eq!(
            owner_state(&labels_for(&me, "m1"), "m1", &boot),
            Owner::Alive
        );
        let reused = ProcessIdentity {
            start_ticks: me.start_ticks + 7,
            ..me.clone()
        };
        assert_eq!(
            owner_state(&labels_for(&reused, "m1"), "m1", &boot),
            Owner::Gone
        );
        let old_boot = ProcessIdentity {
            boot_id: "earlier".into(),
            ..me.clone()
        };
        assert_eq!(
            owner_state(&labels_for(&old_boot, "m1"), "m1", &boot),
            Owner::Gone
        );
        // Another machine sharing the daemon: never ours to judge.
        assert_eq!(
            owner_state(&labels_for(&reused, "m2"), "m1", &boot),
            Owner::Unknown
        );
        // Blanked owner labels (a container started from a belay image).
        let mut blank = labels_for(&reused, "m1");
        blank.insert(labels::OWNER_PID.into(), String::new());
        assert_eq!(owner_state(&blank, "m1", &boot), Owner::Unknown);
        assert_eq!(owner_state(&BTreeMap::new(), "m1", &boot), Owner::Unknown);
    }
}
