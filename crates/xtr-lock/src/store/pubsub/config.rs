//! Pub/sub DSNs: `redis+pubsub://`, `rediss+pubsub://`, `valkey+pubsub://`,
//! `valkeys+pubsub://`, `unix+pubsub://`: a Redis DSN (same rules, same options) with the
//! protocol's timings as options of their own.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::redis::{Flavor, RedisConfig, parse_with};

/// portalocker's defaults (`unavailable_timeout`, `check_interval`, its health checks).
pub(crate) const DEFAULT_UNAVAILABLE: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(250);
pub(crate) const DEFAULT_HEALTH_CHECK: Duration = Duration::from_secs(10);

/// The Redis DSN rules with `+pubsub` after the scheme and the protocol's timings.
const PUBSUB: Flavor = Flavor {
    what: "pub/sub",
    suffix: "+pubsub",
    options: &[
        "unavailable_timeout",
        "check_interval",
        "health_check_interval",
    ],
};

/// A parsed pub/sub DSN. `Display` and `Debug` never show credentials.
#[derive(Clone)]
pub(crate) struct PubSubConfig {
    pub(crate) redis: RedisConfig,
    /// How long a probe waits for replies (the prober's `unavailable_timeout`).
    pub(crate) unavailable: Duration,
    /// The base pause between a waiter's attempts, jittered ×[0.5, 1.5).
    pub(crate) check_interval: Duration,
    /// How often a holder's subscription is pinged to find a half-open connection.
    pub(crate) health_check: Duration,
}

impl fmt::Debug for PubSubConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubConfig")
            .field("server", &self.redis.shown)
            .field("prefix", &self.redis.prefix)
            .field("unavailable", &self.unavailable)
            .field("check_interval", &self.check_interval)
            .field("health_check", &self.health_check)
            .finish_non_exhaustive()
    }
}

/// Whether `dsn` names the pub/sub store (a Redis scheme followed by `+pubsub`).
pub(crate) fn is_pubsub_dsn(dsn: &str) -> bool {
    dsn.split_once(':').is_some_and(|(scheme, _)| {
        scheme
            .to_ascii_lowercase()
            .strip_suffix("+pubsub")
            .is_some_and(|base| crate::store::redis::is_redis_dsn(&format!("{base}:")))
    })
}

fn invalid(scheme: &str, what: impl fmt::Display) -> Error {
    Error::invalid_argument(format!(
        "invalid pub/sub connection string \"{scheme}:\": {what}"
    ))
}

/// Seconds as portalocker takes them (a float), positive and finite.
fn seconds(scheme: &str, option: &str, value: &str) -> Result<Duration> {
    crate::limits::positive_seconds(value, crate::limits::MAX_DURATION).ok_or_else(|| {
        invalid(
            scheme,
            format!("{option} must be a positive number of seconds"),
        )
    })
}

/// Parses a DSN. Errors show the scheme only.
pub(crate) fn parse(dsn: &str) -> Result<PubSubConfig> {
    let (redis, own) = parse_with(dsn, &PUBSUB)?;
    let scheme = dsn.split_once(':').map_or(dsn, |(s, _)| s);
    let mut config = PubSubConfig {
        redis,
        unavailable: DEFAULT_UNAVAILABLE,
        check_interval: DEFAULT_CHECK_INTERVAL,
        health_check: DEFAULT_HEALTH_CHECK,
    };
    for (name, value) in own {
        let d = seconds(scheme, &name, &value)?;
        match name.as_str() {
            "unavailable_timeout" => config.unavailable = d,
            "check_interval" => config.check_interval = d,
            _ => config.health_check = d,
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsns_take_the_redis_rules_and_the_protocol_timings() {
        let c = parse("redis+pubsub://:secret@localhost:6380/2?prefix=app:&unavailable_timeout=0.2&check_interval=0.02").unwrap();
        assert_eq!(c.redis.shown, "redis+pubsub://localhost:6380/2");
        assert_eq!(c.redis.prefix, "app:");
        assert_eq!(c.unavailable, Duration::from_millis(200));
        assert_eq!(c.check_interval, Duration::from_millis(20));
        assert_eq!(c.health_check, DEFAULT_HEALTH_CHECK);
        assert!(!format!("{c:?}").contains("secret"));
        let c = parse("unix+pubsub:///run/redis.sock?db=1").unwrap();
        assert_eq!(c.redis.shown, "unix+pubsub:///run/redis.sock?db=1");
        assert_eq!(c.unavailable, DEFAULT_UNAVAILABLE);
        assert!(is_pubsub_dsn("REDIS+PUBSUB://h"));
        assert!(is_pubsub_dsn("rediss+pubsub://h"));
        assert!(!is_pubsub_dsn("redis://h"));
        assert!(!is_pubsub_dsn("flock+pubsub://h"));
    }

    #[test]
    fn bad_dsns_say_what_is_wrong_without_secrets() {
        let err = parse("redis+pubsub://:secret@h/0?unavailable_timeout=-1").unwrap_err();
        assert!(
            err.to_string()
                .contains("unavailable_timeout must be a positive"),
            "{err}"
        );
        assert!(!err.to_string().contains("secret"));
        let err = parse("redis+pubsub://:secret@h/0?check_intervall=1").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("pub/sub connection string \"redis+pubsub:\""),
            "{text}"
        );
        assert!(text.contains("check_intervall"), "{text}");
        assert!(text.contains("unavailable_timeout"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(parse("redis+pubsub://h:notaport").is_err());
    }
}
