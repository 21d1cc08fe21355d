//! Durations as the upstream EPP writes them (Go's `time.ParseDuration` units): `50ms`, `1s`,
//! `1.5s`, `2m`, `1h`, `1m30s`. Used by the flags and by plugin parameters.

use std::time::Duration;

use thiserror::Error;

/// A text that is not a duration (unknown unit, no number, or too large).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid duration {text:?} (examples: 50ms, 1s, 2m)")]
pub struct DurationError {
    /// The text as given.
    pub text: String,
}

/// Parses a duration such as `50ms`, `1s`, `1.5s`, `2m`, `1h` or `1m30s`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError {
        text: text.to_string(),
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let unit_nanos: u128 = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(invalid()),
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid());
        }
        let digits = |part: &str| -> Result<u128, DurationError> {
            if part.is_empty() {
                Ok(0)
            } else {
                part.parse::<u128>().map_err(|_| invalid())
            }
        };
        // Exact integer arithmetic: `0.05s` is 50ms, not a float's approximation of it.
        let fraction = &fraction[..fraction.len().min(18)];
        let whole_nanos = digits(whole)?.checked_mul(unit_nanos).ok_or_else(invalid)?;
        let fraction_nanos = digits(fraction)? * unit_nanos / 10u128.pow(fraction.len() as u32);
        let nanos = whole_nanos
            .checked_add(fraction_nanos)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(invalid)?;
        total = total
            .checked_add(Duration::from_nanos(nanos))
            .ok_or_else(invalid)?;
        rest = after;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0.05s"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration(".5m"), Ok(Duration::from_secs(30)));
        for bad in [
            "",
            "50",
            "ms",
            "5 s",
            "1d",
            "-1s",
            "1..2s",
            "1s5",
            ".s",
            "99999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            parse_duration("1d").unwrap_err().to_string(),
            "invalid duration \"1d\" (examples: 50ms, 1s, 2m)"
        );
    }
}
