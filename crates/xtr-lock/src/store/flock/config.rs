//! Flock DSNs: `flock` (the default directory), `flock://<absolute path>` taken literally as the
//! Python peer takes it, with one option, `?names=long`.

use super::FlockStore;
use crate::dsn::Dsn;
use crate::error::{Error, Result};

/// A parsed flock DSN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlockConfig {
    /// `None`: the default directory.
    pub(crate) dir: Option<String>,
    /// File names with the whole digest.
    pub(crate) long: bool,
}

/// Checks a flock DSN without building anything.
pub(crate) fn validate_dsn(dsn: &str) -> Result<()> {
    parse(dsn).map(|_| ())
}

/// Parses a flock DSN. Everything after `flock://` is the directory, taken literally, except a
/// final `?names=long` or `?names=short`.
pub(crate) fn parse(text: &str) -> Result<FlockConfig> {
    let dsn = Dsn::split(text, "flock");
    if text == "flock" {
        return Ok(FlockConfig {
            dir: None,
            long: false,
        });
    }
    let Some(rest) = text
        .get(..8)
        .filter(|s| s.eq_ignore_ascii_case("flock://"))
        .map(|_| &text[8..])
    else {
        return Err(dsn.invalid("write flock or flock:///absolute/dir"));
    };
    let (path, long) = match rest.rsplit_once('?') {
        Some((path, "names=long")) => (path, true),
        Some((path, "names=short")) => (path, false),
        Some((_, option)) => {
            return Err(dsn.invalid(format!(
                "unknown option {:?}; the one option is names=long (or names=short, the default)",
                option.chars().take(40).collect::<String>()
            )));
        }
        None => (rest, false),
    };
    if path.is_empty() {
        return Ok(FlockConfig { dir: None, long });
    }
    if !path.starts_with('/') {
        // Each process would resolve it against its own working directory: two processes
        // started in different directories would silently stop excluding each other.
        return Err(Error::invalid_argument(format!(
            "flock://{:?} names a relative directory, which each process would resolve against \
             its own working directory: write an absolute path, flock:///absolute/dir",
            path.chars().take(100).collect::<String>()
        )));
    }
    Ok(FlockConfig {
        dir: Some(path.to_owned()),
        long,
    })
}

impl FlockStore {
    /// A store from a DSN: `flock` or `flock://` (the default directory), `flock:///abs/dir`
    /// (that directory, taken literally), with `?names=long` for file names with the whole
    /// digest ([`with_long_names`](FlockStore::with_long_names)).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a malformed DSN or
    /// a relative directory; the errors of [`new`](FlockStore::new) and
    /// [`in_dir`](FlockStore::in_dir).
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let config = parse(dsn)?;
        let store = match config.dir {
            None => FlockStore::new()?,
            Some(path) => FlockStore::in_dir(path)?,
        };
        Ok(if config.long {
            store.with_long_names()
        } else {
            store
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flock_dsns_name_the_directory_literally() {
        let flock = |dir: Option<&str>, long| FlockConfig {
            dir: dir.map(str::to_owned),
            long,
        };
        assert_eq!(parse("flock").unwrap(), flock(None, false));
        assert_eq!(parse("flock://").unwrap(), flock(None, false));
        assert_eq!(
            parse("flock:///var/lock/app").unwrap(),
            flock(Some("/var/lock/app"), false)
        );
        let err = parse("flock://rel/dir").unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains("relative directory"), "{err}");
        assert_eq!(
            parse("flock:///a%20b").unwrap(),
            flock(Some("/a%20b"), false),
            "no decoding"
        );
        let err = parse("flock:///var/lock?names=lng").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid flock connection string \"flock:\": unknown option \"names=lng\"; the one \
             option is names=long (or names=short, the default)"
        );
        assert_eq!(
            parse("flock:///var/lock/app?names=long").unwrap(),
            flock(Some("/var/lock/app"), true)
        );
        assert_eq!(parse("flock://?names=long").unwrap(), flock(None, true));
    }
}
