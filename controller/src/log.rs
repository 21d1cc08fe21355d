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
    let secs = unix_ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ms % 1000
    )
}

/// Converts days since 1970-01-01 into a proleptic Gregorian (year, month, day).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shift the epoch to 0000-03-01 so leap days fall at the end of each 400-year era.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
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
