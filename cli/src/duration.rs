//! The durations the command line takes (`500ms`, `10s`, `2m`): parsed, and bounded.

use std::time::Duration;

/// The longest duration any option accepts (a day): longer values are refused, not clamped.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The longest connect timeout accepted (an hour, as the backends' configurations accept).
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(3600);

/// The shortest connect timeout accepted: connecting and starting a session take round trips
/// of their own, and `1ns` was reported as a cluster that cannot be reached (69: black-box
/// round 24).
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(10);

/// A human duration (`500ms`, `10s`, `2m`), at most a day.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    at_most(s, MAX_DURATION, "24h")
}

/// A human duration, at most `max` (`longest`, as the error names it).
fn at_most(s: &str, max: Duration, longest: &str) -> Result<Duration, String> {
    // (The options take values that start with '-', so that a negative one is named as such.)
    if s.starts_with("--") || s.trim() == "-" {
        return Err(format!(
            "{s} is not a duration (e.g. 10s): the option needs a value"
        ));
    }
    if s.trim_start().starts_with('-') {
        return Err(format!(
            "{s} is negative: a duration is 0 or more (e.g. 10s)"
        ));
    }
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d > max {
        return Err(format!(
            "{s} is longer than the longest accepted, {longest}"
        ));
    }
    Ok(d)
}

/// [`duration`], more than zero (a TTL): refused here, a usage error as every other value out
/// of range, not once connected (78, and "0ns" for what was typed as "0").
pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    more_than_zero(s, duration(s)?)
}

/// A connect timeout: at least [`MIN_CONNECT_TIMEOUT`], at most an hour (past a day it was said
/// to be longer than a day's limit: black-box round 14).
pub(crate) fn connect_timeout(s: &str) -> Result<Duration, String> {
    let d = more_than_zero(s, at_most(s, MAX_CONNECT_TIMEOUT, "1h")?)?;
    if d < MIN_CONNECT_TIMEOUT {
        return Err(format!(
            "{s} is shorter than the shortest accepted, 10ms: connecting takes round trips"
        ));
    }
    Ok(d)
}

/// `d`, read from `s`, unless it is zero.
fn more_than_zero(s: &str, d: Duration) -> Result<Duration, String> {
    match d {
        Duration::ZERO => Err(format!("{s} is no time: it must be more than zero")),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded() {
        assert_eq!(duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert!(duration("25h").is_err());
        assert!(duration("99999999999999999999years").is_err());
        assert!(duration("soon").is_err());
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        for zero in ["0", "0s", "0ms"] {
            assert!(positive_duration(zero).is_err(), "{zero}");
        }
        for negative in ["-1s", "-0s", " -5ms"] {
            let e = duration(negative).unwrap_err();
            assert!(e.contains("negative"), "{negative}: {e}");
        }
        assert!(duration("--try").unwrap_err().contains("needs a value"));
        assert_eq!(connect_timeout("1h"), Ok(Duration::from_secs(3600)));
        assert!(connect_timeout("0s").unwrap_err().contains("no time"));
        for s in ["1ns", "0.0001s", "9ms"] {
            let e = connect_timeout(s).unwrap_err();
            assert!(e.contains("shortest accepted, 10ms"), "{s}: {e}");
        }
        assert_eq!(connect_timeout("10ms"), Ok(Duration::from_millis(10)));
        // Past a day too, it names its own limit (it said 24h: black-box round 14).
        for s in ["2h", "25h", "86401s", "1w"] {
            let e = connect_timeout(s).unwrap_err();
            assert!(e.ends_with("longest accepted, 1h"), "{s}: {e}");
        }
    }
}
