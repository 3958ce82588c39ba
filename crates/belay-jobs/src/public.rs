//! What leaves belay for chat and HTTP: ids and a short reason, never a
//! host path. The queue, the state directory and the repositories'
//! checkouts are the owner's business; a reply (to a third party too, and
//! over a channel the owner does not control) does not show where they are.

use std::borrow::Cow;

/// Whether a `/` after `prev` starts a path (at the start, after a space or
/// an opening quote or bracket), not one inside a word or a URL.
fn starts_path(prev: Option<char>) -> bool {
    match prev {
        None => true,
        Some(c) => c.is_whitespace() || "\"'`([{<=,;".contains(c),
    }
}

/// Whether `c` ends a path in running text.
fn ends_path(c: char) -> bool {
    c.is_whitespace() || "\"'`)]}>,;:".contains(c)
}

/// `text` with every absolute path of two or more names (`/srv/site`,
/// `/var/lib/belay/jobs/claims/x.lock`) replaced by `<path>`. A command
/// (`/accept`), a relative path and a URL stay as they are.
pub fn without_paths(text: &str) -> Cow<'_, str> {
    let mut out = String::new();
    let mut copied = 0;
    let mut prev: Option<char> = None;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '/' && starts_path(prev) {
            let end = text[i..].find(ends_path).map_or(text.len(), |n| i + n);
            // The token starts with its one-byte `/`.
            if text[i + 1..end].contains('/') {
                out.push_str(&text[copied..i]);
                out.push_str("<path>");
                copied = end;
                while chars.peek().is_some_and(|(j, _)| *j < end) {
                    chars.next();
                }
                prev = Some('>');
                continue;
            }
        }
        prev = Some(c);
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::without_paths;

    #[test]
    fn host_paths_go_and_commands_ids_and_urls_stay() {
        for (text, want) in [
            (
                "cannot open lock file /q/jobs/claims/../x.lock: No such file",
                "cannot open lock file <path>: No such file",
            ),
            (
                "the repository `/srv/site` (at /srv/site/.git) is busy",
                "the repository `<path>` (at <path>) is busy",
            ),
            (
                "/accept j1 (/annehmen) starts it",
                "/accept j1 (/annehmen) starts it",
            ),
            (
                "job \"../../x\" is not a valid id",
                "job \"../../x\" is not a valid id",
            ),
            (
                "see http://127.0.0.1:8470/jobs/a",
                "see http://127.0.0.1:8470/jobs/a",
            ),
            ("/tmp/x", "<path>"),
            ("origin/main and inbox/", "origin/main and inbox/"),
        ] {
            assert_eq!(without_paths(text), want, "{text}");
        }
        assert!(matches!(
            without_paths("nothing here"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
