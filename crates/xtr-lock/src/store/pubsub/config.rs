//! Pub/sub DSNs: `redis+pubsub://`, `rediss+pubsub://`, `valkey+pubsub://`,
//! `valkeys+pubsub://`, `unix+pubsub://`: a Redis DSN (same rules, same options) with the
//! protocol's timings as options of their own.

use std::fmt;
use std::time::Duration;

use crate::dsn::Dsn;
use crate::error::Result;
use crate::limits::MAX_DURATION;
use crate::store::redis::{RedisConfig, ignore_pool_options, read_config};

/// portalocker's defaults (`unavailable_timeout`, `check_interval`, its health checks).
pub(crate) const DEFAULT_UNAVAILABLE: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(250);
pub(crate) const DEFAULT_HEALTH_CHECK: Duration = Duration::from_secs(10);

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

/// Parses a DSN: the Redis rules with `+pubsub` after the scheme, and the protocol's timings.
/// Errors show the scheme only.
pub(crate) fn parse(text: &str) -> Result<PubSubConfig> {
    let dsn = Dsn::split_lenient(text, "pub/sub");
    let mut options = dsn.options();
    let redis = read_config(&dsn, "+pubsub", &mut options)?;
    let mut seconds = |name| options.seconds(name, MAX_DURATION);
    let config = PubSubConfig {
        redis,
        unavailable: seconds("unavailable_timeout")?.unwrap_or(DEFAULT_UNAVAILABLE),
        check_interval: seconds("check_interval")?.unwrap_or(DEFAULT_CHECK_INTERVAL),
        health_check: seconds("health_check_interval")?.unwrap_or(DEFAULT_HEALTH_CHECK),
    };
    ignore_pool_options(&mut options);
    options.finish()?;
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
        assert!(parse("REDIS+PUBSUB://h").is_ok());
        assert!(parse("redis://h").is_err());
        assert!(parse("flock+pubsub://h").is_err());
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
        assert!(text.contains("did you mean \"check_interval\"?"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(parse("redis+pubsub://h:notaport").is_err());
    }
}
