//! The metadata `run` and `acquire` give their lock (who holds it, for `status`, `list` and
//! `leader`), and how a holder's metadata is shown.
//!
//! A compact JSON object: `host`, `pid` (xtr-lock's own: the command's is not known before the
//! lock is saved), `cmd` (`run`'s command, never xtr-lock's own arguments, which carry the
//! store's DSN), `id` (`$XTR_LOCK_ID`), then `--meta KEY=VALUE`. Anyone who can reach the store
//! reads it, so every word of the command that could carry a credential is redacted.

use std::ffi::OsString;

use anyhow::{Result, anyhow};
use serde_json::{Map, Value};
use xtr_lock::{MAX_META, StoreFactory};

/// The variable whose value becomes the metadata's `id`.
pub(crate) const ID_ENV: &str = "XTR_LOCK_ID";

/// The holder's metadata: the defaults, `--meta` pairs over them (`KEY=` drops a key), the
/// command shortened so that the whole stays within [`MAX_META`].
///
/// # Errors
///
/// A pair without `=` or with an empty key; metadata over the cap even without the command.
pub(crate) fn holder_meta(pairs: &[String], command: Option<&[OsString]>) -> Result<Vec<u8>> {
    let mut object = Map::new();
    if let Some(host) = host() {
        object.insert("host".into(), Value::String(host));
    }
    object.insert("pid".into(), Value::from(std::process::id()));
    if let Some(words) = command {
        object.insert("cmd".into(), Value::String(command_line(words)));
    }
    if let Some(id) = std::env::var_os(ID_ENV).filter(|v| !v.is_empty()) {
        object.insert(
            "id".into(),
            Value::String(id.to_string_lossy().into_owned()),
        );
    }
    for pair in pairs {
        let (key, value) = pair
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| anyhow!("--meta {pair:?}: give KEY=VALUE (KEY= drops KEY)"))?;
        // Read by anyone who can list the store: a value under a secret's name, or a URL's
        // password in it, is not kept.
        if value.is_empty() {
            object.remove(key);
            continue;
        }
        let value = match secret_name(key) {
            true => "***".to_owned(),
            false => redact_text(value),
        };
        object.insert(key.to_owned(), Value::String(value));
    }
    fit(object)
}

/// The object as bytes, its `cmd` shortened (ending in `…`) until the whole fits the cap.
fn fit(mut object: Map<String, Value>) -> Result<Vec<u8>> {
    let encoded = Value::Object(object.clone()).to_string().into_bytes();
    if encoded.len() <= MAX_META {
        return Ok(encoded);
    }
    let over = encoded.len() - MAX_META;
    if let Some(Value::String(cmd)) = object.get("cmd") {
        // The JSON escapes of what is cut may be longer than its characters: cut until it fits.
        let mut keep = cmd.chars().count().saturating_sub(over + 1);
        loop {
            let short: String = cmd.chars().take(keep).chain(['…']).collect();
            let mut shorter = object.clone();
            shorter.insert("cmd".into(), Value::String(short));
            let encoded = Value::Object(shorter).to_string().into_bytes();
            if encoded.len() <= MAX_META {
                return Ok(encoded);
            }
            if keep == 0 {
                break;
            }
            keep = keep.saturating_sub(16.max(keep / 8));
        }
        object.remove("cmd");
    }
    let len = Value::Object(object).to_string().len();
    Err(anyhow!(
        "--meta: the holder metadata would be {len} bytes even without the command; at most \
         {MAX_META} bytes are kept (the cap of xtr_lock::MAX_META)"
    ))
}

/// This machine's name, as `uname -n` gives it.
fn host() -> Option<String> {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy().into_owned();
    (!name.is_empty()).then_some(name)
}

/// The command's words, space-separated, each that could carry a credential redacted.
fn command_line(words: &[OsString]) -> String {
    let joined: Vec<String> = words
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    redact_text(&joined.join(" "))
}

/// Option names whose values are secrets: `--password=…`, `PGPASSWORD=…`, `token=…`.
const SECRET_NAMES: &[&str] = &[
    "pass",
    "pwd",
    "secret",
    "token",
    "auth",
    "key",
    "credential",
    "cookie",
    "bearer",
];

/// Short options whose next word (or the rest of the word: `-psecret`) is a password in common
/// tools (`mysql -p`, `redis-cli -a`, `sshpass -p`, `curl -u user:pass`).
const SECRET_SHORT: &[&str] = &["-p", "-a", "-u"];

/// `text` (a command line: a `sh -c` script is one word of many) with each whitespace-separated
/// token that could carry a credential redacted ([`redact_token`]), and the token after an
/// option named like a secret's (`--password hunter2`).
pub(crate) fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut secret_next = false;
    while !rest.is_empty() {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let token = &rest[..end];
        match secret_next && !token.is_empty() {
            true => out.push_str("***"),
            false => out.push_str(&redact_token(token)),
        }
        if !token.is_empty() {
            secret_next = announces_secret(token);
        }
        let next = rest[end..]
            .find(|c: char| !c.is_whitespace())
            .map_or(rest.len(), |i| end + i);
        out.push_str(&rest[end..next]);
        rest = &rest[next..];
    }
    out
}

/// Whether the word after `token` is a secret: after an option named like one
/// (`--password`), a short option of [`SECRET_SHORT`], a header name like one
/// (`Authorization:`), or an authentication scheme (`Bearer`).
fn announces_secret(token: &str) -> bool {
    let bare = token.trim_matches(['"', '\'']);
    (bare.starts_with('-')
        && !bare.contains('=')
        && (secret_name(bare) || SECRET_SHORT.contains(&bare)))
        || (bare.ends_with(':') && secret_name(bare))
        || ["bearer", "basic", "token"].contains(&bare.to_ascii_lowercase().as_str())
}

/// Whether an option or variable name looks like a secret's (`--db-password`, `PGPASSWORD`).
fn secret_name(name: &str) -> bool {
    let lower = name
        .trim_start_matches(['-', '"', '\''])
        .to_ascii_lowercase();
    SECRET_NAMES.iter().any(|s| lower.contains(s))
}

/// `token` with what could be a credential replaced: a URL's password (and secret query
/// options) as [`StoreFactory::redact`] shows DSNs, wherever the URL starts in the token
/// (`--url=postgres://u:pw@h/db`); the value of `NAME=value` when NAME looks like a secret's.
fn redact_token(token: &str) -> String {
    if let Some(at) = token.find("://") {
        // The URL starts where its scheme does: after the last character no scheme has.
        let start = token[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
            .map_or(0, |i| i + 1);
        let url = &token[start..];
        if url.contains('@') || url.contains('?') {
            return format!("{}{}", &token[..start], StoreFactory::redact(url));
        }
        return token.to_owned();
    }
    if let Some(short) = SECRET_SHORT.iter().find(|s| token.starts_with(**s))
        && token.len() > 2
        && !token.starts_with("--")
    {
        // `-psecret`: the value is the rest of the word.
        return format!("{short}***");
    }
    if token.contains(';') {
        // `Server=h;User Id=u;Password=pw`: each pair on its own.
        let parts: Vec<String> = token.split(';').map(redact_pair).collect();
        return parts.join(";");
    }
    redact_userinfo(&redact_pair(token))
}

/// `NAME=value` with the value redacted when NAME looks like a secret's.
fn redact_pair(pair: &str) -> String {
    match pair.split_once('=') {
        Some((name, value)) if !value.is_empty() && secret_name(name) => format!("{name}=***"),
        _ => pair.to_owned(),
    }
}

/// `user:pass@host` (no scheme: `scp`, `curl -u`'s form in a URL-less word) with the password
/// redacted: a `:` before the first `@`.
fn redact_userinfo(token: &str) -> String {
    match token.split_once('@') {
        Some((user, host)) if user.contains(':') && !host.is_empty() => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{name}:***@{host}")
        }
        _ => token.to_owned(),
    }
}

/// A holder's metadata for JSON output: the JSON it is, else its text (invalid UTF-8 replaced).
pub(crate) fn value(meta: &[u8]) -> Value {
    serde_json::from_slice(meta)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(meta).into_owned()))
}

/// A holder's metadata for a line: compact JSON when it is JSON, else its text with every
/// character that is not printable escaped (`\n`, `\u{1b}`), so that it cannot move the cursor
/// or forge lines.
pub(crate) fn text(meta: &[u8]) -> String {
    match serde_json::from_slice::<Value>(meta) {
        // serde_json escapes control characters in strings.
        Ok(v) => v.to_string(),
        Err(_) => String::from_utf8_lossy(meta)
            .chars()
            .flat_map(|c| match c.is_control() {
                true => c.escape_default().collect::<Vec<_>>(),
                false => vec![c],
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_words_are_redacted() {
        let redact_word = redact_text;
        assert_eq!(redact_word("postgres://u:pw@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact_word("exec  x postgres://u:pw@h/db --password hunter2 -v"),
            "exec  x postgres://u:***@h/db --password *** -v"
        );
        let r = redact_word("--url=redis://:secret@h:6379/0");
        assert!(
            r.starts_with("--url=redis://") && !r.contains("secret"),
            "{r}"
        );
        let r = redact_word("https://api/x?token=abc");
        assert!(!r.contains("abc"), "{r}");
        assert_eq!(redact_word("PGPASSWORD=pw"), "PGPASSWORD=***");
        assert_eq!(redact_word("--db-password=pw"), "--db-password=***");
        assert_eq!(
            redact_word("https://example.com/a"),
            "https://example.com/a"
        );
        assert_eq!(redact_word("sleep"), "sleep");
    }

    /// Review finding: `--meta` values were stored as typed, credentials included.
    #[test]
    fn meta_values_under_secret_names_or_with_passwords_are_redacted() {
        let pairs = [
            "db_password=hunter2".to_owned(),
            "API_TOKEN=abc".to_owned(),
            "source=postgres://u:pw@h/db".to_owned(),
            "role=primary".to_owned(),
            "token=".to_owned(),
        ];
        let meta = String::from_utf8(holder_meta(&pairs, None).unwrap()).unwrap();
        for secret in ["hunter2", "abc", ":pw@"] {
            assert!(!meta.contains(secret), "{meta}");
        }
        assert!(meta.contains(r#""db_password":"***""#), "{meta}");
        assert!(meta.contains("postgres://u:***@h/db"), "{meta}");
        assert!(meta.contains(r#""role":"primary""#), "{meta}");
        assert!(!meta.contains(r#""token""#), "KEY= drops it: {meta}");
    }

    /// Review finding: the forms common tools take passwords in were stored in clear.
    #[test]
    fn common_tools_password_forms_are_redacted() {
        for (line, secret) in [
            ("mysql -psecret db", "secret"),
            ("mysql -p secret db", "secret"),
            ("redis-cli -a pw123 ping", "pw123"),
            ("sshpass -p pw123 ssh h", "pw123"),
            ("curl -u user:pass https://h", "pass"),
            ("scp u:pw123@h:f .", "pw123"),
            ("app Server=h;User Id=u;Password=pw123", "pw123"),
            ("curl -H 'Authorization: Bearer tok123' h", "tok123"),
            ("API_KEY=k123 ./job", "k123"),
            ("./job --pass x123", "x123"),
        ] {
            let r = redact_text(line);
            assert!(!r.contains(secret), "{line} -> {r}");
        }
        assert_eq!(
            redact_text("git clone git@github.com:o/r"),
            "git clone git@github.com:o/r"
        );
        assert_eq!(redact_text("sleep 30"), "sleep 30");
    }

    #[test]
    fn the_command_is_shortened_to_fit_and_meta_overrides() {
        let long: Vec<OsString> = vec!["echo".into(), "x".repeat(5000).into()];
        let meta = holder_meta(&["role=primary".into(), "pid=".into()], Some(&long)).unwrap();
        assert!(meta.len() <= MAX_META, "{}", meta.len());
        let v: Value = serde_json::from_slice(&meta).unwrap();
        assert_eq!(v["role"], "primary");
        assert!(v.get("pid").is_none(), "KEY= drops it");
        assert!(v["cmd"].as_str().unwrap().ends_with('…'));
        let err = holder_meta(&[format!("big={}", "y".repeat(2000))], None).unwrap_err();
        assert!(err.to_string().contains("1024"), "{err}");
        assert!(holder_meta(&["novalue".into()], None).is_err());
    }

    #[test]
    fn text_escapes_what_is_not_printable() {
        assert_eq!(text(b"a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(text(br#"{"host":"h"}"#), r#"{"host":"h"}"#);
    }
}
