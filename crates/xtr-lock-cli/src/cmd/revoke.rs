//! `revoke RESOURCE`: asks every holder of a resource to give it up, and says whether they did.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use crate::exit::Exit;
use crate::output::{print, short};
use crate::store::StoreConfig;

/// `revoke`: posts the notice every watching holder looks for ([`xtr_lock::Lock::revoke`]) and
/// waits up to `wait` for them to let go; prints how many were asked and whether they did.
/// Exit 0 when the resource is free at the end, the conflict code (1) when holders remain.
pub(crate) async fn revoke(
    store: StoreConfig,
    resource: String,
    wait: Duration,
    json: bool,
) -> Result<Exit> {
    let lock = store.factory().create_lock(resource.as_str());
    let revocation = lock.revoke(wait).await?;
    let (asked, let_go) = (revocation.asked, revocation.let_go);
    if json {
        print(
            &json!({"resource": resource, "asked": asked, "let_go": let_go, "waited_ms": wait.as_millis() as u64})
                .to_string(),
        )?;
    } else {
        let holders = match asked {
            1 => "1 holder".to_owned(),
            n => format!("{n} holders"),
        };
        print(&match (asked, let_go) {
            (0, _) => format!("{resource:?} is free: nobody to ask"),
            (_, true) => format!("asked {holders} of {resource:?} to give it up: it is free now"),
            (_, false) => format!(
                "asked {holders} of {resource:?} to give it up: still held after {} (holders \
                 that do not watch for revocation, as other libraries' and flock(1)'s, cannot \
                 be asked)",
                short(wait)
            ),
        })?;
    }
    Ok(if let_go { Exit::Ok } else { Exit::Conflict(1) })
}
