//! Keys handed between processes: what `acquire` prints and `release`, `refresh` and
//! `status --key` read back.
//!
//! One line of JSON around the library's own serialized key:
//!
//! ```json
//! {"xtr_lock_key":1,"store":["redis://h:6379/0"],"mode":"write","fencing_token":42,
//!  "lock":{"v":1,"resource":"job:7","remaining_ms":600000,"tokens":{"redis":"…"}}}
//! ```
//!
//! `store` lists where the lock lives as DSNs without a password (several: a quorum), with the
//! user name the lock was taken as (`postgres://app@db:5432/app`), so a key alone is enough to
//! release it where no password is needed; a `--store` given with it must name the same stores
//! (it may add the password). The library's bare form (what an older `acquire` printed) is still
//! read, with the store taken from `--store`.

use std::io::Read as _;

use anyhow::{Context as _, Result, anyhow};
use serde_json::{Value, json};
use xtr_lock::{Key, Lock, Lockable as _, Mode};

use crate::args::Source;
use crate::output::mode_name;
use crate::store::StoreConfig;

/// The envelope's version field, and its name.
const VERSION_FIELD: &str = "xtr_lock_key";

/// A key as handed in.
pub(crate) struct Handed {
    pub key: Key,
    /// Where the lock lives; `None` for a bare library key.
    pub stores: Option<Vec<String>>,
    pub mode: Option<Mode>,
    pub fencing_token: Option<u64>,
}

/// The line `acquire` prints for `lock`, taken on `store`.
pub(crate) fn envelope(lock: &Lock, store: &StoreConfig) -> Result<String> {
    let inner: Value = serde_json::from_str(&lock.key().to_json()?)?;
    let mode = lock.held_mode().map(mode_name);
    Ok(json!({
        VERSION_FIELD: 1,
        "store": store.locators,
        "mode": mode,
        "fencing_token": lock.fencing_token(),
        "lock": inner,
    })
    .to_string())
}

/// Reads a key from `arg`, or from stdin when it is absent or `-`.
pub(crate) fn read(arg: Option<String>) -> Result<Handed> {
    let text = match arg {
        Some(k) if k != "-" => k,
        _ => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| anyhow!("cannot read the key from stdin: {e}"))?;
            s
        }
    };
    parse(text.trim())
}

fn parse(text: &str) -> Result<Handed> {
    let not_a_key = |why: &str| anyhow!("the key is not one `xtr-lock acquire` printed: {why}");
    if text.is_empty() {
        return Err(not_a_key("it is empty"));
    }
    let value: Value = serde_json::from_str(text).map_err(|_| not_a_key("it is not JSON"))?;
    let Some(object) = value.as_object() else {
        return Err(not_a_key("it is not a JSON object"));
    };
    if !object.contains_key(VERSION_FIELD) {
        let key = Key::from_json(text).map_err(|e| not_a_key(&e.to_string()))?;
        return Ok(Handed {
            key,
            stores: None,
            mode: None,
            fencing_token: None,
        });
    }
    if object.get(VERSION_FIELD) != Some(&json!(1)) {
        return Err(not_a_key(
            "its version is not 1 (made by a newer xtr-lock?)",
        ));
    }
    for field in object.keys() {
        if ![VERSION_FIELD, "store", "mode", "fencing_token", "lock"].contains(&field.as_str()) {
            return Err(not_a_key(&format!("unknown field {field:?}")));
        }
    }
    let stores = match object.get("store") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) if !list.is_empty() => Some(
            list.iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| not_a_key("\"store\" is not a list of strings"))?,
        ),
        Some(_) => return Err(not_a_key("\"store\" is not a list of strings")),
    };
    let mode = match object.get("mode") {
        None | Some(Value::Null) => None,
        Some(v) if v == "write" => Some(Mode::Write),
        Some(v) if v == "read" => Some(Mode::Read),
        Some(_) => return Err(not_a_key("\"mode\" is neither write nor read")),
    };
    let fencing_token = match object.get("fencing_token") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| not_a_key("\"fencing_token\" is not a number"))?,
        ),
    };
    let inner = object
        .get("lock")
        .ok_or_else(|| not_a_key("it has no \"lock\""))?;
    let key = Key::from_json(&inner.to_string()).map_err(|e| not_a_key(&e.to_string()))?;
    Ok(Handed {
        key,
        stores,
        mode,
        fencing_token,
    })
}

/// The store a handed-in key is used on, and whether it is the key's own (opened from the
/// DSNs the key names, without a password).
pub(crate) struct KeyStore {
    pub store: StoreConfig,
    pub own: bool,
}

/// The store a handed-in key is used on: `--store` if given (it must name the key's stores,
/// as the same user when the key names one), else the key's own stores, with
/// `$XTR_LOCK_STORE`'s DSNs when they name the same ones (they may hold the password the key
/// leaves out); a bare key uses `--store`, the environment or the default.
pub(crate) fn store_for(handed: &Handed, source: &Source) -> Result<KeyStore> {
    let given = |store| KeyStore { store, own: false };
    let Some(stores) = &handed.stores else {
        let config = StoreConfig::open(source, true)?;
        refuse_local(&config, source)?;
        return Ok(given(config));
    };
    // A key made before keys kept the user name matches the store whoever logs in.
    let users_named = stores.iter().any(|s| *s != crate::store::without_user(s));
    let same = |config: &StoreConfig| {
        config.locators.as_ref().is_some_and(|mine| {
            let mut a: Vec<String> = match users_named {
                true => mine.clone(),
                false => mine.iter().map(|m| crate::store::without_user(m)).collect(),
            };
            let mut b = stores.clone();
            a.sort();
            b.sort();
            a == b
        })
    };
    let own = || {
        StoreConfig::from_dsns(stores)
            .context(OWN_STORE)
            .map(|store| KeyStore { store, own: true })
    };
    match source {
        source if source.explicit() => {
            let config = StoreConfig::open(source, true)?;
            refuse_local(&config, source)?;
            if !same(&config) {
                let named = source.name();
                return Err(anyhow!(
                    "the key was made on {}, not on the store {named} names ({}); leave \
                     {} out to use the key's own",
                    stores.join(","),
                    config.locators.unwrap_or_default().join(","),
                    if matches!(source, Source::Flag(_)) {
                        "--store"
                    } else {
                        "--config/--use"
                    }
                ));
            }
            Ok(given(config))
        }
        Source::Default => own(),
        // The environment's store (or configuration) is used when it names the key's stores.
        _ => match StoreConfig::open(source, true) {
            Ok(config) if same(&config) => Ok(given(config)),
            _ => own(),
        },
    }
}

/// What is said after an error on a key's own store: where the password goes, which a key never
/// carries.
pub(crate) const NO_PASSWORD: &str = "a key carries no password: if the store needs one, give \
     its DSN with --store or $XTR_LOCK_STORE (or, for PostgreSQL, $PGPASSWORD or ~/.pgpass)";

const OWN_STORE: &str = "the key names a store that cannot be opened";

/// Refuses stores whose locks cannot be handed to another process.
pub(crate) fn refuse_local(store: &StoreConfig, source: &Source) -> Result<()> {
    if store.keys_travel {
        return Ok(());
    }
    let hint = match source {
        Source::Default => {
            " (no --store was given and $XTR_LOCK_STORE is unset, so this is the default \
             store: a key printed by `acquire` names its own store)"
        }
        _ => "",
    };
    Err(anyhow!(
        "a {} lock cannot be handed to another process (it lives in this process: an open file \
         or memory){hint}; use `xtr-lock run` instead, or a store such as redis://",
        store.scheme
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "xG0BLBHzAYhlFXWY0pAvuKo9V9S/fn/+eHRyLXdha2U=";

    #[test]
    fn envelopes_and_bare_keys_both_read() {
        let inner = format!(
            r#"{{"v":1,"resource":"r","remaining_ms":5000,"tokens":{{"redis":"{TOKEN}"}}}}"#
        );
        let bare = parse(&inner).unwrap();
        assert_eq!(bare.key.resource(), "r");
        assert!(bare.stores.is_none());
        let full = format!(
            r#"{{"xtr_lock_key":1,"store":["redis://h:6379/0"],"mode":"read","fencing_token":7,"lock":{inner}}}"#
        );
        let handed = parse(&full).unwrap();
        assert_eq!(
            handed.stores.as_deref(),
            Some(&["redis://h:6379/0".to_owned()][..])
        );
        assert_eq!(handed.mode, Some(Mode::Read));
        assert_eq!(handed.fencing_token, Some(7));
    }

    #[test]
    fn bad_keys_say_what_is_wrong() {
        for (text, why) in [
            ("", "it is empty"),
            ("nope", "it is not JSON"),
            ("[1]", "it is not a JSON object"),
            (r#"{"xtr_lock_key":2}"#, "its version is not 1"),
            (r#"{"xtr_lock_key":1,"extra":1}"#, "unknown field \"extra\""),
            (
                r#"{"xtr_lock_key":1,"store":"redis://h"}"#,
                "\"store\" is not a list",
            ),
            (r#"{"xtr_lock_key":1}"#, "it has no \"lock\""),
        ] {
            let err = parse(text).err().expect(text).to_string();
            assert!(err.contains(why), "{text}: {err}");
            assert!(
                err.starts_with("the key is not one `xtr-lock acquire` printed"),
                "{err}"
            );
        }
    }
}
