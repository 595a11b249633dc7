//! Durations on the command line: `-w`, `--ttl`, `--kill-after` and the others, as flock(1)
//! takes seconds or as humantime spells them, each error naming its flag.

use std::time::Duration;

use anyhow::{Result, anyhow};
use xtr_lock::Wait;

/// Parses a duration naming the flag on error: seconds as flock(1) takes them (`30`, `0.5`), or
/// humantime (`30s`, `2m`, `1h30m`, `500ms`); at most [`MAX_DURATION`](xtr_lock::MAX_DURATION)
/// (3650 days).
pub(crate) fn duration(flag: &str, text: &str) -> Result<Duration> {
    let too_long = || anyhow!("{flag} {text:?} is too long: the longest accepted is 3650days");
    if let Ok(seconds) = text.trim().parse::<f64>() {
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(anyhow!(
                "{flag} {text:?} is not a duration: seconds must be a number of at least 0"
            ));
        }
        let d = Duration::try_from_secs_f64(seconds).map_err(|_| too_long())?;
        return if d > xtr_lock::MAX_DURATION {
            Err(too_long())
        } else {
            Ok(d)
        };
    }
    let d = humantime::parse_duration(text).map_err(|e| {
        anyhow!(
            "{flag} {text:?} is not a duration ({e}); write seconds (30, 0.5) or a duration \
             like 30s, 2m, 1h30m or 500ms"
        )
    })?;
    if d > xtr_lock::MAX_DURATION {
        return Err(too_long());
    }
    Ok(d)
}

/// `--ttl`: a duration, or `none` (no expiry), as in configuration files; zero is refused
/// (a file's `0` means none, which the command line spells out).
pub(crate) fn ttl_arg(text: &str) -> Result<Option<Duration>> {
    if text.trim() == "none" {
        return Ok(None);
    }
    let ttl = duration("--ttl", text).map_err(|e| anyhow!("{e}; or none (no expiry)"))?;
    if ttl.is_zero() {
        return Err(anyhow!(
            "--ttl must be more than zero (--ttl none: no expiry)"
        ));
    }
    Ok(Some(ttl))
}

/// `-w`: a duration (zero: try once), or `forever`, as in configuration files.
pub(crate) fn wait_arg(text: &str) -> Result<Wait> {
    if text.trim() == "forever" {
        return Ok(Wait::Forever);
    }
    let wait = duration("--wait", text).map_err(|e| anyhow!("{e}; or forever"))?;
    Ok(Wait::AtMost(wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_flock_seconds_and_units() {
        assert_eq!(duration("-w", "30").unwrap(), Duration::from_secs(30));
        assert_eq!(duration("-w", "0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("-w", "0").unwrap(), Duration::ZERO);
        assert_eq!(duration("-w", "2m").unwrap(), Duration::from_secs(120));
        let err = duration("-w", "-1").unwrap_err().to_string();
        assert!(err.contains("at least 0"), "{err}");
        let err = duration("--ttl", "1e300").unwrap_err().to_string();
        assert!(err.contains("too long"), "{err}");
        let err = duration("-w", "soon").unwrap_err().to_string();
        assert!(err.starts_with("-w \"soon\" is not a duration"), "{err}");
    }

    #[test]
    fn none_and_forever_mean_what_they_mean_in_files() {
        assert_eq!(ttl_arg("none").unwrap(), None);
        assert_eq!(ttl_arg("90").unwrap(), Some(Duration::from_secs(90)));
        let err = ttl_arg("0").unwrap_err().to_string();
        assert!(err.contains("--ttl none"), "{err}");
        assert_eq!(wait_arg("forever").unwrap(), Wait::Forever);
        assert_eq!(wait_arg("0").unwrap(), Wait::AtMost(Duration::ZERO));
        assert!(
            wait_arg("none").is_err(),
            "a wait of none is not forever: refused"
        );
    }
}
