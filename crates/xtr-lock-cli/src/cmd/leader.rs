//! `xtr-lock leader NAME [--watch]`: who leads an election (the holder of the lock NAME, as
//! `run --standby NAME` and the library's `Election` take it), once or at every change.

use anyhow::Result;
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};
use xtr_lock::Leader;

use crate::exit::Exit;
use crate::output::{print, short};
use crate::store::StoreConfig;

/// `leader`: 0 someone leads, 1 nobody; with `watch`, every change until SIGINT/SIGTERM (0).
pub(crate) async fn leader(
    store: StoreConfig,
    name: String,
    watch: bool,
    json_out: bool,
) -> Result<Exit> {
    let election = store.factory().create_election(name.clone());
    if !watch {
        let now = election.leader().await?;
        show(&name, now.as_ref(), json_out)?;
        return Ok(if now.is_some() { Exit::Ok } else { Exit::Free });
    }
    let mut observer = election.observe();
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    loop {
        tokio::select! {
            next = observer.next() => show(&name, next?.as_ref(), json_out)?,
            _ = int.recv() => return Ok(Exit::Ok),
            _ = term.recv() => return Ok(Exit::Ok),
        }
    }
}

/// One line: `"NAME": led by {"host":"a",…} (term 42, since 2026-…Z, 3m 20s ago, 12s left)`
/// or `"NAME": nobody leads`; or its JSON object.
fn show(name: &str, leader: Option<&Leader>, json_out: bool) -> Result<()> {
    if json_out {
        return print(&json!({"name": name, "leader": leader.map(leader_json)}).to_string());
    }
    let Some(l) = leader else {
        return print(&format!("{name:?}: nobody leads"));
    };
    let value = match &l.value {
        Some(v) => crate::meta::text(v),
        None => {
            l.id.as_ref()
                .map_or_else(|| "a holder".to_owned(), |id| format!("holder {id}"))
        }
    };
    let mut what = Vec::new();
    if let Some(term) = l.term {
        what.push(format!("term {term}"));
    }
    if let Some(since) = l.since {
        let ago = std::time::SystemTime::now()
            .duration_since(since)
            .unwrap_or_default();
        what.push(format!(
            "since {}, {} ago",
            humantime::format_rfc3339_seconds(since),
            short(ago)
        ));
    }
    if let Some(pid) = l.pid {
        what.push(format!("pid {pid}"));
    }
    if let Some(left) = l.remaining {
        what.push(format!("{} left", short(left)));
    }
    let what = match what.is_empty() {
        true => String::new(),
        false => format!(" ({})", what.join(", ")),
    };
    print(&format!("{name:?}: led by {value}{what}"))
}

fn leader_json(l: &Leader) -> Value {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    json!({
        "value": l.value.as_deref().map(crate::meta::value),
        "term": l.term,
        "since_ms": l.since.map(|s| ms(s.duration_since(std::time::UNIX_EPOCH).unwrap_or_default())),
        "id": l.id,
        "pid": l.pid,
        "remaining_ms": l.remaining.map(ms),
    })
}
