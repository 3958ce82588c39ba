//! The date dependencies are resolved as of.
//!
//! A project's loosely pinned dependencies resolve to whatever is newest on
//! the day of the build. For a checkout of an older commit, or an older
//! release's sdist, that is often a version its tests were never run with:
//! a build backend without `pkg_resources`, a pytest whose removed warning
//! classes break `filterwarnings`, a library that dropped an API. belay
//! resolves Python dependencies as of the source's own date instead (uv's
//! `--exclude-newer`): what was published when the commit was made or the
//! sdist was cut. The date comes from
//!
//! - the committer date of `HEAD`, when the repository is the root of a git
//!   work tree (read with belay-vcs: hooks and config-named programs off);
//! - otherwise the modification time of `PKG-INFO`, which an sdist's archive
//!   keeps from the moment it was built, unless it is one of the fixed
//!   timestamps reproducible-build tools write (then it says nothing);
//! - `--resolve-as-of DATE` overrides both, `--resolve-as-of latest` turns it off.

use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::EnvError;

/// The cut-off that went into the plan, and where it came from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResolveAsOf {
    /// RFC 3339, UTC, whole seconds.
    pub at: String,
    /// Why this date: "the committer date of HEAD (abc1234)", ...
    pub from: String,
}

/// What the user asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AsOfChoice {
    /// The source's own date, when it has one (the default).
    #[default]
    Source,
    /// The newest versions: no cut-off.
    Latest,
    /// A date the user gave.
    At(String),
}

impl AsOfChoice {
    /// The flag's spelling of this choice (what [`AsOfChoice::parse`] reads).
    pub fn as_arg(&self) -> String {
        match self {
            AsOfChoice::Source => "source".into(),
            AsOfChoice::Latest => "latest".into(),
            AsOfChoice::At(t) => t.clone(),
        }
    }

    /// Parse `source`, `latest`, a date (`2024-05-01`) or an RFC 3339 time.
    pub fn parse(s: &str) -> Result<Self, EnvError> {
        match s.trim() {
            "source" => Ok(AsOfChoice::Source),
            "latest" | "none" => Ok(AsOfChoice::Latest),
            t => Ok(AsOfChoice::At(normalise(t).ok_or_else(|| {
                EnvError::Usage(format!(
                    "--resolve-as-of {t:?} is not a date: give YYYY-MM-DD, an RFC 3339 time (2024-05-01T12:00:00Z), `source` or `latest`"
                ))
            })?)),
        }
    }
}

/// `2024-05-01` or an RFC 3339 time, as UTC RFC 3339 whole seconds.
fn normalise(t: &str) -> Option<String> {
    if let Ok(ts) = t.parse::<jiff::Timestamp>() {
        return Some(format_ts(ts));
    }
    let d: jiff::civil::Date = t.parse().ok()?;
    let ts = d.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(format_ts(ts))
}

fn format_ts(ts: jiff::Timestamp) -> String {
    ts.round(jiff::Unit::Second)
        .unwrap_or(ts)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Timestamps that reproducible-build tools write into every file of an
/// archive: they date nothing. 1980-01-01 (zip's epoch and
/// SOURCE_DATE_EPOCH's usual floor), 2020-02-02 (hatchling's default),
/// 2006-07-24T01:21:28Z (cargo package).
const FIXED_EPOCHS: &[i64] = &[315_532_800, 1_580_601_600, 1_153_704_088];

/// The date of an sdist's `PKG-INFO`, when it is a real one.
pub fn sdist_date(repo: &Path) -> Option<ResolveAsOf> {
    let meta = fs_err::metadata(repo.join("PKG-INFO")).ok()?;
    let secs = meta
        .modified()
        .ok()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_secs() as i64;
    let now = jiff::Timestamp::now().as_second();
    // Before 2000, a fixed epoch, or in the future: not a build time.
    if secs < 946_684_800 || FIXED_EPOCHS.contains(&secs) || secs > now {
        return None;
    }
    let ts = jiff::Timestamp::from_second(secs).ok()?;
    Some(ResolveAsOf {
        at: format_ts(ts),
        from: "the modification time of PKG-INFO (an sdist keeps its build time)".into(),
    })
}

/// The committer date of `HEAD`, when `repo` is the root of a git work tree.
/// `hooks_dir`: an empty directory belay owns, the hooks path of the call.
pub async fn git_date(repo: &Path, hooks_dir: &Path) -> Option<ResolveAsOf> {
    if !repo.join(".git").exists() {
        return None;
    }
    let git = belay_vcs::Git::open(repo, hooks_dir).await.ok()?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    };
    if !same(git.root(), repo) {
        return None;
    }
    let out = git
        .run(&[
            "log",
            "-1",
            "--no-show-signature",
            "--format=%cI %h",
            "HEAD",
        ])
        .await
        .ok()?;
    let mut it = out.split_whitespace();
    let (date, sha) = (it.next()?, it.next()?);
    Some(ResolveAsOf {
        at: normalise(date)?,
        from: format!("the committer date of HEAD ({sha})"),
    })
}

/// The cut-off for `repo` under `choice`.
pub async fn resolve(repo: &Path, hooks_dir: &Path, choice: &AsOfChoice) -> Option<ResolveAsOf> {
    match choice {
        AsOfChoice::Latest => None,
        AsOfChoice::At(at) => Some(ResolveAsOf {
            at: at.clone(),
            from: "--resolve-as-of".into(),
        }),
        AsOfChoice::Source => match git_date(repo, hooks_dir).await {
            Some(d) => Some(d),
            None => sdist_date(repo),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dates_and_keywords() {
        assert_eq!(AsOfChoice::parse("latest").unwrap(), AsOfChoice::Latest);
        assert_eq!(AsOfChoice::parse("source").unwrap(), AsOfChoice::Source);
        assert_eq!(
            AsOfChoice::parse("2024-05-01").unwrap(),
            AsOfChoice::At("2024-05-01T00:00:00Z".into())
        );
        assert_eq!(
            AsOfChoice::parse("2024-05-01T12:30:00+02:00").unwrap(),
            AsOfChoice::At("2024-05-01T10:30:00Z".into())
        );
        let err = AsOfChoice::parse("last tuesday").unwrap_err().to_string();
        assert!(err.contains("YYYY-MM-DD"), "{err}");
    }

    #[test]
    fn an_sdist_dates_itself_unless_its_time_is_a_fixed_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("PKG-INFO");
        fs_err::write(&pkg, "Metadata-Version: 2.1\nName: x\n").unwrap();
        let set = |secs: i64| {
            let f = std::fs::File::options().write(true).open(&pkg).unwrap();
            f.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64))
                .unwrap();
        };
        set(1_701_382_485); // 2023-11-30T22:14:45Z
        let d = sdist_date(dir.path()).unwrap();
        assert_eq!(d.at, "2023-11-30T22:14:45Z");
        for fixed in FIXED_EPOCHS {
            set(*fixed);
            assert_eq!(sdist_date(dir.path()), None, "{fixed}");
        }
        fs_err::remove_file(&pkg).unwrap();
        assert_eq!(sdist_date(dir.path()), None);
    }
}
