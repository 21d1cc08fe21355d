//! Plain log lines on stderr: `<RFC 3339 UTC time> <message>`.
//!
//! The controller logs little (startup, discovery changes, endpoints that start or stop failing),
//! so a timestamped `eprintln` is all it needs.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes one timestamped line to stderr, formatted like `format!`.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log::write(format_args!($($arg)*))
    };
}

/// Writes `message` to stderr after the current UTC time; used by [`log!`].
pub fn write(message: fmt::Arguments<'_>) {
    eprintln!("{} {}", utc_timestamp(now_unix_ms()), message);
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Formats Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc_timestamp(unix_ms: u64) -> String {
    let time = i64::try_from(unix_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    format!("{time:.3}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 12:34:56.789 UTC, a leap day.
        assert_eq!(utc_timestamp(951_827_696_789), "2000-02-29T12:34:56.789Z");
        // 2024-12-31 23:59:59.999 UTC.
        assert_eq!(utc_timestamp(1_735_689_599_999), "2024-12-31T23:59:59.999Z");
    }
}
