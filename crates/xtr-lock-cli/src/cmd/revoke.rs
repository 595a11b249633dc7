//! `revoke RESOURCE`: asks every holder of a resource to give it up, and says whether they did.

use std::time::Duration;

use anyhow::Result;

use crate::exit::Exit;
use crate::store::StoreConfig;

/// `revoke`: posts the notice every watching holder looks for, waits up to `wait` for them to
/// let go; 0 when the resource is free at the end, the conflict code (1) when holders remain.
pub(crate) async fn revoke(
    store: StoreConfig,
    resource: String,
    wait: Duration,
    json: bool,
) -> Result<Exit> {
    let _ = (store, resource, wait, json);
    anyhow::bail!("revoke: not built yet")
}
