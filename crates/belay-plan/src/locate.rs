//! Where a value is in JSON text: the line and column of the value a path
//! (`checkpoints[1].exit_criteria`) names, for errors found after parsing
//! (serde_json keeps no spans). A small scanner that walks only as far as
//! the path leads.

/// One step of a path into the JSON document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// The 1-based line and column where the value at `path` starts in `text`
/// (the start of the document when it cannot be found).
pub fn locate(text: &str, path: &[Seg]) -> (usize, usize) {
    let offset = Locator {
        b: text.as_bytes(),
        i: 0,
    }
    .find(path)
    .unwrap_or(0);
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}

/// A small scanner over JSON text that walks to one value by its path.
struct Locator<'a> {
    b: &'a [u8],
    i: usize,
}

impl Locator<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn string(&mut self) -> Option<String> {
        let start = self.i;
        if self.b.get(self.i) != Some(&b'"') {
            return None;
        }
        self.i += 1;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return serde_json::from_slice(&self.b[start..self.i]).ok();
                }
                _ => self.i += 1,
            }
        }
        None
    }

    fn skip(&mut self) -> Option<()> {
        self.ws();
        match self.b.get(self.i)? {
            b'"' => self.string().map(|_| ()),
            b'{' | b'[' => {
                let mut depth = 0usize;
                while self.i < self.b.len() {
                    match self.b[self.i] {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
                None
            }
            _ => {
                while self.i < self.b.len() && !b",}] \t\r\n".contains(&self.b[self.i]) {
                    self.i += 1;
                }
                Some(())
            }
        }
    }

    fn find(&mut self, path: &[Seg]) -> Option<usize> {
        self.ws();
        let Some((first, rest)) = path.split_first() else {
            return Some(self.i);
        };
        match (first, self.b.get(self.i)?) {
            (Seg::Key(k), b'{') => {
                self.i += 1;
                loop {
                    self.ws();
                    if self.b.get(self.i)? == &b'}' {
                        return None;
                    }
                    let name = self.string()?;
                    self.ws();
                    if self.b.get(self.i)? != &b':' {
                        return None;
                    }
                    self.i += 1;
                    if &name == k {
                        return self.find(rest);
                    }
                    self.skip()?;
                    self.ws();
                    if self.b.get(self.i)? == &b',' {
                        self.i += 1;
                    }
                }
            }
            (Seg::Index(n), b'[') => {
                self.i += 1;
                for _ in 0..*n {
                    self.skip()?;
                    self.ws();
                    if self.b.get(self.i)? != &b',' {
                        return None;
                    }
                    self.i += 1;
                }
                self.find(rest)
            }
            _ => None,
        }
    }
}
