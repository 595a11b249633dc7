//! Pub/sub DSNs: `redis+pubsub://`, `rediss+pubsub://`, `valkey+pubsub://`,
//! `valkeys+pubsub://`, `unix+pubsub://`: a Redis DSN (same rules, same options) with the
//! protocol's timings as options of their own.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::redis::{RedisConfig, parse_config};

/// portalocker's defaults (`unavailable_timeout`, `check_interval`, its health checks).
pub(crate) const DEFAULT_UNAVAILABLE: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(250);
pub(crate) const DEFAULT_HEALTH_CHECK: Duration = Duration::from_secs(10);

/// The options read here, before the rest goes to the Redis DSN rules.
const OWN_OPTIONS: &[&str] = &[
    "unavailable_timeout",
    "check_interval",
    "health_check_interval",
];

/// A parsed pub/sub DSN. `Display` and `Debug` never show credentials.
#[derive(Clone)]
pub(crate) struct PubSubConfig {
    pub(crate) redis: RedisConfig,
    /// `redis+pubsub://host:port/db`, credential-free.
    pub(crate) shown: String,
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
            .field("server", &self.shown)
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
    match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= crate::limits::MAX_DURATION.as_secs_f64() => {
            Ok(Duration::from_secs_f64(s))
        }
        _ => Err(invalid(
            scheme,
            format!("{option} must be a positive number of seconds"),
        )),
    }
}

/// Parses a DSN. Errors show the scheme only.
pub(crate) fn parse(dsn: &str) -> Result<PubSubConfig> {
    let Some((raw_scheme, rest)) = dsn.split_once(':') else {
        return Err(Error::invalid_argument(
            "a pub/sub connection string needs a scheme (redis+pubsub://)",
        ));
    };
    let lower = raw_scheme.to_ascii_lowercase();
    let Some(base) = lower.strip_suffix("+pubsub") else {
        return Err(invalid(raw_scheme, "the scheme must end in +pubsub"));
    };
    let (before_fragment, fragment) = match rest.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (rest, None),
    };
    let (location, query) = before_fragment
        .split_once('?')
        .unwrap_or((before_fragment, ""));
    let mut unavailable = DEFAULT_UNAVAILABLE;
    let mut check_interval = DEFAULT_CHECK_INTERVAL;
    let mut health_check = DEFAULT_HEALTH_CHECK;
    let mut passed_on = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match name.as_ref() {
            "unavailable_timeout" => {
                unavailable = seconds(raw_scheme, "unavailable_timeout", &value)?;
            }
            "check_interval" => check_interval = seconds(raw_scheme, "check_interval", &value)?,
            "health_check_interval" => {
                health_check = seconds(raw_scheme, "health_check_interval", &value)?;
            }
            other => {
                passed_on.append_pair(other, &value);
            }
        }
    }
    let passed_on = passed_on.finish();
    let mut redis_dsn = format!("{base}:{location}");
    if !passed_on.is_empty() {
        redis_dsn.push('?');
        redis_dsn.push_str(&passed_on);
    }
    if let Some(fragment) = fragment {
        redis_dsn.push('#');
        redis_dsn.push_str(fragment);
    }
    let redis = parse_config(&redis_dsn).map_err(|e| {
        // The Redis rules name the options they know; these are known too.
        let reason = e.to_string().replace(
            "the options are ",
            &format!("the options are {}, ", OWN_OPTIONS.join(", ")),
        );
        Error::invalid_argument(reason.replacen(
            &format!("Redis connection string \"{base}:\""),
            &format!("pub/sub connection string \"{raw_scheme}:\""),
            1,
        ))
    })?;
    let shown = match redis.shown.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}+pubsub://{rest}"),
        None => redis.shown.clone(),
    };
    Ok(PubSubConfig {
        redis,
        shown,
        unavailable,
        check_interval,
        health_check,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsns_take_the_redis_rules_and_the_protocol_timings() {
        let c = parse("redis+pubsub://:secret@localhost:6380/2?prefix=app:&unavailable_timeout=0.2&check_interval=0.02").unwrap();
        assert_eq!(c.shown, "redis+pubsub://localhost:6380/2");
        assert_eq!(c.redis.prefix, "app:");
        assert_eq!(c.unavailable, Duration::from_millis(200));
        assert_eq!(c.check_interval, Duration::from_millis(20));
        assert_eq!(c.health_check, DEFAULT_HEALTH_CHECK);
        assert!(!format!("{c:?}").contains("secret"));
        let c = parse("unix+pubsub:///run/redis.sock?db=1").unwrap();
        assert_eq!(c.shown, "unix+pubsub:///run/redis.sock?db=1");
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
