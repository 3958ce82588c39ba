//! `[schedule]` and a phase's `schedule`: from the raw table to a checked
//! [`Schedule`] (the windows themselves are in [`crate::schedule`]).

use jiff::tz::TimeZone;

use super::raw::RawSchedule;
use super::Src;
use crate::schedule::{covers, parse_window, Schedule, Window};
use crate::RoundsError;

impl Schedule {
    pub(crate) fn resolve(src: &Src<'_>, raw: &RawSchedule) -> Result<Schedule, RoundsError> {
        let (tz, tz_name) = match &raw.timezone {
            None => (TimeZone::system(), "local".to_string()),
            Some(n) => (
                TimeZone::get(n.get_ref()).map_err(|e| {
                    src.err(
                        n.span(),
                        format!(
                            "timezone `{}` is not an IANA zone ({e}); e.g. \"Europe/Berlin\"",
                            n.get_ref()
                        ),
                    )
                })?,
                n.get_ref().clone(),
            ),
        };
        let parse = |ws: &[toml::Spanned<String>]| -> Result<Vec<Window>, RoundsError> {
            ws.iter()
                .map(|w| parse_window(w.get_ref()).map_err(|e| src.err(w.span(), e)))
                .collect()
        };
        let s = Schedule {
            tz,
            tz_name,
            run: parse(&raw.run_windows)?,
            pause: parse(&raw.pause_windows)?,
        };
        // The peer's phase_window_overlap check: a pause window that covers
        // every run window leaves no time to run.
        if !s.run.is_empty() && s.run.iter().all(|r| s.pause.iter().any(|p| covers(p, r))) {
            return Err(src.err_file(
                "[schedule] pause_windows cover every run window: no round could ever start",
            ));
        }
        Ok(s)
    }
}
