//! `[schedule]`: run and pause windows, `[WEEKDAYS ]HH:MM-HH:MM` in a time
//! zone (`mon-fri 09:00-18:00`, `sat,sun 00:00-24:00`, `22:00-06:00` across
//! midnight). A round starts only inside a run window (when there are any)
//! and outside every pause window.

use jiff::tz::TimeZone;
use jiff::Timestamp;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Monday first.
    pub days: [bool; 7],
    /// Minutes after midnight; `end` may be below `start` (across midnight).
    pub start: u32,
    pub end: u32,
    pub text: String,
}

#[derive(Debug, Clone)]
pub struct Schedule {
    pub tz: TimeZone,
    pub tz_name: String,
    pub run: Vec<Window>,
    pub pause: Vec<Window>,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            tz: TimeZone::system(),
            tz_name: "local".into(),
            run: Vec::new(),
            pause: Vec::new(),
        }
    }
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

fn day(s: &str) -> Option<usize> {
    let s = s.to_ascii_lowercase();
    DAYS.iter().position(|d| s.starts_with(d) && s.len() <= 9)
}

fn hhmm(s: &str) -> Option<u32> {
    let (h, m) = s.split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60 || h == 24 && m == 0).then_some(h * 60 + m)
}

/// Parse one window; the error says what is accepted.
pub fn parse_window(text: &str) -> Result<Window, String> {
    let bad = |why: &str| {
        format!(
            "window `{text}`: {why} (write `[WEEKDAYS ]HH:MM-HH:MM`, e.g. `mon-fri 09:00-18:00`)"
        )
    };
    let t = text.trim();
    let (days_part, times) = match t.rsplit_once(' ') {
        Some((d, tm)) => (Some(d.trim()), tm),
        None => (None, t),
    };
    let (a, b) = times
        .split_once('-')
        .ok_or_else(|| bad("no `-` between the times"))?;
    let (start, end) = (
        hhmm(a).ok_or_else(|| bad("the start is not HH:MM"))?,
        hhmm(b).ok_or_else(|| bad("the end is not HH:MM"))?,
    );
    if start == end {
        return Err(bad("the window is empty"));
    }
    let mut days = [days_part.is_none(); 7];
    if let Some(d) = days_part {
        for part in d.split(',') {
            let part = part.trim();
            match part.split_once('-') {
                Some((x, y)) => {
                    let (x, y) = (
                        day(x).ok_or_else(|| bad("unknown weekday"))?,
                        day(y).ok_or_else(|| bad("unknown weekday"))?,
                    );
                    let mut i = x;
                    loop {
                        days[i] = true;
                        if i == y {
                            break;
                        }
                        i = (i + 1) % 7;
                    }
                }
                None => days[day(part).ok_or_else(|| bad("unknown weekday"))?] = true,
            }
        }
    }
    Ok(Window {
        days,
        start,
        end,
        text: t.to_string(),
    })
}

impl Window {
    /// Whether the local time (weekday Monday = 0, minute of day) is inside.
    fn contains(&self, wd: usize, minute: u32) -> bool {
        if self.start < self.end {
            self.days[wd] && (self.start..self.end).contains(&minute)
        } else {
            // Across midnight: the evening of a listed day, or the morning after.
            (self.days[wd] && minute >= self.start)
                || (self.days[(wd + 6) % 7] && minute < self.end)
        }
    }
}

/// Why the schedule keeps a round from starting now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Closed {
    #[error("inside pause window `{window}` ({tz})")]
    Paused { window: String, tz: String },
    #[error("outside every run window ({tz})")]
    OutsideRun { tz: String },
}

impl belay_record::Classify for Closed {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Failed
    }
}

impl Schedule {
    fn local(&self, at: Timestamp) -> (usize, u32) {
        let z = at.to_zoned(self.tz.clone());
        let wd = z.weekday().to_monday_zero_offset() as usize;
        (wd, z.hour() as u32 * 60 + z.minute() as u32)
    }

    /// Whether a round may start at `at`, and if not, which window says so.
    pub fn check(&self, at: Timestamp) -> Result<(), Closed> {
        let (wd, m) = self.local(at);
        if let Some(p) = self.pause.iter().find(|p| p.contains(wd, m)) {
            return Err(Closed::Paused {
                window: p.text.clone(),
                tz: self.tz_name.clone(),
            });
        }
        if !self.run.is_empty() && !self.run.iter().any(|r| r.contains(wd, m)) {
            return Err(Closed::OutsideRun {
                tz: self.tz_name.clone(),
            });
        }
        Ok(())
    }

    /// The next minute at which a round may start (within a week).
    pub fn next_open(&self, at: Timestamp) -> Option<Timestamp> {
        let mut t = at;
        for _ in 0..(7 * 24 * 60 + 1) {
            if self.check(t).is_ok() {
                return Some(t);
            }
            t = t.checked_add(jiff::SignedDuration::from_secs(60)).ok()?;
            // Align to the minute after the first step.
            let secs = t.as_second() - t.as_second().rem_euclid(60);
            t = Timestamp::from_second(secs).ok()?;
        }
        None
    }

    pub fn is_empty(&self) -> bool {
        self.run.is_empty() && self.pause.is_empty()
    }
}

/// Whether `outer` holds every minute of `inner` (a pause over a run window).
pub(crate) fn covers(outer: &Window, inner: &Window) -> bool {
    (0..7).all(|d| (0..1440).all(|m| !inner.contains(d, m) || outer.contains(d, m)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn weekdays_ranges_and_midnight() {
        let w = parse_window("mon-fri 09:00-18:00").unwrap();
        assert!(w.contains(0, 9 * 60));
        assert!(!w.contains(0, 18 * 60));
        assert!(!w.contains(5, 10 * 60));
        let n = parse_window("22:00-06:00").unwrap();
        assert!(n.contains(3, 23 * 60) && n.contains(3, 5 * 60) && !n.contains(3, 12 * 60));
        let wrap = parse_window("fri-mon 10:00-11:00").unwrap();
        assert_eq!(wrap.days, [true, false, false, false, true, true, true]);
        let all = parse_window("sat,sun 00:00-24:00").unwrap();
        assert!(all.contains(6, 1439) && !all.contains(0, 0));
        for bad in [
            "9-17",
            "mon 09:00",
            "xyz 09:00-10:00",
            "10:00-10:00",
            "25:00-26:00",
        ] {
            assert!(parse_window(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_schedule_in_a_zone_opens_at_the_window() {
        let s = Schedule {
            tz: TimeZone::get("Europe/Berlin").unwrap(),
            tz_name: "Europe/Berlin".into(),
            run: vec![parse_window("mon-fri 09:00-18:00").unwrap()],
            pause: vec![parse_window("12:00-13:00").unwrap()],
        };
        // 2026-12-01 is a Tuesday; 07:30 UTC is 08:30 in Berlin.
        let t: Timestamp = "2026-12-01T07:30:00Z".parse().unwrap();
        assert!(matches!(s.check(t), Err(Closed::OutsideRun { .. })));
        let open = s.next_open(t).unwrap();
        assert_eq!(open.to_string(), "2026-12-01T08:00:00Z");
        let noon: Timestamp = "2026-12-01T11:30:00Z".parse().unwrap();
        assert!(
            matches!(s.check(noon), Err(Closed::Paused { window, .. }) if window == "12:00-13:00")
        );
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_accepted_windows_are_bounded(s in "\\PC{0,40}") {
            if let Ok(w) = parse_window(&s) {
                prop_assert!(w.start <= 1440 && w.end <= 1440 && w.days.iter().any(|d| *d));
            }
        }
    }
}
