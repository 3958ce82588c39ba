//! Verdicts from artifacts: the last decision-bearing `VERDICT:` line wins.

use crate::schema::Verdicts;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Unverifiable,
    /// Missing, conflicting or unknown: counts as a retry.
    Retry,
}

fn normalise(s: &str) -> String {
    s.trim()
        .trim_matches(|c: char| {
            c == '*'
                || c == '_'
                || c == '`'
                || c == '#'
                || c == '>'
                || c == ':'
                || c.is_whitespace()
        })
        .to_ascii_uppercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Read the verdict of an artifact. Markdown decoration (`**VERDICT:** PASS`,
/// `## Verdict: pass`, `> VERDICT: PASS`) is tolerated. The last line that
/// names a known verdict decides; a last line with an unknown value, several
/// known values on one line, or no verdict at all gives [`Verdict::Retry`].
pub fn read(text: &str, v: &Verdicts) -> (Verdict, String) {
    let pass = normalise(&v.pass);
    let fail = normalise(&v.fail);
    let unver = v.unverifiable.as_deref().map(normalise);
    let mut last: Option<(Verdict, String)> = None;
    for line in text.lines() {
        let clean: String = line.replace(['*', '_', '`'], "");
        let upper = clean.to_ascii_uppercase();
        let Some(i) = upper.find("VERDICT") else {
            continue;
        };
        let rest = &upper[i + "VERDICT".len()..];
        let Some(rest) = rest.trim_start().strip_prefix(':') else {
            continue;
        };
        let value = normalise(rest);
        let hits = [(&pass, Verdict::Pass), (&fail, Verdict::Fail)]
            .into_iter()
            .chain(unver.as_ref().map(|u| (u, Verdict::Unverifiable)))
            .filter(|(k, _)| value == **k)
            .map(|(_, v)| v)
            .collect::<Vec<_>>();
        let decided = match hits.as_slice() {
            [one] => *one,
            _ => {
                // Both outcomes on one line ("APPROVED / NEEDS CHANGES") is a
                // conflict; an unknown word is not a decision at all.
                if value.contains(&pass) && value.contains(&fail) {
                    last = Some((
                        Verdict::Retry,
                        format!("conflicting verdict line: {}", line.trim()),
                    ));
                }
                continue;
            }
        };
        last = Some((decided, line.trim().to_string()));
    }
    last.unwrap_or((
        Verdict::Retry,
        "no `VERDICT:` line with a known value".into(),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn review() -> Verdicts {
        Verdicts {
            pass: "APPROVED".into(),
            fail: "NEEDS CHANGES".into(),
            unverifiable: None,
        }
    }

    fn qa() -> Verdicts {
        Verdicts {
            pass: "PASS".into(),
            fail: "FAIL".into(),
            unverifiable: Some("UNVERIFIABLE".into()),
        }
    }

    #[test]
    fn the_last_decision_wins_and_decoration_is_tolerated() {
        let t = "# Review\nVERDICT: NEEDS CHANGES\n...fixed...\n**VERDICT:** APPROVED\n";
        assert_eq!(read(t, &review()).0, Verdict::Pass);
        assert_eq!(
            read("## Verdict: needs changes", &review()).0,
            Verdict::Fail
        );
        assert_eq!(read("> `VERDICT: PASS`", &qa()).0, Verdict::Pass);
        assert_eq!(
            read("VERDICT: UNVERIFIABLE", &qa()).0,
            Verdict::Unverifiable
        );
    }

    #[test]
    fn missing_unknown_and_conflicting_verdicts_retry() {
        assert_eq!(read("looks fine to me", &review()).0, Verdict::Retry);
        assert_eq!(read("VERDICT: MAYBE", &review()).0, Verdict::Retry);
        assert_eq!(
            read(
                "VERDICT: APPROVED\nVERDICT: APPROVED / NEEDS CHANGES",
                &review()
            )
            .0,
            Verdict::Retry
        );
        // An instruction echo before the decision does not count.
        assert_eq!(
            read(
                "Write VERDICT: <APPROVED|NEEDS CHANGES>\nVERDICT: APPROVED",
                &review()
            )
            .0,
            Verdict::Pass
        );
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,300}") {
            let _ = read(&s, &qa());
        }
    }
}
