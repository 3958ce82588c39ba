/// Current UTC time in RFC 3339 with millisecond precision.
pub fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    format!("{:.3}", now)
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
