//! A block's script and its validation in one `docker exec`.
//!
//! Each exec is a round trip to the engine (about 70 ms here), and uploading
//! the script is another. One exec writes the script where checkpoints keep it
//! (`/belay/scripts/<id>.sh`), runs it, and, when it succeeds, prints a
//! boundary line and runs the validation command. Its last line on stderr says
//! how the validation ended and how the time split:
//!
//! ```text
//! [belay] validation exit=0 script_s=12.304 validation_s=0.811
//! ```
//!
//! No status line means the script itself failed (or the exec was killed).
//! Whatever the block writes is untrusted: a forged line can only claim that
//! the *validation* failed where the script did, since the exec's exit code
//! decides success.

/// The prefix of belay's own lines in a folded exec's output.
pub const MARKER: &str = "[belay] validation";

/// Scripts longer than this are uploaded as a file (an argument is bounded by
/// the kernel's MAX_ARG_STRLEN, 128 KiB).
pub const INLINE_SCRIPT_MAX: usize = 96 * 1024;

/// The wrapper run as `bash -c WRAPPER belay <script-path> <validation> [<script>]`.
/// With a fourth argument the script is written to its path first.
const WRAPPER: &str = r#"set -u
p=$1; v=$2
if [ $# -ge 3 ]; then mkdir -p "${p%/*}" && printf '%s' "$3" > "$p" && chmod 0755 "$p" || exit 126; fi
t0=${EPOCHREALTIME:-}
bash "$p"; rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
t1=${EPOCHREALTIME:-}
printf '\n[belay] validation: %s\n' "$v" >&2
bash -c "$v"; rc=$?
t2=${EPOCHREALTIME:-}
if [ -n "$t0" ] && [ -n "$t2" ]; then
  s=$(( (${t1/[.,]/} - ${t0/[.,]/}) / 1000 )); w=$(( (${t2/[.,]/} - ${t1/[.,]/}) / 1000 ))
  printf '[belay] validation exit=%d script_s=%d.%03d validation_s=%d.%03d\n' "$rc" $((s/1000)) $((s%1000)) $((w/1000)) $((w%1000)) >&2
else
  printf '[belay] validation exit=%d\n' "$rc" >&2
fi
exit "$rc"
"#;

/// The argv of a folded exec. `inline` carries the script text (written by
/// the exec itself); `None` when it was uploaded to `script_path` already.
pub fn argv(script_path: &str, validation: &str, inline: Option<&str>) -> Vec<String> {
    let mut v = vec![
        "bash".to_string(),
        "-c".to_string(),
        WRAPPER.to_string(),
        "belay".to_string(),
        script_path.to_string(),
        validation.to_string(),
    ];
    if let Some(s) = inline {
        v.push(s.to_string());
    }
    v
}

/// How a folded exec ended, read from its last status line.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    /// The validation command's exit code.
    pub validation_exit: i64,
    /// Seconds of the script and of the validation, when the shell could
    /// tell (bash ≥ 5 has `EPOCHREALTIME`).
    pub split: Option<(f64, f64)>,
}

/// The status line of a folded exec from its stderr tail; `None` when the
/// validation never ran (the script failed, or the exec was killed).
pub fn parse_status(stderr_tail: &str) -> Option<Status> {
    let fields = stderr_tail
        .lines()
        .rev()
        .filter_map(|l| l.trim().strip_prefix(MARKER))
        .find(|rest| rest.starts_with(" exit="))?;
    let mut exit = None;
    let mut script_s = None;
    let mut validation_s = None;
    for field in fields.split_whitespace() {
        let (k, v) = field.split_once('=')?;
        match k {
            "exit" => exit = Some(v.parse::<i64>().ok()?),
            "script_s" => script_s = seconds(v),
            "validation_s" => validation_s = seconds(v),
            _ => return None,
        }
    }
    Some(Status {
        validation_exit: exit?,
        split: script_s.zip(validation_s),
    })
}

/// Whether the boundary line before the validation is in the tail (a
/// validation killed by the timeout prints no status line).
pub fn validation_started(stderr_tail: &str) -> bool {
    stderr_tail
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(MARKER))
        .any(|rest| rest.starts_with(": "))
}

/// A duration of the status line: the line is the block's output to read,
/// so only a plain number of seconds below a year counts.
fn seconds(v: &str) -> Option<f64> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && (0.0..MAX_SECONDS).contains(x))
}

const MAX_SECONDS: f64 = 365.0 * 86_400.0;

/// The status's split, when it fits in the exec's own measured `duration`
/// (a forged line, printed by a process the block left behind, does not).
pub fn plausible_split(status: &Status, duration: f64) -> Option<(f64, f64)> {
    status.split.filter(|(s, v)| s + v <= duration + 1.0)
}

/// The tail without belay's own lines, for failure summaries and records.
pub fn strip_status(tail: &str) -> String {
    let kept: Vec<&str> = tail
        .lines()
        .filter(|l| !l.trim_start().starts_with(MARKER))
        .collect();
    let mut s = kept.join("\n");
    while s.ends_with('\n') {
        s.pop();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_the_last_status_line() {
        let tail = "pip output\n[belay] validation: python -c 'import x'\nboom\n[belay] validation exit=1 script_s=2.500 validation_s=0.040\n";
        assert_eq!(
            parse_status(tail),
            Some(Status {
                validation_exit: 1,
                split: Some((2.5, 0.04))
            })
        );
        // A background process of the block may write after it.
        let later = format!("{tail}late output of a daemon\n");
        assert_eq!(parse_status(&later).map(|s| s.validation_exit), Some(1));
        assert_eq!(
            parse_status("[belay] validation exit=0\n"),
            Some(Status {
                validation_exit: 0,
                split: None
            })
        );
    }

    #[test]
    fn no_status_when_the_script_failed() {
        assert_eq!(parse_status("E: Unable to locate package foo\n"), None);
        // The boundary line alone is not a status.
        assert_eq!(parse_status("[belay] validation: true\n"), None);
        assert_eq!(parse_status("[belay] validation exit=x\n"), None);
        assert_eq!(parse_status("[belay] validation exit=0 rm=-rf\n"), None);
    }

    #[test]
    fn a_killed_validation_is_told_by_its_boundary_line() {
        assert!(validation_started(
            "built\n[belay] validation: pytest --collect-only\n"
        ));
        assert!(!validation_started("E: broken\n"));
        assert!(!validation_started("[belay] validation exit=0\n"));
    }

    /// What the block prints is untrusted: absurd durations are no split,
    /// and a split longer than the exec itself is not believed.
    #[test]
    fn forged_durations_are_not_taken() {
        let st = parse_status("[belay] validation exit=0 script_s=1e300 validation_s=0\n").unwrap();
        assert_eq!(st.split, None);
        let st = parse_status("[belay] validation exit=0 script_s=-3 validation_s=1\n").unwrap();
        assert_eq!(st.split, None);
        let st = parse_status("[belay] validation exit=0 script_s=900.000 validation_s=0.500\n")
            .unwrap();
        assert_eq!(plausible_split(&st, 2.0), None);
        assert_eq!(plausible_split(&st, 901.0), Some((900.0, 0.5)));
    }

    #[test]
    fn strips_belay_lines_from_tails() {
        let tail = "a\n[belay] validation: check\nb\n[belay] validation exit=1 script_s=0.001 validation_s=0.002\n";
        assert_eq!(strip_status(tail), "a\nb");
    }

    #[test]
    fn argv_writes_the_script_only_when_inline() {
        let a = argv("/belay/scripts/b.sh", "true", None);
        assert_eq!(a.len(), 6);
        assert_eq!(a[4], "/belay/scripts/b.sh");
        let b = argv("/belay/scripts/b.sh", "true", Some("echo hi\n"));
        assert_eq!(b.last().map(String::as_str), Some("echo hi\n"));
    }

    /// The wrapper, run by the host's bash: the script's failure gives no
    /// status, a validation's failure gives its code, and both outputs reach
    /// the log in order.
    #[test]
    fn the_wrapper_runs_in_bash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scripts/b.sh");
        let path = path.to_str().unwrap();
        let run = |script: &str, validation: &str| {
            let out = std::process::Command::new("bash")
                .args(&argv(path, validation, Some(script))[1..])
                .output()
                .unwrap();
            (
                out.status.code().unwrap(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let (code, out, err) = run("echo built\n", "echo checked; exit 3");
        assert_eq!(code, 3);
        assert_eq!(out, "built\nchecked\n");
        let st = parse_status(&err).unwrap();
        assert_eq!(st.validation_exit, 3);
        let (s, v) = st.split.unwrap();
        assert!((0.0..5.0).contains(&s) && (0.0..5.0).contains(&v), "{err}");
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            "echo built\n",
            "the script is kept where checkpoints keep it"
        );

        let (code, out, err) = run("echo partial; exit 7\n", "echo never");
        assert_eq!(code, 7);
        assert_eq!(out, "partial\n");
        assert_eq!(parse_status(&err), None, "{err}");

        let (code, _, err) = run("true\n", "true");
        assert_eq!(code, 0);
        assert_eq!(parse_status(&err).unwrap().validation_exit, 0);
    }

    proptest! {
        #[test]
        fn parse_status_never_panics(s in ".{0,200}") {
            let _ = parse_status(&s);
            let _ = strip_status(&s);
        }

        #[test]
        fn parse_status_reads_what_the_wrapper_prints(rc in 0i64..256, a in 0u32..100_000, b in 0u32..100_000) {
            let line = format!("[belay] validation exit={rc} script_s={}.{:03} validation_s={}.{:03}\n", a / 1000, a % 1000, b / 1000, b % 1000);
            let st = parse_status(&line).unwrap();
            prop_assert_eq!(st.validation_exit, rc);
            let (s, v) = st.split.unwrap();
            prop_assert!((s - f64::from(a) / 1000.0).abs() < 1e-9);
            prop_assert!((v - f64::from(b) / 1000.0).abs() < 1e-9);
        }
    }
}
