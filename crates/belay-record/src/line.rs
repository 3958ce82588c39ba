//! Byte offsets to `line:column`, for errors that point into a file (a config, a job, a plan).

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

#[cfg(test)]
mod tests {
    #[test]
    fn lines_and_columns_count_from_one() {
        assert_eq!(super::line_col("a\nbc\nd", 0), (1, 1));
        assert_eq!(super::line_col("a\nbc\nd", 3), (2, 2));
        assert_eq!(super::line_col("a\nbc\nd", 5), (3, 1));
        assert_eq!(super::line_col("é\nx", 3), (2, 1));
        assert_eq!(super::line_col("ab", 99), (1, 3));
    }
}
