//! Host samples: the disk of the work and log dirs (space and inodes),
//! memory (`/proc/meminfo`, swap-out from `/proc/vmstat`) and memory
//! pressure (`/proc/pressure/memory`, where the kernel has PSI). Read
//! directly from the kernel: no process is spawned.

use std::path::Path;

use jiff::Timestamp;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    #[serde(with = "ts")]
    pub at: Timestamp,
    pub disk_used_pct: Option<f64>,
    pub inode_used_pct: Option<f64>,
    /// Which filesystem the disk figures are of.
    pub disk_path: String,
    pub mem_free_mb: Option<f64>,
    pub mem_avail_mb: Option<f64>,
    /// Pages swapped out since boot, in MiB.
    pub swap_out_mb: Option<f64>,
    pub psi_some_avg10: Option<f64>,
    pub psi_full_avg10: Option<f64>,
}

mod ts {
    pub fn serialize<S: serde::Serializer>(t: &jiff::Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_string())
    }
}

fn statvfs_pct(p: &Path) -> Option<(f64, f64)> {
    let s = rustix::fs::statvfs(p).ok()?;
    let used = s.f_blocks.saturating_sub(s.f_bfree) as f64;
    // As df counts: used against what non-root users can have.
    let total = used + s.f_bavail as f64;
    let disk = (total > 0.0).then(|| 100.0 * used / total)?;
    let inodes = (s.f_files > 0)
        .then(|| 100.0 * s.f_files.saturating_sub(s.f_ffree) as f64 / s.f_files as f64);
    Some((disk, inodes.unwrap_or(0.0)))
}

fn meminfo() -> (Option<f64>, Option<f64>) {
    // host-owned: /proc.
    let Ok(t) = fs_err::read_to_string("/proc/meminfo") else {
        return (None, None);
    };
    let get = |k: &str| {
        t.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|kib| kib / 1024.0)
    };
    (get("MemFree:"), get("MemAvailable:"))
}

fn swap_out_mb() -> Option<f64> {
    // host-owned: /proc.
    let t = fs_err::read_to_string("/proc/vmstat").ok()?;
    let pages: f64 = t
        .lines()
        .find(|l| l.starts_with("pswpout "))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(pages * 4096.0 / (1024.0 * 1024.0))
}

fn psi() -> (Option<f64>, Option<f64>) {
    // host-owned: /proc.
    let Ok(t) = fs_err::read_to_string("/proc/pressure/memory") else {
        return (None, None);
    };
    let avg10 = |prefix: &str| {
        t.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("avg10=")))
            .and_then(|v| v.parse::<f64>().ok())
    };
    (avg10("some"), avg10("full"))
}

/// One sample; the disk figures are of whichever of `paths` is fullest.
pub fn sample(paths: &[&Path]) -> Sample {
    let mut disk: Option<(f64, f64, String)> = None;
    for p in paths {
        if let Some((d, i)) = statvfs_pct(p) {
            if disk.as_ref().is_none_or(|(bd, _, _)| d > *bd) {
                disk = Some((d, i, p.display().to_string()));
            }
        }
    }
    let (free, avail) = meminfo();
    let (some, full) = psi();
    Sample {
        at: Timestamp::now(),
        disk_used_pct: disk.as_ref().map(|d| d.0),
        inode_used_pct: disk.as_ref().map(|d| d.1),
        disk_path: disk.map(|d| d.2).unwrap_or_default(),
        mem_free_mb: free,
        mem_avail_mb: avail,
        swap_out_mb: swap_out_mb(),
        psi_some_avg10: some,
        psi_full_avg10: full,
    }
}
