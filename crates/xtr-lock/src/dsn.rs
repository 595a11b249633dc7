//! One grammar for every connection string: `scheme:[//[user[:password]@]hosts][/path][?options][#fragment]`,
//! split once, and a typed reader for the options that refuses what it was not asked about.
//!
//! Errors name the store, the scheme as written and what is wrong, never a value that could be a
//! secret: `invalid Redis connection string "redis:": unknown option "prefx"; did you mean "prefix"?`.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// A connection string split into its parts. Its `Debug` never shows the password.
pub(crate) struct Dsn<'a> {
    /// The whole string, as given.
    pub(crate) text: &'a str,
    /// The scheme as written (`Redis+PubSub`): what errors show.
    pub(crate) written: &'a str,
    /// The scheme, lower-cased.
    pub(crate) scheme: String,
    /// What errors call the store (`Redis`, `pub/sub`, `PostgreSQL`).
    pub(crate) what: &'static str,
    /// Everything after `scheme:`.
    pub(crate) rest: &'a str,
    /// `//…` parts, when the string has them.
    pub(crate) url: Option<UrlParts<'a>>,
}

/// The parts of `//[user[:password]@]hosts[/path][?query][#fragment]`, raw (not decoded).
#[derive(Clone, Copy)]
pub(crate) struct UrlParts<'a> {
    pub(crate) userinfo: Option<&'a str>,
    /// `host[:port]`, comma-separated for stores of several members; may be empty.
    pub(crate) hosts: &'a str,
    /// After the `/` that ends the hosts (without it); empty when there is none.
    pub(crate) path: &'a str,
    /// Whether a `/` followed the hosts.
    pub(crate) has_path: bool,
    pub(crate) query: &'a str,
    pub(crate) fragment: Option<&'a str>,
}

impl fmt::Debug for Dsn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dsn")
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

impl<'a> Dsn<'a> {
    /// Splits `text`, whose scheme is `written` (everything before the first `:`). The query
    /// starts at the first `?` and ends at a `#`; a fragment is a `#` before the query; the
    /// user information ends at the last `@` before the first `/`, the hosts at the `/` after.
    pub(crate) fn split(text: &'a str, what: &'static str) -> Dsn<'a> {
        Self::split_with(text, what, false)
    }

    /// As [`split`](Self::split), with the user information ending at the *last* `@` before the
    /// query, so a password may hold an unescaped `/` (the Redis stores have always read them so).
    pub(crate) fn split_lenient(text: &'a str, what: &'static str) -> Dsn<'a> {
        Self::split_with(text, what, true)
    }

    fn split_with(text: &'a str, what: &'static str, last_at: bool) -> Dsn<'a> {
        let (written, rest) = text.split_once(':').unwrap_or((text, ""));
        let url = rest.strip_prefix("//").map(|after| {
            let (before_query, query) = after.split_once('?').unwrap_or((after, ""));
            let (location, fragment) = match before_query.split_once('#') {
                Some((b, f)) => (b, Some(f)),
                None => (before_query, None),
            };
            let query = query.split_once('#').map_or(query, |(q, _)| q);
            let authority = match location.split_once('/') {
                Some((a, _)) if !last_at => a,
                _ => location,
            };
            let (userinfo, rest) = match authority.rsplit_once('@') {
                Some((u, _)) => (Some(u), &location[u.len() + 1..]),
                None => (None, location),
            };
            let (hosts, path, has_path) = match rest.split_once('/') {
                Some((h, p)) => (h, p, true),
                None => (rest, "", false),
            };
            UrlParts {
                userinfo,
                hosts,
                path,
                has_path,
                query,
                fragment,
            }
        });
        Dsn {
            text,
            written,
            scheme: written.to_ascii_lowercase(),
            what,
            rest,
            url,
        }
    }

    /// An invalid-argument error about this DSN: `invalid <what> connection string "<scheme>:": <why>`.
    pub(crate) fn invalid(&self, why: impl fmt::Display) -> Error {
        Error::invalid_argument(format!(
            "invalid {} connection string \"{}:\": {why}",
            self.what,
            crate::redact::shown_scheme(self.written)
        ))
    }

    /// The `//` parts, or an error saying what to write.
    pub(crate) fn url(&self, example: &str) -> Result<UrlParts<'a>> {
        self.url
            .ok_or_else(|| self.invalid(format!("expected \"//\" after the scheme ({example})")))
    }

    /// The user name and password, percent-decoded (`None` when there is no `@`).
    pub(crate) fn credentials(&self) -> Result<Option<(String, Option<String>)>> {
        let Some(userinfo) = self.url.and_then(|u| u.userinfo) else {
            return Ok(None);
        };
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (userinfo, None),
        };
        let user = self.decode("user name", user)?;
        let password = password.map(|p| self.decode("password", p)).transpose()?;
        Ok(Some((user, password)))
    }

    /// `%XX` escapes decoded, refusing broken ones and non-UTF-8 (naming `what`, never the text).
    pub(crate) fn decode(&self, what: &str, s: &str) -> Result<String> {
        percent_decode(s)
            .ok_or_else(|| self.invalid(format!("the {what} is not valid percent-encoded UTF-8")))
    }

    /// The options after `?`, form-decoded (`+` is a space, as the Python peer reads them), in
    /// order, for a typed read.
    pub(crate) fn options(&self) -> Options<'_, 'a> {
        let pairs = url::form_urlencoded::parse(self.query().as_bytes())
            .into_owned()
            .map(Some)
            .collect();
        self.reader(pairs)
    }

    /// The options after `?`, only `%XX`-decoded (a `+` stays a `+`: file paths), refusing a
    /// broken escape.
    pub(crate) fn options_percent(&self) -> Result<Options<'_, 'a>> {
        let mut pairs = Vec::new();
        for pair in self.query().split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = self.decode("option names", name)?;
            let value = self.decode(&format!("{name} option"), value)?;
            pairs.push(Some((name, value)));
        }
        Ok(self.reader(pairs))
    }

    fn query(&self) -> &'a str {
        let query = match self.url {
            Some(u) => u.query,
            None => self.rest.split_once('?').map_or("", |(_, q)| q),
        };
        query.split_once('#').map_or(query, |(q, _)| q)
    }

    fn reader(&self, pairs: Vec<Option<(String, String)>>) -> Options<'_, 'a> {
        Options {
            dsn: self,
            pairs,
            known: Vec::new(),
            driver: &[],
        }
    }
}

/// `%XX` escapes decoded; `None` for a broken escape or text that is not UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A DSN's options, taken out by name; [`finish`](Options::finish) refuses any left.
pub(crate) struct Options<'d, 'a> {
    dsn: &'d Dsn<'a>,
    /// `None` once taken.
    pairs: Vec<Option<(String, String)>>,
    /// The names asked about, for "did you mean" and the list of options.
    known: Vec<&'static str>,
    /// The driver's own options, handed on (named apart in the list of options).
    driver: &'static [&'static str],
}

impl Options<'_, '_> {
    /// The last value given for `name`, taking every occurrence out.
    pub(crate) fn take(&mut self, name: &'static str) -> Option<String> {
        self.known.push(name);
        let mut last = None;
        for slot in &mut self.pairs {
            if slot.as_ref().is_some_and(|(k, _)| k == name) {
                last = slot.take().map(|(_, v)| v);
            }
        }
        last
    }

    /// Every value given for `name`, in order, taking them out.
    pub(crate) fn take_all(&mut self, name: &'static str) -> Vec<String> {
        self.known.push(name);
        self.pairs
            .iter_mut()
            .filter_map(|slot| slot.take_if(|(k, _)| k == name).map(|(_, v)| v))
            .collect()
    }

    /// Every value given for `name`, each parsed by `parse` (an error built by `why` from the
    /// first that does not parse), the last one kept: a repeated option wins by its last value
    /// but may not hide a bad one.
    fn parse_each<T>(
        &mut self,
        name: &'static str,
        parse: impl Fn(&str) -> Option<T>,
        why: impl Fn(&str) -> String,
    ) -> Result<Option<T>> {
        self.known.push(name);
        let mut last = None;
        for slot in &mut self.pairs {
            if let Some((_, value)) = slot.take_if(|(k, _)| k == name) {
                last = Some(parse(&value).ok_or_else(|| self.dsn.invalid(why(&value)))?);
            }
        }
        Ok(last)
    }

    /// Seconds (`2`, `0.5`): positive, finite, at most `max`.
    pub(crate) fn seconds(
        &mut self,
        name: &'static str,
        max: Duration,
    ) -> Result<Option<Duration>> {
        self.parse_each(
            name,
            |v| crate::limits::positive_seconds(v, max),
            |_| {
                format!(
                    "{name} must be a positive number of seconds, at most {}",
                    max.as_secs_f64()
                )
            },
        )
    }

    /// [`seconds`](Self::seconds), or `default` when the option is not given.
    pub(crate) fn seconds_or(
        &mut self,
        name: &'static str,
        max: Duration,
        default: Duration,
    ) -> Result<Duration> {
        Ok(self.seconds(name, max)?.unwrap_or(default))
    }

    /// A whole number from `range`.
    pub(crate) fn number<T>(
        &mut self,
        name: &'static str,
        range: std::ops::RangeInclusive<T>,
    ) -> Result<Option<T>>
    where
        T: std::str::FromStr + PartialOrd + fmt::Display,
    {
        self.parse_each(
            name,
            |v| v.parse::<T>().ok().filter(|n| range.contains(n)),
            |v| {
                format!(
                    "{name}={v:?}: a number from {} to {}",
                    range.start(),
                    range.end()
                )
            },
        )
    }

    /// `true`/`1`/`yes`/`on` or `false`/`0`/`no`/`off`.
    pub(crate) fn flag(&mut self, name: &'static str) -> Result<Option<bool>> {
        self.choice(
            name,
            &[
                ("true", true),
                ("1", true),
                ("yes", true),
                ("on", true),
                ("false", false),
                ("0", false),
                ("no", false),
                ("off", false),
            ],
            "write true or false",
        )
    }

    /// One of `choices`; otherwise an error ending with `hint`.
    pub(crate) fn choice<T: Copy>(
        &mut self,
        name: &'static str,
        choices: &[(&str, T)],
        hint: &str,
    ) -> Result<Option<T>> {
        self.parse_each(
            name,
            |v| choices.iter().find(|(c, _)| *c == v).map(|(_, t)| *t),
            |v| {
                format!(
                    "{name}={:?}: {hint}",
                    v.chars().take(40).collect::<String>()
                )
            },
        )
    }

    /// The insides of every option named `name[…]` (Symfony's `host[h:p]`), in order, taking
    /// them out; their values must be empty.
    pub(crate) fn take_bracketed(&mut self, name: &'static str) -> Result<Vec<String>> {
        self.known.push(name);
        let mut found = Vec::new();
        for slot in &mut self.pairs {
            let inside = slot.as_ref().and_then(|(k, _)| {
                k.strip_prefix(name)?
                    .strip_prefix('[')?
                    .strip_suffix(']')
                    .map(str::to_owned)
            });
            if let Some(inside) = inside {
                if slot.as_ref().is_some_and(|(_, v)| !v.is_empty()) {
                    return Err(self.dsn.invalid(format!("{name}[…] takes no value")));
                }
                *slot = None;
                found.push(inside);
            }
        }
        Ok(found)
    }

    /// Options accepted and dropped (another client's pool settings, say), so one DSN serves both.
    pub(crate) fn ignore(&mut self, names: &[&str]) {
        for slot in &mut self.pairs {
            if slot
                .as_ref()
                .is_some_and(|(k, _)| names.contains(&k.as_str()))
            {
                *slot = None;
            }
        }
    }

    /// The options of `driver` (PostgreSQL's `options[…]` too when it lists `options`), taken
    /// out in order to be handed to the driver as given.
    pub(crate) fn pass_through(
        &mut self,
        driver: &'static [&'static str],
    ) -> Vec<(String, String)> {
        self.driver = driver;
        let theirs = |k: &str| {
            driver.contains(&k) || (driver.contains(&"options") && k.starts_with("options["))
        };
        self.pairs
            .iter_mut()
            .filter(|slot| slot.as_ref().is_some_and(|(k, _)| theirs(k)))
            .filter_map(Option::take)
            .collect()
    }

    /// Refuses any option not taken, naming it and, when one is close, the option it meant.
    pub(crate) fn finish(self) -> Result<()> {
        let Some((name, _)) = self.pairs.iter().flatten().next() else {
            return Ok(());
        };
        if name.contains(['@', '/', ':']) {
            // What follows a `?` in a password that was not percent-encoded.
            return Err(self.dsn.invalid(
                "an unknown option whose name is not shown: it may be part of a password \
                 (percent-encode ?, @ and / in credentials: %3F, %40, %2F)",
            ));
        }
        let shown: String = name.chars().take(40).collect();
        let meant = self
            .known
            .iter()
            .chain(self.driver)
            .filter(|k| squash(k) == squash(name) || edits(name, k) <= 2)
            .min_by_key(|k| edits(name, k));
        let mut why = match meant {
            Some(k) => format!("unknown option {shown:?}; did you mean {k:?}?"),
            None => format!(
                "unknown option {shown:?}; the options are {}",
                self.listed()
            ),
        };
        why.truncate(1000);
        Err(self.dsn.invalid(why))
    }

    fn listed(&self) -> String {
        let mut ours = self.known.clone();
        ours.dedup();
        match self.driver {
            [] => ours.join(", "),
            driver => format!(
                "{}, and the driver's {}",
                ours.join(", "),
                driver.join(", ")
            ),
        }
    }
}

/// A name with only its letters and digits, lower-cased (`socket-Timeout` is `sockettimeout`).
fn squash(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The edit distance of two short names (insertions, deletions, substitutions, and a swap of
/// two neighbours counted as one).
pub(crate) fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().take(64).collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// `host[:port]` or `[v6][:port]`: the host (IPv6 kept in brackets) and the port, `default`
/// when none is given. Errors say what is wrong with it.
pub(crate) fn host_port<'h>(
    dsn: &Dsn<'_>,
    hostport: &'h str,
    default: u16,
) -> Result<(&'h str, u16)> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err(dsn.invalid("an unclosed IPv6 address"));
        };
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| dsn.invalid("junk after an IPv6 address"))?,
            ),
        };
        (&hostport[..v6.len() + 2], port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() || host.contains(['/', '?', '#', '@', ' ']) {
        return Err(dsn.invalid("no host"));
    }
    let port = match port {
        None => default,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| dsn.invalid("the port must be a number from 1 to 65535"))?,
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dsn_splits_into_its_parts() {
        let d = Dsn::split("Redis://u%40x:p%2F@h1:1,h2/db/x#frag?a=1&b=%20#x", "Redis");
        assert_eq!(d.scheme, "redis");
        assert_eq!(d.written, "Redis");
        let u = d.url.unwrap();
        assert_eq!(u.userinfo, Some("u%40x:p%2F"));
        assert_eq!(u.hosts, "h1:1,h2");
        assert_eq!(u.path, "db/x");
        assert_eq!(u.query, "a=1&b=%20");
        assert_eq!(u.fragment, Some("frag"));
        let (user, password) = d.credentials().unwrap().unwrap();
        assert_eq!((user.as_str(), password.as_deref()), ("u@x", Some("p/")));
        assert!(!format!("{d:?}").contains("p%2F"));
        let d = Dsn::split("sqlite::memory:?table=t", "SQLite");
        assert!(d.url.is_none());
        let mut o = d.options();
        assert_eq!(o.take("table").as_deref(), Some("t"));
        o.finish().unwrap();
    }

    #[test]
    fn options_are_typed_and_unknown_ones_refused_by_name() {
        let d = Dsn::split("x://h?t=0.5&n=7&f=yes&k=b&t=2&sslmode=x&junk=1", "X");
        let mut o = d.options();
        assert_eq!(
            o.seconds("t", Duration::from_secs(10)).unwrap(),
            Some(Duration::from_secs(2)),
            "the last one wins"
        );
        assert_eq!(o.number("n", 1u32..=9).unwrap(), Some(7));
        let d2 = Dsn::split("x://h?t=x&t=2", "X");
        assert!(
            d2.options().seconds("t", Duration::from_secs(10)).is_err(),
            "a bad value hidden by a later one"
        );
        assert_eq!(o.flag("f").unwrap(), Some(true));
        assert_eq!(
            o.choice("k", &[("a", 1), ("b", 2)], "a or b").unwrap(),
            Some(2)
        );
        assert_eq!(o.take("absent"), None);
        assert_eq!(
            o.pass_through(&["sslmode"]),
            [("sslmode".into(), "x".into())]
        );
        let err = o.finish().unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid X connection string \"x:\": unknown option \"junk\"; the options are t, n, \
             f, k, absent, and the driver's sslmode"
        );
        let d = Dsn::split("x://u:pa?ss@h/db", "X");
        let err = d.options().finish().unwrap_err().to_string();
        assert!(!err.contains("ss@"), "{err}");
        let d = Dsn::split("x://h?socket-timeout=1", "X");
        let mut o = d.options();
        let _ = o.take("socket_timeout");
        let err = o.finish().unwrap_err().to_string();
        assert!(err.ends_with("did you mean \"socket_timeout\"?"), "{err}");
        let d = Dsn::split("x://h?t=-1&n=0", "X");
        let mut o = d.options();
        let err = o.seconds("t", Duration::from_secs(10)).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("t must be a positive number of seconds, at most 10")
        );
        assert!(o.number("n", 1u32..=9).is_err());
    }

    #[test]
    fn hosts_and_ports() {
        let d = Dsn::split("x://", "X");
        assert_eq!(host_port(&d, "h", 5).unwrap(), ("h", 5));
        assert_eq!(host_port(&d, "h:7", 5).unwrap(), ("h", 7));
        assert_eq!(host_port(&d, "[::1]:7", 5).unwrap(), ("[::1]", 7));
        assert_eq!(host_port(&d, "[::1]", 5).unwrap(), ("[::1]", 5));
        for bad in ["", ":7", "h:0", "h:x", "[::1", "[::1]x"] {
            assert!(host_port(&d, bad, 5).is_err(), "{bad}");
        }
    }
}
