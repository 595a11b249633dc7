//! The pub/sub lock protocol's pure parts (portalocker 4.x `RedisLock`, protocol version 1):
//! what is answered and how, how a reply is classified, and the decisions a reader, a fresh
//! writer, an elected writer and a freshly promoted writer take from a conclusive probe; which
//! connections a reaper kills. No I/O: the store's connection code feeds these functions what it
//! read and acts on what they return, so every rule is tested here on its own.
//!
//! Ids are compared as byte strings (Python compares `str` by code point, the same order for
//! UTF-8), and any string is accepted as an id, though real ones are 32 lowercase hex digits.

// The store that drives these functions is built on top of them, step by step; until it lands
// only the tests call them.

use serde_json::Value;

/// A participant's mode as it advertises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    Shared,
    Pending,
    Exclusive,
}

impl Wire {
    fn as_str(self) -> &'static str {
        match self {
            Wire::Shared => "shared",
            Wire::Pending => "pending",
            Wire::Exclusive => "exclusive",
        }
    }
}

/// One participant as a probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub holder_id: String,
    pub mode: Wire,
    /// `None`: unknown (a 4.0 or 4.1 peer, or a legacy one).
    pub elected: Option<bool>,
    /// A reply that is not a protocol-1 record (3.2.0's timestamp, garbage, a future protocol):
    /// treated as an exclusive holder.
    pub legacy: bool,
}

impl Record {
    pub(crate) fn new(holder_id: &str, mode: Wire, elected: Option<bool>) -> Record {
        Record {
            holder_id: holder_id.to_owned(),
            mode,
            elected,
            legacy: false,
        }
    }
}

/// The one ping this peer publishes, byte for byte Python's form.
pub(crate) fn ping(response_channel: &str) -> String {
    format!(
        "{{\"message\": \"ping\", \"response_channel\": {}}}",
        Value::from(response_channel)
    )
}

/// The answer to a ping, byte for byte Python's: keys in this order, `", "` and `": "`, ASCII.
/// The id is this peer's own (32 hex digits), so it needs no escaping.
pub(crate) fn reply(holder_id: &str, mode: Wire, elected: bool) -> String {
    format!(
        "{{\"holder_id\": \"{holder_id}\", \"mode\": \"{}\", \"protocol\": 1, \"elected\": {elected}}}",
        mode.as_str()
    )
}

/// Where to answer a frame on the lock channel: its `response_channel` when the payload is a
/// JSON object with a non-empty string there; nothing else is checked, and anything else
/// (invalid UTF-8 included) is ignored.
pub(crate) fn response_channel(payload: &[u8]) -> Option<String> {
    if payload.is_empty() {
        return None;
    }
    let text = std::str::from_utf8(payload).ok()?;
    let value: Value = serde_json::from_str(text).ok()?;
    match value.get("response_channel")? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// Classifies a reply as Python does. `legacy_seen` is the number of legacy replies already
/// collected in this probe: a legacy one becomes `legacy-<n>`, exclusive.
pub(crate) fn classify(payload: &[u8], legacy_seen: usize) -> Record {
    let legacy = || Record {
        holder_id: format!("legacy-{legacy_seen}"),
        mode: Wire::Exclusive,
        elected: None,
        legacy: true,
    };
    let Some(value) = std::str::from_utf8(payload)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
    else {
        return legacy();
    };
    let Some(object) = value.as_object() else {
        return legacy();
    };
    // Python's `== 1`: 1, 1.0 and true.
    let protocol_one = match object.get("protocol") {
        Some(Value::Number(n)) => n.as_f64() == Some(1.0),
        Some(Value::Bool(b)) => *b,
        _ => false,
    };
    let (Some(Value::String(id)), Some(Value::String(mode)), true) =
        (object.get("holder_id"), object.get("mode"), protocol_one)
    else {
        return legacy();
    };
    let mode = match mode.as_str() {
        "shared" => Wire::Shared,
        "pending" => Wire::Pending,
        "exclusive" => Wire::Exclusive,
        _ => return legacy(),
    };
    let elected = match object.get("elected") {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    };
    Record::new(id, mode, elected)
}

/// What a probe's records say to a reader.
pub(crate) fn reader_may_hold(own: &str, records: &[Record]) -> bool {
    records
        .iter()
        .filter(|r| r.holder_id != own)
        .all(|r| r.mode == Wire::Shared && !r.legacy)
}

fn others<'a>(own: &'a str, records: &'a [Record]) -> impl Iterator<Item = &'a Record> + 'a {
    records.iter().filter(move |r| r.holder_id != own)
}

/// Whether a fresh (not yet elected) writer wins the election: no exclusive record, no other
/// incumbent (`elected: true`), and the lowest pending id is its own. Readers do not take part.
pub(crate) fn elected(own: &str, records: &[Record]) -> bool {
    if records.iter().any(|r| r.mode == Wire::Exclusive) {
        return false;
    }
    if others(own, records).any(|r| r.elected == Some(true)) {
        return false;
    }
    let lowest = records
        .iter()
        .filter(|r| r.mode == Wire::Pending)
        .map(|r| r.holder_id.as_bytes())
        .chain(std::iter::once(own.as_bytes()))
        .min();
    lowest == Some(own.as_bytes())
}

/// What an elected writer does on a conclusive probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incumbent {
    /// Give the election up and drop the subscription.
    Forfeit,
    /// Keep the subscription and the election; try again later (readers present, or the
    /// hold-off for a lower-id writer that may not have seen the election yet).
    Wait,
    /// Promote to exclusive, then confirm.
    Promote,
}

pub(crate) fn incumbent(own: &str, records: &[Record]) -> Incumbent {
    let lower = |r: &Record| r.holder_id.as_bytes() < own.as_bytes();
    let forfeit = others(own, records).any(|r| {
        r.mode == Wire::Exclusive
            || (r.elected == Some(true) && lower(r))
            || (r.mode == Wire::Pending && r.elected.is_none() && lower(r))
    });
    if forfeit {
        return Incumbent::Forfeit;
    }
    if others(own, records).any(|r| r.mode == Wire::Shared) {
        return Incumbent::Wait;
    }
    if others(own, records).any(|r| r.mode == Wire::Pending && r.elected == Some(false) && lower(r))
    {
        return Incumbent::Wait;
    }
    Incumbent::Promote
}

/// A confirm round's verdict for a freshly promoted (exclusive) writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Confirm {
    Confirmed,
    Demote,
    /// A lower-id writer is undecided: another round.
    Retry,
}

pub(crate) fn confirm(own: &str, records: &[Record]) -> Confirm {
    let mut retry = false;
    for r in others(own, records) {
        let lower = r.holder_id.as_bytes() < own.as_bytes();
        match r.mode {
            Wire::Shared => return Confirm::Demote,
            Wire::Exclusive if r.legacy || r.elected.is_none() || lower => return Confirm::Demote,
            Wire::Exclusive => {}
            Wire::Pending if !lower => {}
            Wire::Pending if r.elected.is_none() => return Confirm::Demote,
            Wire::Pending => retry = true,
        }
    }
    if retry {
        Confirm::Retry
    } else {
        Confirm::Confirmed
    }
}

/// The name of a holder's subscription connection: `C-lock-<id>`.
pub(crate) fn connection_name(channel: &str, holder_id: &str) -> String {
    format!("{channel}-lock-{holder_id}")
}

fn is_holder_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The client ids to `CLIENT KILL` after a probe on `channel` that the count held steady for but
/// that some subscribers left unanswered: connections named `C-lock-<32 hex>` whose id did not
/// reply, and `C-lock` (a legacy holder) when no legacy reply came. Nothing else: unnamed and
/// foreign connections are never killed. `client_list` is `CLIENT LIST`'s reply (RESP3's `txt:`
/// prefix tolerated).
pub(crate) fn reap_targets(
    channel: &str,
    client_list: &str,
    responding: &[String],
    legacy_replied: bool,
) -> Vec<u64> {
    let list = client_list.strip_prefix("txt:").unwrap_or(client_list);
    let legacy_name = format!("{channel}-lock");
    let prefix = format!("{channel}-lock-");
    let mut out = Vec::new();
    for line in list.lines() {
        let mut id = None;
        let mut name = "";
        for field in line.split(' ') {
            match field.split_once('=') {
                Some(("id", v)) => id = v.parse::<u64>().ok(),
                Some(("name", v)) => name = v,
                _ => {}
            }
        }
        let Some(id) = id else { continue };
        let kill = if name == legacy_name {
            !legacy_replied
        } else {
            name.strip_prefix(&prefix).is_some_and(|suffix| {
                is_holder_id(suffix) && !responding.iter().any(|r| r == suffix)
            })
        };
        if kill {
            out.push(id);
        }
    }
    out
}

/// Why a channel name cannot be a lock: the subscription connection is named after it, and
/// Redis refuses client names with spaces, control characters or non-ASCII.
pub(crate) fn invalid_channel(channel: &str) -> Option<&'static str> {
    if channel.is_empty() {
        return Some("it is empty");
    }
    if !channel.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Some("only printable ASCII without spaces (! to ~) can name a client connection");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(id: &str, mode: Wire, elected: Option<bool>) -> Record {
        Record::new(id, mode, elected)
    }

    fn legacy(n: usize) -> Record {
        Record {
            holder_id: format!("legacy-{n}"),
            mode: Wire::Exclusive,
            elected: None,
            legacy: true,
        }
    }

    use Wire::{Exclusive, Pending, Shared};

    #[test]
    fn wire_forms_are_pythons_byte_for_byte() {
        assert_eq!(
            ping("demoB-266d2713df614915be9345b5dcafefb7"),
            r#"{"message": "ping", "response_channel": "demoB-266d2713df614915be9345b5dcafefb7"}"#
        );
        assert_eq!(
            reply("c455c4a7a3694c7aa60fb476ea8fd7ec", Pending, true),
            r#"{"holder_id": "c455c4a7a3694c7aa60fb476ea8fd7ec", "mode": "pending", "protocol": 1, "elected": true}"#
        );
        assert_eq!(
            reply("ddc8c36e86a3486684e386c7b8652554", Shared, false),
            r#"{"holder_id": "ddc8c36e86a3486684e386c7b8652554", "mode": "shared", "protocol": 1, "elected": false}"#
        );
    }

    #[test]
    fn only_objects_with_a_response_channel_are_answered() {
        let ours = ping("C-abc");
        assert_eq!(response_channel(ours.as_bytes()).as_deref(), Some("C-abc"));
        let legacy_form = br#"{"response_channel": "demo-0.8444218515250481", "message": "ping"}"#;
        assert_eq!(
            response_channel(legacy_form).as_deref(),
            Some("demo-0.8444218515250481")
        );
        assert_eq!(
            response_channel(br#"{"response_channel": "R", "message": "other"}"#).as_deref(),
            Some("R"),
            "the message's value is not checked"
        );
        for ignored in [
            &b""[..],
            b"\xff\xfe",
            b"not json",
            b"[1]",
            b"{}",
            br#"{"response_channel": ""}"#,
            br#"{"response_channel": 7}"#,
            br#"{"message": "ping"}"#,
        ] {
            assert_eq!(response_channel(ignored), None, "{ignored:?}");
        }
    }

    #[test]
    fn replies_are_classified_as_python_does() {
        let elected = |text: &str| classify(text.as_bytes(), 0).elected;
        let base =
            |e: &str| format!(r#"{{"holder_id": "h", "mode": "pending", "protocol": 1{e}}}"#);
        assert_eq!(elected(&base(r#", "elected": true"#)), Some(true));
        assert_eq!(elected(&base(r#", "elected": false"#)), Some(false));
        assert_eq!(elected(&base("")), None);
        assert_eq!(elected(&base(r#", "elected": "yes""#)), None);
        assert_eq!(classify(b"123.45", 7), legacy(7));
        for bad in [
            r#"{"holder_id": 5, "mode": "shared", "protocol": 1}"#,
            r#"{"holder_id": "h", "mode": 5, "protocol": 1}"#,
            r#"{"holder_id": "h", "mode": "unknown", "protocol": 1}"#,
            r#"{"holder_id": "h", "mode": "shared", "protocol": 2}"#,
            "\u{0}",
        ] {
            assert_eq!(classify(bad.as_bytes(), 0), legacy(0), "{bad}");
        }
        assert_eq!(classify(b"\xff", 1), legacy(1));
        for one in ["1", "1.0", "true"] {
            let text = format!(r#"{{"holder_id": "h", "mode": "shared", "protocol": {one}}}"#);
            assert!(!classify(text.as_bytes(), 0).legacy, "protocol {one}");
        }
        let record = classify(
            br#"{"holder_id": "fcb6e37237ea4839b80185b11f94d03c", "mode": "exclusive", "protocol": 1, "extra": 1}"#,
            0,
        );
        assert_eq!(
            record,
            r("fcb6e37237ea4839b80185b11f94d03c", Exclusive, None)
        );
    }

    #[test]
    fn readers_share_only_with_readers() {
        assert!(reader_may_hold("me", &[r("me", Shared, Some(false))]));
        assert!(reader_may_hold(
            "me",
            &[r("me", Shared, Some(false)), r("x", Shared, Some(false))]
        ));
        for blocker in [
            r("x", Pending, Some(false)),
            r("x", Pending, Some(true)),
            r("x", Exclusive, Some(true)),
            legacy(0),
        ] {
            assert!(
                !reader_may_hold("me", &[r("me", Shared, Some(false)), blocker.clone()]),
                "{blocker:?}"
            );
        }
    }

    #[test]
    fn the_lowest_pending_id_is_elected_unless_an_incumbent_is_there() {
        let p = |id| r(id, Pending, Some(false));
        assert!(!elected("bbb", &[p("aaa"), p("bbb")]));
        assert!(elected("bbb", &[p("bbb"), p("ccc")]));
        assert!(
            !elected("bbb", &[p("bbb"), r("zzz", Pending, Some(true))]),
            "defers"
        );
        assert!(elected("aaa", &[p("aaa"), p("bbb")]));
        assert!(!elected("bbb", &[p("aaa"), p("bbb")]));
        assert!(
            elected("me", &[p("me"), r("a-reader", Shared, Some(false))]),
            "readers do not vote"
        );
        assert!(!elected("me", &[p("me"), legacy(0)]));
        assert!(!elected("me", &[p("me"), r("zz", Exclusive, Some(false))]));
        assert!(
            !elected("b", &[p("b"), r("a", Pending, None)]),
            "4.1 peers sort too"
        );
    }

    #[test]
    fn an_incumbent_waits_holds_off_forfeits_or_promotes() {
        let me = "z-incumbent";
        let own = r(me, Pending, Some(true));
        let newcomer = r("a-newcomer", Pending, Some(false));
        let reader = r("reader", Shared, Some(false));
        assert_eq!(
            incumbent(me, &[own.clone(), newcomer.clone(), reader]),
            Incumbent::Wait
        );
        assert_eq!(
            incumbent(me, &[own.clone(), newcomer]),
            Incumbent::Wait,
            "hold-off"
        );
        assert_eq!(
            incumbent(me, std::slice::from_ref(&own)),
            Incumbent::Promote
        );

        let low = r("a-low", Pending, Some(true));
        assert_eq!(
            incumbent("a-low", &[low, r("z-high", Pending, Some(false))]),
            Incumbent::Promote,
            "higher ids are ignored"
        );
        assert_eq!(
            incumbent(
                "m",
                &[r("m", Pending, Some(true)), r("a-old", Pending, None)]
            ),
            Incumbent::Forfeit
        );
        assert_eq!(
            incumbent(
                "m",
                &[r("m", Pending, Some(true)), r("z", Exclusive, Some(true))]
            ),
            Incumbent::Forfeit
        );
        assert_eq!(
            incumbent("m", &[r("m", Pending, Some(true)), legacy(0)]),
            Incumbent::Forfeit
        );
        // Two incumbents: the lower id keeps the election.
        let two = [r("a", Pending, Some(true)), r("b", Pending, Some(true))];
        assert_eq!(incumbent("b", &two), Incumbent::Forfeit);
        assert_eq!(incumbent("a", &two), Incumbent::Promote);
    }

    #[test]
    fn confirm_verdicts() {
        let me = "m-just-promoted";
        let own = r(me, Exclusive, Some(true));
        let cases: Vec<(Vec<Record>, Confirm)> = vec![
            (vec![], Confirm::Confirmed),
            (vec![r("reader", Shared, Some(false))], Confirm::Demote),
            (vec![legacy(0)], Confirm::Demote),
            (vec![r("z-old-rival", Exclusive, None)], Confirm::Demote),
            (vec![r("a-rival", Exclusive, Some(true))], Confirm::Demote),
            (
                vec![r("z-rival", Exclusive, Some(false))],
                Confirm::Confirmed,
            ),
            (vec![r("a-old-peer", Pending, None)], Confirm::Demote),
            (vec![r("a-peer", Pending, Some(false))], Confirm::Retry),
            (vec![r("a-peer", Pending, Some(true))], Confirm::Retry),
            (vec![r("z-peer", Pending, Some(false))], Confirm::Confirmed),
            (
                vec![
                    r("a-peer", Pending, Some(false)),
                    r("a-rival", Exclusive, Some(true)),
                ],
                Confirm::Demote,
            ),
        ];
        for (others, verdict) in cases {
            let mut records = vec![own.clone()];
            records.extend(others.iter().cloned());
            assert_eq!(confirm(me, &records), verdict, "{others:?}");
        }
    }

    #[test]
    fn reaping_kills_silent_named_holders_only() {
        let a = "a".repeat(32);
        let b = "b".repeat(32);
        let list = format!(
            "id=1 addr=x name=ch-lock-{a} flags=P\n\
             id=2 addr=x name=ch-lock-{b} flags=P\n\
             id=3 addr=x name=ch-lock-notahexid flags=P\n\
             id=4 addr=x name=ch-lock flags=P\n\
             id=5 addr=x name= flags=P\n\
             id=6 addr=x name={b}-lock-x-lock-{a} flags=P\n"
        );
        assert_eq!(
            reap_targets("ch", &list, std::slice::from_ref(&a), false),
            [2, 4]
        );
        assert_eq!(
            reap_targets("ch", &list, std::slice::from_ref(&a), true),
            [2],
            "a legacy reply spares C-lock"
        );
        assert_eq!(
            reap_targets(&b, &format!("txt:{list}"), &[], false),
            Vec::<u64>::new(),
            "a holder of channel <b>-lock-x survives a reap on <b>"
        );
        assert_eq!(reap_targets("ch", "", &[], false), Vec::<u64>::new());
    }

    #[test]
    fn channels_must_name_a_client() {
        assert_eq!(invalid_channel("demo:jobs/7"), None);
        assert!(invalid_channel("").is_some());
        assert!(invalid_channel("has space").is_some());
        assert!(invalid_channel("ünï").is_some());
        assert!(invalid_channel("tab\there").is_some());
        assert_eq!(
            connection_name("demoB", "9a285e4c7911411da16ebc3b6d7d0476"),
            "demoB-lock-9a285e4c7911411da16ebc3b6d7d0476"
        );
    }
}
