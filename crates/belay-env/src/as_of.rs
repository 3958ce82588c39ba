//! The date dependencies are resolved as of.
//!
//! A project's loosely pinned dependencies resolve to whatever is newest on
//! the day of the build. For a checkout of an older commit, or an older
//! release's sdist, that is often a version its tests were never run with:
//! a build backend without `pkg_resources`, a pytest whose removed warning
//! classes break `filterwarnings`, a library that dropped an API. belay
//! resolves Python dependencies as of the source's own date instead (uv's
//! `--exclude-newer`), and a node project's when it has no lockfile (npm's
//! `--before`): what was published when the commit was made or the
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
            "latest" => Ok(AsOfChoice::Latest),
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

/// The x.y.0 release of each Python minor (UTC midnight).
const PYTHON_RELEASES: &[(&str, &str)] = &[
    ("3.8", "2019-10-14"),
    ("3.9", "2020-10-05"),
    ("3.10", "2021-10-04"),
    ("3.11", "2022-10-24"),
    ("3.12", "2023-10-02"),
    ("3.13", "2024-10-07"),
    ("3.14", "2025-10-07"),
];

/// How long after an interpreter's release its wheels have caught up.
const WHEELS_CATCH_UP_DAYS: i64 = 90;

/// The earliest cut-off that works on Python `version` (`3.11.2`): three
/// months after its x.y.0. Before that, most compiled dependencies had no
/// wheels for it, and the build backends of the time could not do the
/// editable install the plan makes (setuptools 64, PEP 660, came in August
/// 2022). `None` for a Python the table does not know.
pub fn floor_for_python(version: &str) -> Option<String> {
    let mut parts = version.split('.');
    let minor = format!("{}.{}", parts.next()?, parts.next()?);
    let (_, day) = PYTHON_RELEASES.iter().find(|(v, _)| *v == minor)?;
    let d: jiff::civil::Date = day.parse().ok()?;
    let d = d
        .checked_add(jiff::Span::new().days(WHEELS_CATCH_UP_DAYS))
        .ok()?;
    let ts = d.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(format_ts(ts))
}

/// A source date no earlier than the floor for `python`, saying so when it
/// was raised. Dates the user gave are kept as they are.
pub fn clamp(mut a: ResolveAsOf, python: &str, user_given: bool) -> ResolveAsOf {
    if user_given {
        return a;
    }
    if let Some(floor) = floor_for_python(python) {
        // RFC 3339 UTC strings of one shape order as their times do.
        if a.at < floor {
            a.from = format!(
                "{}, {}, raised to three months after Python {}'s release: older dependencies have no wheels for it, and older build backends cannot install editable",
                a.at, a.from, python
            );
            a.at = floor;
        }
    }
    a
}

/// Whether a source's time can date it: not before 2000, not one of the
/// fixed epochs below, not in the future.
fn plausible(secs: i64) -> bool {
    secs >= 946_684_800
        && !FIXED_EPOCHS.contains(&secs)
        && secs <= jiff::Timestamp::now().as_second()
}

/// Timestamps that reproducible-build tools write into every file of an
/// archive: they date nothing. 1980-01-01 (zip's epoch and
/// SOURCE_DATE_EPOCH's usual floor), 2020-02-02 (hatchling's default),
/// 2006-07-24T01:21:28Z (cargo package).
const FIXED_EPOCHS: &[i64] = &[315_532_800, 1_580_601_600, 1_153_704_088];

/// The date of an sdist's `PKG-INFO`, when it is a real one.
pub fn sdist_date(repo: &Path) -> Option<ResolveAsOf> {
    modified_date(
        &repo.join("PKG-INFO"),
        "the modification time of PKG-INFO (an sdist keeps its build time)",
    )
}

/// The date of an npm package's `package.json` outside a git checkout,
/// when it is a tarball's real one: a tarball packed before npm 5 (May
/// 2017) keeps its files' times; a later one gives every file npm's fixed
/// 1985-10-26, which [`plausible`] refuses. A later time is a copy's or an
/// edit's (a directory that is not a checkout, a fixture), which dates no
/// release: only times before [`NPM_KEEPS_TIMES_UNTIL`] count.
pub fn package_json_date(repo: &Path) -> Option<ResolveAsOf> {
    modified_date(
        &repo.join("package.json"),
        "the modification time of package.json (an npm tarball packed before npm 5 keeps its files' times)",
    )
    .filter(|d| d.at.as_str() < NPM_KEEPS_TIMES_UNTIL)
}

/// 2018-01-01: npm 5 (May 2017) fixed every packed file's time, and
/// tarballs packed by older npms thin out through that year.
const NPM_KEEPS_TIMES_UNTIL: &str = "2018-01-01";

/// A file's modification time as a cut-off, when [`plausible`].
fn modified_date(file: &Path, from: &str) -> Option<ResolveAsOf> {
    let meta = fs_err::symlink_metadata(file).ok()?;
    if !meta.is_file() {
        return None;
    }
    let secs = meta
        .modified()
        .ok()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_secs() as i64;
    if !plausible(secs) {
        return None;
    }
    let ts = jiff::Timestamp::from_second(secs).ok()?;
    Some(ResolveAsOf {
        at: format_ts(ts),
        from: from.into(),
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
    let ts: jiff::Timestamp = date.parse().ok()?;
    if !plausible(ts.as_second()) || !sha.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    Some(ResolveAsOf {
        at: format_ts(ts),
        from: format!("the committer date of HEAD ({sha})"),
    })
}

/// The cut-off for `repo` under `choice`, for a build on Python `python`.
pub async fn resolve(
    repo: &Path,
    hooks_dir: &Path,
    choice: &AsOfChoice,
    python: &str,
) -> Option<ResolveAsOf> {
    match choice {
        AsOfChoice::Source => {
            let found = match git_date(repo, hooks_dir).await {
                Some(d) => Some(d),
                None => sdist_date(repo),
            };
            found.map(|a| clamp(a, python, false))
        }
        _ => given(choice),
    }
}

/// The cut-off the user named: a date, or none for `latest`.
fn given(choice: &AsOfChoice) -> Option<ResolveAsOf> {
    match choice {
        AsOfChoice::At(at) => Some(ResolveAsOf {
            at: at.clone(),
            from: "--resolve-as-of".into(),
        }),
        _ => None,
    }
}

/// A node project's date, as `env plan` and `env build` both take it: the
/// cut-off of its install without a lockfile, and the node of that date
/// ([`apply_node_era`]).
pub async fn date_node(
    n: &mut crate::analyze::NodeFacts,
    repo: &Path,
    hooks_dir: &Path,
    choice: &AsOfChoice,
) {
    n.resolve_as_of = resolve_node(repo, hooks_dir, choice).await;
    apply_node_era(n);
}

/// The cut-off for a node project's install without a lockfile (npm's
/// `--before`): its commit's date, else (an unpacked npm tarball) its
/// `package.json`'s time where npm kept a real one. A node has no table of
/// wheels to catch up.
async fn resolve_node(repo: &Path, hooks_dir: &Path, choice: &AsOfChoice) -> Option<ResolveAsOf> {
    match choice {
        AsOfChoice::Source => match git_date(repo, hooks_dir).await {
            Some(d) => Some(d),
            None => package_json_date(repo),
        },
        _ => given(choice),
    }
}

/// The newest node major released when this was written (26, April 2026;
/// the npm registry's `node` package has it): a range's upper bound past it
/// names this line. Raise it with [`NODE_LTS`].
pub const NEWEST_NODE_MAJOR: u32 = 26;

/// Node's long-term-support lines: the major, the day it entered LTS, the
/// day its support ended.
const NODE_LTS: &[(u32, &str, &str)] = &[
    (4, "2015-10-12", "2018-04-30"),
    (6, "2016-10-18", "2019-04-30"),
    (8, "2017-10-31", "2019-12-31"),
    (10, "2018-10-30", "2021-04-30"),
    (12, "2019-10-21", "2022-04-30"),
    (14, "2020-10-27", "2023-04-30"),
    (16, "2021-10-26", "2023-09-11"),
    (18, "2022-10-25", "2025-04-30"),
    (20, "2023-10-24", "2026-04-30"),
    (22, "2024-10-29", "2027-04-30"),
    (24, "2025-10-28", "2028-04-30"),
];

/// The node a project of `at` (RFC 3339) was developed against when it
/// pins none: the oldest LTS line still supported then. Its dependencies of
/// that time support it (the ecosystem drops a line when its support ends),
/// and older code runs on it. `None` before the table starts, or for a
/// date it cannot read; past its last line's support, that line (the
/// newest the table knows).
pub fn node_major_for_date(at: &str) -> Option<u32> {
    oldest_supported_from(at, 0)
}

/// [`node_major_for_date`] among the lines from `from_line` on: `None`
/// before the first of them entered LTS.
fn oldest_supported_from(at: &str, from_line: u32) -> Option<u32> {
    let day = at.get(..10)?;
    let _: jiff::civil::Date = day.parse().ok()?;
    // ISO dates of one shape order as their days do.
    NODE_LTS
        .iter()
        .filter(|(major, _, _)| *major >= from_line)
        .find(|(_, from, until)| *from <= day && day < *until)
        .map(|(major, _, _)| *major)
        .or_else(|| {
            let last = NODE_LTS.last()?;
            (day >= last.2).then_some(last.0)
        })
}

/// The oldest line the CI's lines are settled against the date from (see
/// `apply_node_era`): 14, as before the table had older lines.
const CI_LINES_FROM: u32 = 14;

/// The node a project of `at` was developed on, where that is older than
/// 18: the newest LTS line then (what a new project of the time took). Its code and
/// its packages of that date ran there, where node 18 removed what they
/// used (hapi 17's plugins time out on it, lab counts its new globals as
/// leaks). Not older than [`crate::analyze::OLDEST_NODE_LINE`], the oldest belay installs:
/// an older date gets that line, nearer its time than the distribution's.
/// From 18's LTS on, `None`: newer lines run older code, and the date
/// gives a floor ([`node_major_for_date`]).
pub fn old_node_line_for_date(at: &str) -> Option<u32> {
    use crate::analyze::OLDEST_NODE_LINE;
    let day = at.get(..10)?;
    let _: jiff::civil::Date = day.parse().ok()?;
    let line = NODE_LTS
        .iter()
        .rev()
        .find(|(_, from, _)| *from <= day)
        .map_or(OLDEST_NODE_LINE, |(major, _, _)| {
            (*major).max(OLDEST_NODE_LINE)
        });
    (line < 18).then_some(line)
}

/// A node project's floor from its date, where it pins no node of its own
/// (`.nvmrc`, `.node-version`, `volta`) and its `engines.node` names no line
/// (see `NodeFacts::node_line`): the newer of `engines.node`'s floor
/// and [`node_major_for_date`], with the reason kept for the plan's check.
/// A date before 18's LTS gives its line exactly instead
/// ([`old_node_line_for_date`]), where `engines.node` admits it. Where the
/// project's CI names lines, they settle it instead ([`settle_ci_lines`]).
fn apply_node_era(n: &mut crate::analyze::NodeFacts) {
    // A pin, or a line the project's engines name: its own word.
    if n.node_pin.is_some() || n.node_line.is_some() {
        return;
    }
    let era = n
        .resolve_as_of
        .as_ref()
        .and_then(|a| node_major_for_date(&a.at));
    if !n.ci_node_lines.is_empty() {
        // From 14's LTS on, as the CI's lines were settled before the table
        // had older lines: before it, the CI's newest LTS line is
        // installed, as without a date (what the project ran beats a guess
        // from its date, and node 10's npm 6 reads no newer lockfile).
        let ci_era = n
            .resolve_as_of
            .as_ref()
            .and_then(|a| oldest_supported_from(&a.at, CI_LINES_FROM));
        settle_ci_lines(n, ci_era);
        return;
    }
    let Some(a) = &n.resolve_as_of else {
        return;
    };
    let day = &a.at[..10.min(a.at.len())];
    // An old date: its line, exactly, where the project's engines admit it
    // and no lockfile of npm 7 or later says the project ran a newer node.
    let new_lockfile = n.npm_lockfile_version.is_some_and(|v| v >= 2);
    if let Some(line) = old_node_line_for_date(&a.at).filter(|_| !new_lockfile) {
        let admitted = n
            .engines_node
            .as_deref()
            .is_none_or(|r| allows_major(r, line));
        if admitted && n.required_major.is_none_or(|m| m <= line) {
            n.node_line = Some(line);
            n.node_era = Some(format!(
                "node {line}, the newest LTS line on {day} ({})",
                a.from
            ));
            return;
        }
    }
    let Some(era) = era else {
        return;
    };
    // An `engines.node` that caps the major (`18.x`, `<19`) is the
    // project's word: its date does not overrule it.
    if let Some(range) = &n.engines_node {
        if !allows_major(range, era) {
            return;
        }
    }
    if n.required_major.is_none_or(|m| m < era) {
        n.required_major = Some(era);
        n.node_era = Some(format!(
            "node {era}, the oldest LTS line supported on {day} ({})",
            a.from
        ));
    }
}

/// The lines of the project's CI settle its node. With a source date,
/// those from its date's line on are kept (a CI of that date ran them with
/// the packages of that date), and the oldest LTS one of them is installed
/// where none runs, as [`node_major_for_date`] would; where the CI tests
/// only older lines, its newest LTS one (what the project ran beats a
/// guess from its date). Without a date, the newest LTS line it tests is
/// installed. Where that line is older than 18 it is the project's line,
/// exactly (its npm and package managers follow it); else any kept line
/// from 18 on runs as it is.
fn settle_ci_lines(n: &mut crate::analyze::NodeFacts, era: Option<u32>) {
    use crate::analyze::lts_first;
    // Once: what it leaves is no longer the CI's own lines.
    if n.ci_node_install.is_some() {
        return;
    }
    let lines = std::mem::take(&mut n.ci_node_lines);
    let from_era: Vec<u32> = match era {
        Some(era) => lines.iter().copied().filter(|l| *l >= era).collect(),
        None => vec![],
    };
    let (mut kept, install) = if !from_era.is_empty() {
        let install = lts_first(&from_era, false);
        (from_era, install)
    } else if era.is_some() {
        let newest = lts_first(&lines, true);
        (newest.into_iter().collect(), newest)
    } else {
        let install = lts_first(&lines, true);
        (lines, install)
    };
    match install {
        Some(line) if line < 18 => {
            n.node_line = Some(line);
            kept = vec![line];
        }
        _ => kept.retain(|l| *l >= 18),
    }
    n.ci_node_lines = kept;
    n.ci_node_install = install;
}

/// Whether a semver range (`engines.node`) admits some release of node
/// `major`, read at the major's level: `>=18`, `^20.19.0 || >=22`, `18.x`,
/// `<19`, `14 - 18`. A range it cannot read admits it.
pub fn allows_major(range: &str, major: u32) -> bool {
    let num = |v: &str| -> Option<(u32, bool)> {
        let v = v.trim_start_matches(['v', '=']);
        let mut parts = v.split('.');
        let m = parts.next()?.parse().ok()?;
        // Anything but zeros after the major (`<20.5` admits 20).
        // A prerelease of zeros (`<17.0.0-0`) is still below 17.
        let more = parts.any(|p| {
            let p = p.split('-').next().unwrap_or(p);
            p != "0" && p != "x" && p != "*" && p != "X"
        });
        Some((m, more))
    };
    let mut readable = false;
    for alt in range.split("||") {
        let alt = alt.trim();
        let (mut lo, mut hi) = (0u32, u32::MAX);
        let mut ok = true;
        let toks: Vec<&str> = alt.split_whitespace().collect();
        if let [a, "-", b] = toks.as_slice() {
            match (num(a), num(b)) {
                (Some((a, _)), Some((b, _))) => (lo, hi) = (a, b),
                _ => ok = false,
            }
        } else {
            // `>= 20` (a space after the operator) reads as `>=20`.
            let joined = alt
                .replace(">= ", ">=")
                .replace("<= ", "<=")
                .replace("> ", ">")
                .replace("< ", "<");
            for t in joined.split_whitespace() {
                let (op, v) = match t.find(|c: char| c.is_ascii_digit()) {
                    Some(i) => t.split_at(i),
                    None if matches!(t, "*" | "x" | "X") => continue,
                    None => {
                        ok = false;
                        break;
                    }
                };
                let Some((m, more)) = num(v) else {
                    ok = false;
                    break;
                };
                match op {
                    ">=" => lo = lo.max(m),
                    ">" => lo = lo.max(if more { m } else { m + 1 }),
                    "<=" => hi = hi.min(m),
                    "<" => hi = hi.min(if more { m } else { m.saturating_sub(1) }),
                    "^" | "~" | "" | "=" | "v" => {
                        lo = lo.max(m);
                        hi = hi.min(m);
                    }
                    _ => {
                        ok = false;
                        break;
                    }
                }
            }
        }
        if ok {
            readable = true;
            if lo <= major && major <= hi {
                return true;
            }
        }
    }
    !readable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_projects_date_gives_the_oldest_supported_lts() {
        assert_eq!(node_major_for_date("2015-06-01T00:00:00Z"), None);
        assert_eq!(node_major_for_date("2019-06-01T00:00:00Z"), Some(8));
        assert_eq!(node_major_for_date("2021-06-01T00:00:00Z"), Some(12));
        assert_eq!(node_major_for_date("2024-03-01T00:00:00Z"), Some(18));
        assert_eq!(node_major_for_date("2025-05-01T00:00:00Z"), Some(20));
        assert_eq!(node_major_for_date("2026-10-04T16:34:54Z"), Some(22));
        assert_eq!(node_major_for_date("2029-01-01T00:00:00Z"), Some(24));
        assert_eq!(node_major_for_date("yesterday"), None);
        let dated = |pin: Option<&str>, floor: Option<u32>| {
            let mut n = crate::analyze::NodeFacts {
                node_pin: pin.map(String::from),
                required_major: floor,
                resolve_as_of: Some(ResolveAsOf {
                    at: "2026-10-04T16:34:54Z".into(),
                    from: "the committer date of HEAD (1e9bf09)".into(),
                }),
                ..Default::default()
            };
            apply_node_era(&mut n);
            n
        };
        let n = dated(None, None);
        assert_eq!(n.required_major, Some(22));
        assert_eq!(
            n.node_era.as_deref(),
            Some("node 22, the oldest LTS line supported on 2026-10-04 (the committer date of HEAD (1e9bf09))")
        );
        for (range, yes) in [
            (">=18", true),
            ("^20.19.0 || ^22.13.0 || >=24", true),
            ("18.x", false),
            ("<19", false),
            ("<22.5", true),
            ("14 - 18", false),
            (">= 20.19.0", true),
            ("^18 || ^20", false),
            ("*", true),
            ("anything", true),
        ] {
            assert_eq!(allows_major(range, 22), yes, "{range}");
        }
        let mut capped = crate::analyze::NodeFacts {
            engines_node: Some("18.x".into()),
            required_major: Some(18),
            resolve_as_of: dated(None, None).resolve_as_of,
            ..Default::default()
        };
        apply_node_era(&mut capped);
        assert_eq!((capped.required_major, capped.node_era), (Some(18), None));
        assert_eq!(node_major_for_date("2022-11-01T00:00:00Z"), Some(14));
        // Before 18's LTS, the date's newest LTS line, exactly.
        for (at, line) in [
            ("2014-07-24T22:26:00Z", Some(4)),
            ("2015-10-12T00:00:00Z", Some(4)),
            ("2017-07-13T00:00:00Z", Some(6)),
            ("2018-05-17T00:00:00Z", Some(8)),
            ("2019-04-09T22:28:21Z", Some(10)),
            ("2021-12-19T00:00:00Z", Some(16)),
            ("2022-10-25T00:00:00Z", None),
            ("2024-03-01T00:00:00Z", None),
        ] {
            assert_eq!(old_node_line_for_date(at), line, "{at}");
        }
        let old = |engines: Option<&str>, floor: Option<u32>| {
            let mut n = crate::analyze::NodeFacts {
                engines_node: engines.map(String::from),
                required_major: floor,
                resolve_as_of: Some(ResolveAsOf {
                    at: "2019-04-09T22:28:21Z".into(),
                    from: "the committer date of HEAD (0a1b2c3)".into(),
                }),
                ..Default::default()
            };
            apply_node_era(&mut n);
            n
        };
        // h2o2 8.2.0: hapi 17's plugins, `engines.node` ">=8.x.x".
        let n = old(Some(">=8.x.x"), Some(8));
        assert_eq!((n.node_line, n.required_major), (Some(10), Some(8)));
        assert_eq!(
            n.node_era.as_deref(),
            Some(
                "node 10, the newest LTS line on 2019-04-09 (the committer date of HEAD (0a1b2c3))"
            )
        );
        assert_eq!(old(None, None).node_line, Some(10));
        // The project's engines outrank its date: a floor above the line,
        // or a range without it, keeps the floor.
        let n = old(Some(">=12"), Some(12));
        assert_eq!((n.node_line, n.required_major), (None, Some(12)));
        assert_eq!(old(Some("^8.9"), Some(8)).node_line, None);
        // A lockfile of npm 7 or later: the project ran a newer node.
        let mut locked = crate::analyze::NodeFacts {
            npm_lockfile_version: Some(3),
            ..old(None, None)
        };
        (locked.node_line, locked.node_era) = (None, None);
        apply_node_era(&mut locked);
        assert_eq!(locked.node_line, None);
        // The CI's lines before 14's LTS: its newest LTS line, as without
        // a date; from it on, from the date's oldest supported line.
        let ci_at = |at: &str, lines: &[u32]| {
            let mut n = crate::analyze::NodeFacts {
                ci_node_lines: lines.to_vec(),
                resolve_as_of: Some(ResolveAsOf {
                    at: at.into(),
                    from: "x".into(),
                }),
                ..Default::default()
            };
            apply_node_era(&mut n);
            (n.node_line, n.ci_node_install)
        };
        assert_eq!(
            ci_at("2019-06-01T00:00:00Z", &[10, 12]),
            (Some(12), Some(12))
        );
        assert_eq!(
            ci_at("2021-03-01T00:00:00Z", &[10, 12, 14]),
            (Some(14), Some(14))
        );
        assert_eq!(ci_at("2021-03-01T00:00:00Z", &[16, 18]).1, Some(16));
        // The CI's lines settle it: from the date's line (22) on, else the
        // CI's newest; older than 18, that line exactly.
        let ci = |lines: &[u32]| {
            let mut n = crate::analyze::NodeFacts {
                ci_node_lines: lines.to_vec(),
                ..dated(None, None)
            };
            n.required_major = None;
            n.node_era = None;
            apply_node_era(&mut n);
            (n.ci_node_lines, n.node_line, n.ci_node_install)
        };
        // Installed where none runs: the date's line, or the oldest LTS
        // one after it.
        assert_eq!(ci(&[18, 20, 22, 24]), (vec![22, 24], None, Some(22)));
        assert_eq!(
            ci(&[20, 21, 23, 24, 25]),
            (vec![23, 24, 25], None, Some(24))
        );
        assert_eq!(ci(&[16, 18, 20]), (vec![20], None, Some(20)));
        assert_eq!(ci(&[6, 8, 10]), (vec![10], Some(10), Some(10)));
        assert_eq!(ci(&[12, 14, 15]), (vec![14], Some(14), Some(14)));
        let mut undated = crate::analyze::NodeFacts {
            ci_node_lines: vec![14, 16, 18, 20],
            ..Default::default()
        };
        settle_ci_lines(&mut undated, None);
        assert_eq!(
            (
                &undated.ci_node_lines,
                undated.node_line,
                undated.ci_node_install
            ),
            (&vec![18, 20], None, Some(20))
        );
        // Settled once: again, with a date, it stays as it was.
        let mut again = undated;
        settle_ci_lines(&mut again, Some(14));
        assert_eq!(
            (again.ci_node_lines, again.ci_node_install),
            (vec![18, 20], Some(20))
        );
        // A date of node 14: the CI's 14 exactly (its date's line).
        let mut n = crate::analyze::NodeFacts {
            ci_node_lines: vec![14, 16, 18, 20],
            ..Default::default()
        };
        settle_ci_lines(&mut n, Some(14));
        assert_eq!((n.node_line, n.ci_node_lines), (Some(14), vec![14]));
        // engines asking for more wins; a pin is what the developers run.
        assert_eq!(dated(None, Some(24)).required_major, Some(24));
        assert_eq!(dated(None, Some(24)).node_era, None);
        assert_eq!(dated(Some("18"), Some(18)).required_major, Some(18));
    }

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
    fn a_date_before_the_interpreter_had_wheels_is_raised() {
        assert_eq!(floor_for_python("3.11.2").unwrap(), "2023-01-22T00:00:00Z");
        assert_eq!(floor_for_python("3.13.5").unwrap(), "2025-01-05T00:00:00Z");
        assert_eq!(floor_for_python("2.7.18"), None);
        // six 1.16.0's sdist: May 2021, before setuptools could install editable.
        let six = ResolveAsOf {
            at: "2021-05-05T14:18:16Z".into(),
            from: "the modification time of PKG-INFO".into(),
        };
        let c = clamp(six.clone(), "3.11.2", false);
        assert_eq!(c.at, "2023-01-22T00:00:00Z");
        assert!(
            c.from
                .starts_with("2021-05-05T14:18:16Z, the modification time"),
            "{}",
            c.from
        );
        // A later date stays; a date the user gave stays.
        let late = ResolveAsOf {
            at: "2024-05-04T03:55:12Z".into(),
            from: "x".into(),
        };
        assert_eq!(clamp(late.clone(), "3.11.2", false), late);
        assert_eq!(clamp(six.clone(), "3.11.2", true), six);
    }

    #[test]
    fn an_sdist_dates_itself_unless_its_time_is_a_fixed_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("PKG-INFO");
        fs_err::write(&pkg, "Metadata-Version: 2.1\nName: x\n").unwrap();
        let set = |secs: i64| set_mtime(&pkg, secs as u64);
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

    fn set_mtime(path: &Path, secs: u64) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
            .unwrap();
    }

    #[test]
    fn an_npm_tarball_dates_itself_unless_npm_fixed_its_time() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("package.json");
        fs_err::write(&pkg, "{}").unwrap();
        let set = |secs: u64| set_mtime(&pkg, secs);
        set(1_434_758_400); // body 5.1.0's files: 2015-06-20
        let d = package_json_date(dir.path()).unwrap();
        assert_eq!(d.at, "2015-06-20T00:00:00Z");
        assert!(d.from.contains("package.json"), "{}", d.from);
        set(499_162_500); // npm 5 and later: 1985-10-26T08:15:00Z
        assert_eq!(package_json_date(dir.path()), None);
        // A copy's or an edit's time dates no release.
        set(1_764_979_200); // 2025-12-06
        assert_eq!(package_json_date(dir.path()), None);
        set(1_514_764_799); // the last second of 2017
        assert!(package_json_date(dir.path()).is_some());
        // A link is not the package's file.
        fs_err::remove_file(&pkg).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &pkg).unwrap();
        assert_eq!(package_json_date(dir.path()), None);
    }
}
