//! `xtr-lock list [PREFIX]`: every resource held on a store, with its holders and what their
//! metadata says; and how a holder is described wherever the command shows one in detail
//! (`status` too).

use std::io::IsTerminal as _;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use serde_json::{Value, json};
use xtr_lock::store::{HolderInfo, Listing};

use crate::exit::Exit;
use crate::output::{mode_name, print, short};
use crate::store::StoreConfig;

/// `list`: one line per resource (a table with a header on a terminal, tab-separated fields
/// otherwise), or one JSON array; nothing held prints nothing (`[]`), exit 0.
pub(crate) async fn list(store: StoreConfig, prefix: String, json_out: bool) -> Result<Exit> {
    let mut listings = store.store.list(&prefix).await?;
    listings.sort_by(|a, b| a.resource.cmp(&b.resource));
    if json_out {
        let all: Vec<Value> = listings.iter().map(listing_json).collect();
        print(&Value::Array(all).to_string())?;
        return Ok(Exit::Ok);
    }
    let rows: Vec<[String; 7]> = listings.iter().map(row).collect();
    if rows.is_empty() {
        return Ok(Exit::Ok); // nothing held: nothing printed, not even the header
    }
    if std::io::stdout().is_terminal() {
        let header = [
            "RESOURCE", "MODE", "HOLDERS", "HELD FOR", "LEFT", "TOKEN", "WAITERS",
        ];
        table(&header.map(str::to_owned), &rows)?;
    } else {
        for row in &rows {
            print(&row.join("\t"))?;
        }
    }
    Ok(Exit::Ok)
}

/// The rows aligned under `header`, the last column left ragged.
fn table(header: &[String; 7], rows: &[[String; 7]]) -> Result<()> {
    let mut widths = header.each_ref().map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        print(cells.join("  ").trim_end())?;
    }
    Ok(())
}

/// One resource: resource, mode (or `n/limit permits`), holders, held for, left, fencing
/// tokens, waiters; `-` where nothing is known.
fn row(listing: &Listing) -> [String; 7] {
    let (waiting, holding): (Vec<&HolderInfo>, Vec<&HolderInfo>) =
        listing.holders.iter().partition(|h| h.waiting);
    let mode = match listing.semaphore {
        Some(limit) => {
            let used: u32 = holding.iter().map(|h| h.permits.unwrap_or(1)).sum();
            match limit {
                0 => format!("{used} permits"),
                _ => format!("{used}/{limit} permits"),
            }
        }
        None => holding
            .first()
            .map_or_else(|| "-".to_owned(), |h| mode_name(h.mode).to_owned()),
    };
    let or_dash = |s: String| if s.is_empty() { "-".to_owned() } else { s };
    let joined = |f: &dyn Fn(&HolderInfo) -> Option<String>| {
        or_dash(
            holding
                .iter()
                .filter_map(|h| f(h))
                .collect::<Vec<_>>()
                .join(","),
        )
    };
    [
        listing.resource.escape_debug().to_string(),
        mode,
        or_dash(
            holding
                .iter()
                .map(|h| label(h))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        joined(&|h| held_for(h).map(short)),
        joined(&|h| h.remaining.map(short)),
        joined(&|h| h.fencing_token.map(|t| t.to_string())),
        waiting.len().to_string(),
    ]
}

/// How long a holder has held, from the `acquired_at` its store keeps (another machine's clock
/// where the store's server does not give the time: a small skew shows as a small error).
pub(crate) fn held_for(h: &HolderInfo) -> Option<Duration> {
    let at = h.acquired_at?;
    Some(SystemTime::now().duration_since(at).unwrap_or_default())
}

/// Who a holder is, for a line: `pid 1234 on host-a: ./job.sh --once` from its metadata (the
/// CLI's object), else what the store knows (`pid 1234`, `holder 3fa2…`, a backend) and the
/// metadata as text.
pub(crate) fn label(h: &HolderInfo) -> String {
    let meta = h.meta.as_deref().map(crate::meta::value);
    let field = |k: &str| match meta.as_ref().and_then(|m| m.get(k)) {
        Some(Value::String(s)) => Some(s.escape_debug().to_string()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let who = match (h.pid, field("pid"), &h.id) {
        _ if h.backend.is_some() => h.backend.clone().unwrap_or_default(),
        (Some(pid), _, _) => format!("pid {pid}"),
        (None, Some(pid), _) => format!("pid {pid}"),
        (None, None, Some(id)) => format!("holder {id}"),
        (None, None, None) => "someone".to_owned(),
    };
    let mut out = who;
    if let Some(host) = field("host") {
        out.push_str(&format!(" on {host}"));
    }
    if let Some(id) = field("id") {
        out.push_str(&format!(" [{id}]"));
    }
    match (&meta, field("cmd")) {
        (_, Some(cmd)) => out.push_str(&format!(": {cmd}")),
        (Some(Value::Object(_)), None) | (None, _) => {}
        (Some(_), None) => {
            let text = crate::meta::text(h.meta.as_deref().unwrap_or_default());
            out.push_str(&format!(": {text}"));
        }
    }
    out
}

/// A holder as JSON (`status --json`, `list --json`).
pub(crate) fn holder_json(h: &HolderInfo) -> Value {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    json!({
        "mode": mode_name(h.mode),
        "pid": h.pid,
        "id": h.id,
        "permits": h.permits,
        "remaining_ms": h.remaining.map(ms),
        "waiting": h.waiting,
        "backend": h.backend,
        "meta": h.meta.as_deref().map(crate::meta::value),
        "acquired_at_ms": h.acquired_at.map(|at| ms(at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default())),
        "held_ms": held_for(h).map(ms),
        "fencing_token": h.fencing_token,
    })
}

fn listing_json(listing: &Listing) -> Value {
    let (waiting, holding): (Vec<&HolderInfo>, Vec<&HolderInfo>) =
        listing.holders.iter().partition(|h| h.waiting);
    json!({
        "resource": listing.resource,
        "kind": if listing.semaphore.is_some() { "semaphore" } else { "lock" },
        "limit": listing.semaphore,
        "holders": holding.iter().map(|h| holder_json(h)).collect::<Vec<_>>(),
        "waiters": waiting.iter().map(|h| holder_json(h)).collect::<Vec<_>>(),
    })
}
