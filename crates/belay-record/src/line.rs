//! Byte offsets to `line:column`, for errors that point into a file (a config, a job, a plan),
//! and text made safe to print on a terminal.

use std::borrow::Cow;
use std::fmt::Write;

/// The 1-based line and column (in characters) of byte `offset` of `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit_once('\n')
        .map_or(before, |(_, l)| l)
        .chars()
        .count()
        + 1;
    (line, col)
}

/// Untrusted text (a step's output, an agent's message, a request body) made
/// safe for a terminal: every control character but `'\n'` and `'\t'` (the
/// C0 controls with ESC and CR, DEL, and the C1 controls U+0080–U+009F) is
/// shown as a visible escape (`\x1b`, `\r`, `\u{9b}`), so that no escape
/// sequence reaches the terminal (OSC 52 setting the clipboard, CSI moving the
/// cursor or erasing the screen, CR overwriting the line). All other text,
/// non-ASCII letters included, is left as it is; text with nothing to escape
/// is borrowed.
pub fn printable(s: &str) -> Cow<'_, str> {
    escape_controls(s, false)
}

/// [`printable`] for a one-line notice: `'\n'` is escaped too (as `\n`).
pub fn printable_line(s: &str) -> Cow<'_, str> {
    escape_controls(s, true)
}

fn escape_controls(s: &str, newline: bool) -> Cow<'_, str> {
    let escaped = |c: char| c.is_control() && c != '\t' && (newline || c != '\n');
    let Some(first) = s.find(escaped) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 8);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        if !escaped(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if c.is_ascii() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::{printable, printable_line};
    use std::borrow::Cow;

    #[test]
    fn osc_52_cannot_set_the_clipboard() {
        let osc = "ok\x1b]52;c;ZWNobyBwd25lZA==\x07 done";
        assert_eq!(printable(osc), "ok\\x1b]52;c;ZWNobyBwd25lZA==\\x07 done");
        // The string terminator form (ESC backslash) too.
        assert_eq!(printable("\x1b]52;c;eA==\x1b\\"), "\\x1b]52;c;eA==\\x1b\\");
    }

    #[test]
    fn csi_cursor_moves_and_erases_are_shown() {
        assert_eq!(
            printable("a\x1b[2J\x1b[1;1Hb\x1b[K"),
            "a\\x1b[2J\\x1b[1;1Hb\\x1b[K"
        );
        // The 8-bit CSI (a C1 control) and DEL.
        assert_eq!(printable("a\u{9b}2Jb\x7f"), "a\\u{9b}2Jb\\x7f");
        assert_eq!(printable("\u{80}\u{9f}"), "\\u{80}\\u{9f}");
    }

    #[test]
    fn cr_cannot_overwrite_the_line() {
        assert_eq!(printable("PASS\rFAIL"), "PASS\\rFAIL");
        assert_eq!(printable("a\0b\x08c"), "a\\0b\\x08c");
    }

    #[test]
    fn newlines_and_tabs_stay_unless_one_line_is_asked() {
        assert_eq!(printable("a\n\tb"), "a\n\tb");
        assert_eq!(printable_line("a\n\tb\r\n"), "a\\n\tb\\r\\n");
    }

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for s in [
            "",
            "plain ascii",
            "Grüße, 日本語, émoji 🦀 — ok…",
            "tab\there",
        ] {
            assert!(matches!(printable(s), Cow::Borrowed(b) if b == s));
            assert!(matches!(printable_line(s), Cow::Borrowed(b) if b == s));
        }
        assert!(matches!(printable("two\nlines"), Cow::Borrowed(_)));
        // A multi-byte letter next to an escape is kept whole.
        assert_eq!(printable("é\x1bü"), "é\\x1bü");
    }

    #[test]
    fn lines_and_columns_count_from_one() {
        assert_eq!(super::line_col("a\nbc\nd", 0), (1, 1));
        assert_eq!(super::line_col("a\nbc\nd", 3), (2, 2));
        assert_eq!(super::line_col("a\nbc\nd", 5), (3, 1));
        assert_eq!(super::line_col("é\nx", 3), (2, 1));
        assert_eq!(super::line_col("ab", 99), (1, 3));
    }
}
