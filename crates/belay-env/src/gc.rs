//! `belay env gc`: remove the checkpoint images and containers of old runs.
//!
//! Only what belay made is considered: images and containers labelled
//! `belay=true` that belong to a run (a `belay.run` label, or a tag of the
//! form `<run>-<NNN>-<block>-<kind>` / `<run>-final` / `<run>-base`). Base
//! images made by `belay image bootstrap` belong to no run and are never
//! removed; final images are kept unless asked. Images are removed by tag
//! (`docker rmi` without force), so a layer another image still needs stays.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use belay_sandbox::{labels, reaper, ContainerRuntime};
use serde::Serialize;

pub use crate::checkpoint_names::run_of_tag;
use crate::checkpoint_names::TOOLCHAIN_KIND;
use crate::EnvError;

#[derive(Debug, Clone, Default)]
pub struct GcOptions {
    /// Only runs whose images are at least this old.
    pub older_than: Duration,
    /// Only these runs (all runs when empty).
    pub runs: Vec<String>,
    /// Remove `-final` images too.
    pub include_final: bool,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub removed_images: Vec<String>,
    pub kept_final: Vec<String>,
    pub removed_containers: Vec<String>,
    pub skipped: Vec<String>,
    pub dry_run: bool,
}

/// Parse `30s`, `15m`, `12h`, `7d` (or plain seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30m, 12h or 7d"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        "w" => 7 * 86400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use s, m, h, d or w")),
    };
    Ok(Duration::from_secs(n * mult))
}

pub async fn gc(rt: &dyn ContainerRuntime, opts: &GcOptions) -> Result<GcReport, EnvError> {
    let mut report = GcReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let wanted = |run: &str| is_wanted(opts, run);
    // Containers first: orphans of dead owners, and stopped containers of runs.
    remove_containers(rt, opts, &mut report).await?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let images = rt.list_images(&[format!("{}=true", labels::BELAY)]).await?;
    // Checkpoints, and base images built for a run; never a bootstrap base.
    let removable = |img: &belay_sandbox::ImageInfo| {
        let kind = img.labels.get(labels::KIND).map(String::as_str);
        let has_run = img.labels.get(labels::RUN).is_some_and(|r| !r.is_empty());
        // A toolchain checkpoint carries the run tags of the runs that used
        // it, which go with those runs.
        kind == Some("checkpoint")
            || kind == Some(TOOLCHAIN_KIND)
            || (kind == Some("base") && has_run)
    };
    // A run's age is that of its newest image: a cache hit tags an old image
    // for a new run, which must not make the new run look old.
    let mut newest: std::collections::HashMap<String, i64> = Default::default();
    for img in images.iter().filter(|i| removable(i)) {
        for tag in tags_of(img) {
            if let Some((run, _)) = run_of_tag(&tag) {
                let e = newest.entry(run).or_insert(img.created);
                *e = (*e).max(img.created);
            }
        }
    }
    let old_enough = |created: i64| is_old_enough(opts, now, created);
    for img in images.iter().filter(|i| removable(i)) {
        let tags = tags_of(img);
        if tags.is_empty() {
            // Untagged: left behind when a checkpoint tag was committed again
            // (a rollback, a resume). It belongs to the run in its label.
            let run = img.labels.get(labels::RUN).cloned().unwrap_or_default();
            if run.is_empty() || !wanted(&run) || !old_enough(img.created) {
                continue;
            }
            if opts.dry_run {
                report.removed_images.push(img.id.clone());
                continue;
            }
            match rt.remove_image(&img.id).await {
                Ok(()) => report.removed_images.push(img.id.clone()),
                Err(e) if e.is_infra() => return Err(e.into()),
                Err(e) => report.skipped.push(format!("{}: {e}", img.id)),
            }
            continue;
        }
        for tag in tags {
            let Some((run, is_final)) = run_of_tag(&tag) else {
                continue;
            };
            if !wanted(&run) || !old_enough(newest.get(&run).copied().unwrap_or(img.created)) {
                continue;
            }
            if is_final && !opts.include_final {
                report.kept_final.push(tag.clone());
                continue;
            }
            if opts.dry_run {
                report.removed_images.push(tag.clone());
                continue;
            }
            match rt.remove_image(&tag).await {
                Ok(()) => report.removed_images.push(tag.clone()),
                Err(e) if e.is_infra() => return Err(e.into()),
                Err(e) => report.skipped.push(format!("{tag}: {e}")),
            }
        }
    }
    remove_toolchain_names(rt, opts, &images, now, &mut report).await?;
    Ok(report)
}

/// Whether `opts` asks for the run `run` (every run when it names none).
fn is_wanted(opts: &GcOptions, run: &str) -> bool {
    opts.runs.is_empty() || opts.runs.iter().any(|r| r == run)
}

/// Whether an image created at `created` (unix seconds) is old enough at `now`.
fn is_old_enough(opts: &GcOptions, now: i64, created: i64) -> bool {
    Duration::from_secs((now - created).max(0) as u64) >= opts.older_than
}

/// An image's tags, without the `<none>` ones.
fn tags_of(img: &belay_sandbox::ImageInfo) -> Vec<String> {
    img.tags
        .iter()
        .filter(|t| !t.contains("<none>"))
        .cloned()
        .collect()
}

/// Remove the orphaned containers of dead owners and the stopped containers
/// of the runs `opts` asks for.
async fn remove_containers(
    rt: &dyn ContainerRuntime,
    opts: &GcOptions,
    report: &mut GcReport,
) -> Result<(), EnvError> {
    if !opts.dry_run {
        let reaped = reaper::reap_orphans(rt).await?;
        report.removed_containers.extend(reaped.removed);
    }
    for c in rt
        .list_containers(&[format!("{}=true", labels::BELAY)])
        .await?
    {
        let Some(run) = c.labels.get(labels::RUN) else {
            continue;
        };
        if c.state == "running" || !is_wanted(opts, run) {
            continue;
        }
        if !opts.dry_run {
            rt.remove(&c.id).await?;
        }
        report.removed_containers.push(c.id);
    }
    Ok(())
}

/// Remove the shared names of the toolchain checkpoints among `images` that
/// no kept run uses, with a gc of all runs.
async fn remove_toolchain_names(
    rt: &dyn ContainerRuntime,
    opts: &GcOptions,
    images: &[belay_sandbox::ImageInfo],
    now: i64,
    report: &mut GcReport,
) -> Result<(), EnvError> {
    // The shared name of a toolchain checkpoint belongs to no run: it goes
    // with a gc of all runs, once the image is old enough and no run that
    // is kept still uses it (a kept run's tag on it stays, and so does it).
    let toolchains = images
        .iter()
        .filter(|i| i.labels.get(labels::KIND).map(String::as_str) == Some(TOOLCHAIN_KIND));
    for img in toolchains {
        if !opts.runs.is_empty() || !is_old_enough(opts, now, img.created) {
            continue;
        }
        let tags = tags_of(img);
        let kept_run = tags
            .iter()
            .any(|t| run_of_tag(t).is_some() && !report.removed_images.contains(t));
        if kept_run {
            continue;
        }
        let names: Vec<String> = tags
            .into_iter()
            .filter(|t| run_of_tag(t).is_none())
            .collect();
        for name in names {
            if opts.dry_run {
                report.removed_images.push(name);
                continue;
            }
            match rt.remove_image(&name).await {
                Ok(()) => report.removed_images.push(name),
                Err(e) if e.is_infra() => return Err(e.into()),
                Err(e) => report.skipped.push(format!("{name}: {e}")),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("7 days").is_err());
        assert!(parse_duration("x").is_err());
    }
}
