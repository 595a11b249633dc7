//! `status --limit N RESOURCE`: a counting semaphore's permits, used of the limit, and who
//! holds how many.

use anyhow::Result;
use serde_json::json;
use xtr_lock::{Key, Permits};

use crate::exit::Exit;
use crate::output::print;
use crate::store::StoreConfig;

/// 0 when permits are held, 1 when none are.
pub(crate) async fn status(
    store: StoreConfig,
    resource: String,
    permits: Permits,
    json_out: bool,
) -> Result<Exit> {
    let semaphore = store
        .factory()
        .create_semaphore_from_key(Key::for_semaphore(resource.as_str(), permits))?;
    let usage = semaphore.usage().await?;
    let limit = usage.limit.unwrap_or(permits.limit());
    let state = if usage.used > 0 { "held" } else { "free" };
    if json_out {
        let holders: Vec<_> = usage
            .holders
            .iter()
            .map(|h| {
                json!({
                    "permits": h.permits,
                    "pid": h.pid,
                    "id": h.id,
                    "remaining_ms": h.remaining.map(|d| d.as_millis() as u64),
                    "waiting": h.waiting,
                    "backend": h.backend,
                })
            })
            .collect();
        print(
            &json!({
                "resource": resource,
                "store": store.scheme,
                "state": state,
                "used": usage.used,
                "limit": limit,
                "holders": holders,
            })
            .to_string(),
        )?;
    } else if usage.used == 0 {
        print(&format!("{resource:?}: free (0/{limit} permits used)"))?;
    } else if usage.holders.is_empty() {
        print(&format!(
            "{resource:?}: {}/{limit} permits used (the {} store cannot tell by whom)",
            usage.used, store.scheme
        ))?;
    } else {
        print(&format!(
            "{resource:?}: {}/{limit} permits used by {}",
            usage.used,
            crate::output::holders(&usage.holders)
        ))?;
    }
    Ok(if usage.used > 0 { Exit::Ok } else { Exit::Free })
}
