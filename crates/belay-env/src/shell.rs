//! Reading shell text as the shell would, far enough for the repair safety
//! filter and for finding the programs a project's scripts run: quotes,
//! escapes, comments, here-documents, the separators between simple
//! commands, and the word that is a command's program.

/// A command's text three ways, each byte at the same offset in all three:
/// as written; `clean`, with comments and here-document bodies blanked
/// (they run nothing); and `masked`, `clean` with the shell's operators
/// inside quotes made `_` (what is quoted is an argument).
pub(crate) struct Text {
    pub clean: String,
    pub masked: String,
}

impl Text {
    pub fn read(cmd: &str) -> Self {
        let (clean, masked) = blank_and_mask(cmd);
        Self { clean, masked }
    }

    /// The simple commands, in order: each with the separator that opened
    /// it (`None` for the first), its words (quotes removed, from `clean`)
    /// and its `masked` text (for redirections).
    pub fn commands(&self) -> Vec<Command> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut opened_by = None;
        let bytes = self.masked.as_bytes();
        let blank_at = |j: Option<usize>| {
            j.and_then(|j| bytes.get(j))
                .is_none_or(|b| b.is_ascii_whitespace() || b";&|()".contains(b))
        };
        for (i, c) in self.masked.char_indices() {
            // A brace groups commands only as a word of its own: `{ a; }`,
            // not `{}` (find's, xargs's) or `${VAR}`.
            let before = i.checked_sub(1).and_then(|j| bytes.get(j)).copied();
            let separates = match c {
                '{' => blank_at(Some(i + 1)),
                // `>|`, `>&2`, `<&0`, `&>f` redirect; they separate nothing.
                '|' => before != Some(b'>'),
                '&' => !matches!(before, Some(b'>' | b'<')) && bytes.get(i + 1) != Some(&b'>'),
                '}' => blank_at(i.checked_sub(1)) && blank_at(Some(i + 1)),
                _ => SEPARATORS.contains(&c),
            };
            if separates {
                out.push(Command::new(
                    &self.clean[start..i],
                    &self.masked[start..i],
                    opened_by,
                ));
                opened_by = Some(c);
                start = i + c.len_utf8();
            }
        }
        out.push(Command::new(
            &self.clean[start..],
            &self.masked[start..],
            opened_by,
        ));
        out
    }
}

const SEPARATORS: [char; 8] = ['\n', ';', '&', '|', '(', ')', '{', '}'];

pub(crate) struct Command {
    pub words: Vec<String>,
    /// The text without comments (operators in quotes kept).
    pub clean: String,
    /// The same with operators in quotes masked: redirections are found
    /// here, and read from `clean` at the same offsets.
    pub masked: String,
    pub opened_by: Option<char>,
}

impl Command {
    fn new(clean: &str, masked: &str, opened_by: Option<char>) -> Self {
        let split = shlex::split(clean)
            .unwrap_or_else(|| clean.split_whitespace().map(str::to_string).collect());
        Self {
            words: without_redirections(split),
            clean: clean.to_string(),
            masked: masked.to_string(),
            opened_by,
        }
    }

    /// Where the program word is, past what runs a program for it
    /// (`sudo -E`, `env A=1`, `A=1`, `command`, `exec`, `nice -n 5`,
    /// `nohup`, `timeout 60`, `xargs -0`), and its name without a directory
    /// or a leading `\` (`/bin/cp`, `\rm`).
    pub fn program(&self) -> Option<(usize, String)> {
        let w = &self.words;
        let mut i = 0;
        while let Some(word) = w.get(i) {
            let name = program_name(word);
            if is_assignment(word) {
                i += 1;
                continue;
            }
            // `command -v X` looks X up; it runs nothing.
            if name == "command" && w.get(i + 1).is_some_and(|o| o == "-v" || o == "-V") {
                return Some((i, name));
            }
            let takes: &[&str] = match name.as_str() {
                "sudo" => &["-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"],
                "env" => &["-u", "-C", "-S"],
                "nice" => &["-n"],
                "timeout" => &["-s", "-k"],
                "xargs" => &["-I", "-a", "-d", "-E", "-L", "-n", "-P", "-s"],
                "command" | "exec" | "nohup" | "stdbuf" | "time" | "if" | "then" | "else"
                | "elif" | "do" | "while" | "until" | "!" => &[],
                _ => return Some((i, name)),
            };
            i += 1;
            while let Some(opt) = w.get(i).filter(|o| o.starts_with('-') && o.len() > 1) {
                i += if takes.contains(&opt.as_str()) { 2 } else { 1 };
            }
            if name == "timeout" {
                i += 1; // the duration
            }
        }
        None
    }
}

/// The words without redirections (`> f`, `2>&1`, `<f`, `<<EOF`): what
/// the program gets as its arguments. (The filter reads the redirections'
/// targets from the masked text.)
fn without_redirections(words: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(words.len());
    let mut skip_next = false;
    for w in words {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        let op = w.trim_start_matches(|c: char| c.is_ascii_digit());
        let rest = [
            "&>>", "&>", ">>", ">|", ">&", "<<<", "<<-", "<<", "<&", ">", "<",
        ]
        .iter()
        .find_map(|o| op.strip_prefix(o));
        match rest {
            Some("") => skip_next = true,
            Some(_) => {}
            None => out.push(w),
        }
    }
    out
}

/// Whether `word` is a variable assignment (`A=1`, `NODE_ENV=test`), not
/// a program or an argument.
pub(crate) fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// A program word's name: its last path part, without a leading `\`.
pub(crate) fn program_name(word: &str) -> String {
    word.rsplit('/')
        .next()
        .unwrap_or(word)
        .trim_start_matches('\\')
        .to_string()
}

/// The text with comments and here-document bodies blanked, and that text
/// with operators inside quotes masked; both the length of `cmd`.
fn blank_and_mask(cmd: &str) -> (String, String) {
    let chars: Vec<char> = cmd.chars().collect();
    let mut clean = String::with_capacity(cmd.len());
    let mut masked = String::with_capacity(cmd.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    // Here-documents opened on this line: their delimiters, and whether
    // leading tabs are stripped (`<<-`).
    let mut pending: Vec<(String, bool)> = Vec::new();
    let mut i = 0;
    let blank = |c: char, out: &mut String| out.extend(std::iter::repeat_n(' ', c.len_utf8()));
    while i < chars.len() {
        let c = chars[i];
        if std::mem::take(&mut escaped) {
            clean.push(c);
            masked.push(c);
            i += 1;
            continue;
        }
        // A backslash before a newline joins the lines (outside single
        // quotes): one command goes on.
        if c == '\\' && quote != Some('\'') && chars.get(i + 1) == Some(&'\n') {
            clean.push_str("  ");
            masked.push_str("  ");
            i += 2;
            continue;
        }
        match (quote, c) {
            (None | Some('"'), '\\') => escaped = true,
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            // A comment starts a word: not `${#x}`, not `a#b`.
            (None, '#')
                if i == 0
                    || matches!(
                        chars[i - 1],
                        ' ' | '\t' | '\n' | ';' | '&' | '|' | '(' | ')'
                    ) =>
            {
                // A comment, to the end of its line.
                while i < chars.len() && chars[i] != '\n' {
                    blank(chars[i], &mut clean);
                    blank(chars[i], &mut masked);
                    i += 1;
                }
                continue;
            }
            // `<<` opens a here-document; `<<<` (a here-string) does not.
            (None, '<')
                if chars.get(i + 1) == Some(&'<')
                    && chars.get(i + 2) != Some(&'<')
                    && (i == 0 || chars[i - 1] != '<') =>
            {
                if let Some((delim, strip, len)) = heredoc_delimiter(&chars[i + 2..]) {
                    pending.push((delim, strip));
                    for &d in &chars[i..i + 2 + len] {
                        clean.push(d);
                        masked.push(d);
                    }
                    i += 2 + len;
                    continue;
                }
            }
            (None, '\n') if !pending.is_empty() => {
                clean.push(c);
                masked.push(c);
                i += 1;
                // The bodies, one after the other, each to its delimiter line.
                for (delim, strip) in std::mem::take(&mut pending) {
                    loop {
                        let end = chars[i..]
                            .iter()
                            .position(|&x| x == '\n')
                            .map_or(chars.len(), |n| i + n);
                        let line: String = chars[i..end].iter().collect();
                        let line = if strip {
                            line.trim_start_matches('\t')
                        } else {
                            line.as_str()
                        };
                        let last = line == delim || end == chars.len();
                        for &x in &chars[i..end] {
                            blank(x, &mut clean);
                            blank(x, &mut masked);
                        }
                        i = end;
                        if i < chars.len() {
                            clean.push('\n');
                            masked.push('\n');
                            i += 1;
                        }
                        if last {
                            break;
                        }
                    }
                }
                continue;
            }
            (Some(_), '>' | '<' | '|' | '&' | ';' | '(' | ')' | '{' | '}' | '\n') => {
                clean.push(c);
                masked.push('_');
                i += 1;
                continue;
            }
            _ => {}
        }
        clean.push(c);
        masked.push(c);
        i += 1;
    }
    (clean, masked)
}

/// After `<<`: `-`, blanks, and a word, quoted or not. The delimiter, whether
/// tabs are stripped, and how many characters that took.
fn heredoc_delimiter(rest: &[char]) -> Option<(String, bool, usize)> {
    let mut n = 0;
    let strip = rest.first() == Some(&'-');
    if strip {
        n += 1;
    }
    while rest.get(n).is_some_and(|c| *c == ' ' || *c == '\t') {
        n += 1;
    }
    let mut delim = String::new();
    while let Some(&c) = rest.get(n) {
        if c.is_whitespace() || matches!(c, ';' | '&' | '|' | '<' | '>' | '(' | ')') {
            break;
        }
        if !matches!(c, '\'' | '"' | '\\') {
            delim.push(c);
        }
        n += 1;
    }
    // `$(( x << 1 ))` shifts: a number is no delimiter.
    let number = delim.chars().all(|c| c.is_ascii_digit() || c == '$');
    (!delim.is_empty() && !number).then_some((delim, strip, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(cmd: &str) -> Vec<Vec<String>> {
        Text::read(cmd)
            .commands()
            .into_iter()
            .map(|c| c.words)
            .filter(|w| !w.is_empty())
            .collect()
    }

    #[test]
    fn comments_and_here_documents_run_nothing() {
        assert_eq!(words("# don't\nrm -rf src"), [["rm", "-rf", "src"]]);
        assert_eq!(words("echo a#b # c > d"), [["echo", "a#b"]]);
        let doc = "cat > /tmp/c.txt <<'EOF'\nsetuptools>=40,<70\n# it's\nEOF\necho done";
        assert_eq!(words(doc), [vec!["cat"], vec!["echo", "done"]]);
        assert_eq!(words("cp a b > /tmp/log 2>&1"), [["cp", "a", "b"]]);
        let t = Text::read(doc);
        assert_eq!(t.clean.len(), doc.len());
        assert_eq!(t.masked.len(), doc.len());
        let tabs = "cat <<-END >/tmp/x\n\tline > y\n\tEND\nls";
        assert_eq!(words(tabs).last().unwrap(), &["ls"]);
        // A here-string, a shift and `${#x}` open nothing.
        let last = |cmd: &str| words(cmd).last().cloned().unwrap();
        assert_eq!(
            last("read -r v <<< \"$x\"\nrm -rf src"),
            ["rm", "-rf", "src"]
        );
        assert_eq!(last("v=$(( 2 << 1 ))\nrm -rf src"), ["rm", "-rf", "src"]);
        assert_eq!(last("echo ${#PATH}; rm -rf src"), ["rm", "-rf", "src"]);
        // A continued line is one command.
        assert_eq!(
            words("cp /tmp/p.py \\\n  src/app.py"),
            [["cp", "/tmp/p.py", "src/app.py"]]
        );
        // An operator inside quotes is part of an argument.
        let t = Text::read("echo 'a > b; c' > f");
        assert_eq!(t.masked, "echo 'a _ b_ c' > f");
    }

    #[test]
    fn the_program_is_past_what_runs_it() {
        let prog = |cmd: &str| Text::read(cmd).commands()[0].program().map(|(_, n)| n);
        assert_eq!(prog("sudo -E rm -rf src").as_deref(), Some("rm"));
        assert_eq!(prog("env LC_ALL=C /bin/cp a b").as_deref(), Some("cp"));
        assert_eq!(prog("A=1 B=2 \\rm x").as_deref(), Some("rm"));
        assert_eq!(
            prog("timeout -s KILL 60 nice -n 5 sed -i x y").as_deref(),
            Some("sed")
        );
        assert_eq!(prog("xargs -I {} cp {} /x").as_deref(), Some("cp"));
        assert_eq!(prog("sudo -u root tee f").as_deref(), Some("tee"));
        assert_eq!(prog("A=1").as_deref(), None);
    }
}
