//! Jobs on many machines, on the command line: what to do when the lock is held
//! (`--on-conflict skip|wait|queue-one|replace`, with `-n` and `-w`), and how long a run holds
//! the lock at least and at most (`--min-hold`, `--max-hold`), checked once with errors that
//! name the flags at fault.

use std::time::Duration;

use anyhow::{Result, anyhow};
use xtr_lock::OnConflict;

use crate::durations::duration;

/// The policies `--on-conflict` takes, as the library names them.
pub(crate) const POLICIES: [&str; 4] = ["skip", "wait", "queue-one", "replace"];

/// `--on-conflict`'s value, checked by clap against [`POLICIES`].
pub(crate) fn parse(text: &str) -> Result<OnConflict, xtr_lock::Error> {
    text.parse()
}

/// `--on-conflict` with `-n` and `-w`: `-n` is `skip`, neither is `wait`; `-n` with another
/// policy, or `-w` with `skip`, contradict each other and are refused in one line.
pub(crate) fn on_conflict(
    asked: Option<OnConflict>,
    nonblock: bool,
    wait: Option<&str>,
) -> Result<OnConflict> {
    match (asked, nonblock, wait) {
        (None, true, _) => Ok(OnConflict::Skip),
        (None, false, _) => Ok(OnConflict::Wait),
        (Some(OnConflict::Skip), true, _) => Ok(OnConflict::Skip),
        (Some(p), true, _) => Err(anyhow!(
            "-n/--nonblock is --on-conflict skip, which contradicts --on-conflict {}: give one \
             of them",
            p.as_str()
        )),
        (Some(OnConflict::Skip), false, Some(w)) => Err(anyhow!(
            "--on-conflict skip tries once, and -w {w} waits: give one of them"
        )),
        (Some(OnConflict::Replace), false, Some(w))
            if duration("-w", w).is_ok_and(|d| d.is_zero()) =>
        {
            Err(anyhow!(
                "--on-conflict replace -w {w} would revoke the holders and not wait for them to                  let go: give a -w long enough for the running command to stop (its                  --kill-after)"
            ))
        }
        (Some(p), false, _) => Ok(p),
    }
}

/// Refuses `--on-conflict replace` with `--limit`: a semaphore's permits are not revoked, so
/// replacing would only wait.
pub(crate) fn check_with_limit(on_conflict: OnConflict, limit: Option<u32>) -> Result<()> {
    if on_conflict == OnConflict::Replace && limit.is_some() {
        return Err(anyhow!(
            "--on-conflict replace revokes a lock's holders, and a semaphore's permits \
             (--limit) are not revoked: use wait or queue-one"
        ));
    }
    Ok(())
}

/// `--min-hold` and `--max-hold`: how long a run holds the lock at least (even if its command
/// ends sooner) and at most (its command stopped then, exit 4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Holds {
    pub min: Option<Duration>,
    pub max: Option<Duration>,
}

impl Holds {
    /// Parses both; zero is refused (leave the flag out for none).
    pub(crate) fn from_flags(min: Option<&str>, max: Option<&str>) -> Result<Holds> {
        let parse = |flag: &str, text: Option<&str>| -> Result<Option<Duration>> {
            let Some(text) = text else { return Ok(None) };
            let d = duration(flag, text)?;
            if d.is_zero() {
                return Err(anyhow!(
                    "{flag} must be more than zero (leave it out for no {})",
                    if flag == "--min-hold" {
                        "minimum"
                    } else {
                        "maximum"
                    }
                ));
            }
            Ok(Some(d))
        };
        Ok(Holds {
            min: parse("--min-hold", min)?,
            max: parse("--max-hold", max)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonblock_is_skip_and_contradictions_are_refused() {
        use OnConflict::*;
        assert_eq!(on_conflict(None, true, None).unwrap(), Skip);
        assert_eq!(on_conflict(None, false, Some("3")).unwrap(), Wait);
        assert_eq!(on_conflict(Some(Skip), true, None).unwrap(), Skip);
        assert_eq!(
            on_conflict(Some(Replace), false, Some("30")).unwrap(),
            Replace
        );
        for name in POLICIES {
            assert_eq!(parse(name).unwrap().as_str(), name);
        }
        let err = on_conflict(Some(Replace), true, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("contradicts --on-conflict replace"), "{err}");
        let err = on_conflict(Some(OnConflict::Replace), false, Some("0"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not wait for them"), "{err}");
        assert_eq!(
            on_conflict(Some(OnConflict::Replace), false, Some("5s")).unwrap(),
            OnConflict::Replace
        );
        let err = on_conflict(Some(Skip), false, Some("30"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("-w 30 waits"), "{err}");
    }

    #[test]
    fn holds_are_durations_above_zero() {
        let holds = Holds::from_flags(Some("55m"), Some("50m")).unwrap();
        assert_eq!(holds.min, Some(Duration::from_secs(55 * 60)));
        assert_eq!(holds.max, Some(Duration::from_secs(50 * 60)));
        assert_eq!(Holds::from_flags(None, None).unwrap(), Holds::default());
        let err = Holds::from_flags(Some("0"), None).unwrap_err().to_string();
        assert!(
            err.starts_with("--min-hold must be more than zero"),
            "{err}"
        );
        let err = Holds::from_flags(None, Some("soon"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--max-hold \"soon\" is not a duration"),
            "{err}"
        );
    }
}
