//! `acquire`, `release`, `refresh`, `status`: locks handed between processes as keys, and what
//! a store says about a resource.

use std::time::Duration;

use anyhow::{Result, anyhow};
use serde_json::json;
use xtr_lock::Lockable as _;
use xtr_lock::store::HolderInfo;
use xtr_lock::{Fencing, Release};

use crate::args::{Source, Take};
use crate::exit::Exit;
use crate::handoff::{self, Handed};
use crate::output::mode_name;
use crate::store::StoreConfig;

use crate::output::print;

pub(crate) async fn acquire(
    store: StoreConfig,
    source: &Source,
    take: Take,
    resource: &str,
) -> Result<Exit> {
    handoff::refuse_local(&store, source)?;
    if crate::stdio::stdout_closed() {
        return Err(anyhow!(
            "stdout is closed: the key would reach nobody, so no lock was taken"
        ));
    }
    let lock = store.lock(resource, &take);
    let waited = match super::take(&lock, &store, &take).await? {
        Ok(waited) => waited,
        Err(refused) => {
            if !take.quiet {
                eprintln!(
                    "{}",
                    super::conflict_message(lock.resource(), &take, refused)
                );
            }
            return Ok(Exit::Conflict(take.conflict_exit_code));
        }
    };
    if take.verbose {
        eprintln!("{}", super::took_line(&lock, waited));
    }
    let key = match handoff::envelope(&lock, &store) {
        Ok(k) => k,
        Err(e) => {
            let _ = crate::exit::bounded(lock.release()).await;
            return Err(e);
        }
    };
    if let Err(e) = deliver(&key) {
        // Nobody got the key: do not leave the lock behind.
        let outcome = match crate::exit::bounded(lock.release()).await {
            Some(Ok(_)) => "the lock was released",
            Some(Err(_)) | None => "releasing the lock failed too; it is left to its ttl",
        };
        return Err(anyhow!(
            "the key could not be written to stdout ({e}): {outcome}"
        ));
    }
    Ok(Exit::Ok)
}

/// Writes the key and a newline to file descriptor 1 itself: the standard library's stdout
/// reports success on a closed descriptor (`>&-`), and a key nobody received must not leave
/// its lock held. A closed pipe is an error here, for the same reason.
fn deliver(key: &str) -> std::io::Result<()> {
    use std::os::fd::AsFd as _;
    let stdout = std::io::stdout();
    let _locked = stdout.lock();
    let bytes = format!("{key}\n").into_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match rustix::io::write(stdout.as_fd(), &bytes[at..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// What is said of a key whose lock is not held by it.
fn not_held(resource: &str) -> String {
    format!(
        "xtr-lock: {resource:?} is not held by this key (its lock expired, was released, or was \
         never taken)"
    )
}

/// Runs `op` with the lock a handed-in key names, on the store it names, then closes that store.
async fn with_key<F, Fut>(source: &Source, key: Option<String>, op: F) -> Result<Exit>
where
    F: FnOnce(Handed, xtr_lock::Lock) -> Fut,
    Fut: std::future::Future<Output = Result<Exit>>,
{
    let handed = handoff::read(key)?;
    let chosen = handoff::store_for(&handed, source)?;
    let lock = chosen
        .store
        .factory()
        .create_lock_from_key(handed.key.clone());
    let handle = chosen.store.store.clone();
    let outcome = op(handed, lock).await;
    super::close(&*handle).await;
    // A server that refuses the key's own store may want the password the key leaves out.
    outcome.map_err(|err| match chosen.own && refused(&err) {
        true => anyhow!(
            "{}; {}",
            crate::output::causes(err.as_ref()),
            handoff::NO_PASSWORD
        ),
        false => err,
    })
}

/// Whether `err` is a store's refusal, not a store out of reach: a login refused, say.
fn refused(err: &anyhow::Error) -> bool {
    err.downcast_ref::<xtr_lock::Error>()
        .is_some_and(|e| !e.is_temporary())
}

pub(crate) async fn release(source: &Source, key: Option<String>) -> Result<Exit> {
    with_key(source, key, |_, lock| async move {
        Ok(match lock.release().await? {
            Release::Released | Release::Kept => Exit::Ok,
            _ => {
                eprintln!("{}", not_held(lock.resource()));
                Exit::Lost
            }
        })
    })
    .await
}

pub(crate) async fn refresh(source: &Source, ttl: Duration, key: Option<String>) -> Result<Exit> {
    with_key(source, key, |_, lock| async move {
        match lock.refresh(Some(ttl)).await {
            Ok(()) => Ok(Exit::Ok),
            Err(e) if e.is_conflict() || e.is_lost() || e.is_expired() => {
                eprintln!("{}", not_held(lock.resource()));
                Ok(Exit::Lost)
            }
            Err(e) => Err(e.into()),
        }
    })
    .await
}

pub(crate) async fn status_of_key(
    source: &Source,
    key: Option<String>,
    json_out: bool,
) -> Result<Exit> {
    with_key(source, key, |handed, lock| async move {
        let held = lock.is_acquired().await?;
        let mode = handed.mode.map(mode_name);
        if json_out {
            print(
                &json!({
                    "resource": lock.resource(),
                    "held_by_key": held,
                    "mode": mode,
                    "fencing_token": handed.fencing_token,
                    "store": handed.stores,
                })
                .to_string(),
            )?;
        } else if held {
            let mut line = format!("{:?}: held by this key", lock.resource());
            let permits = lock
                .key()
                .permits()
                .map(|p| format!("{} of {} permits", p.count(), p.limit()));
            if let Some(mode) = permits.as_deref().or(mode) {
                line.push_str(&format!(" ({mode}"));
                if let Some(token) = handed.fencing_token {
                    line.push_str(&format!(", fencing token {token}"));
                }
                line.push(')');
            }
            print(&line)?;
        } else {
            print(&format!("{:?}: not held by this key", lock.resource()))?;
        }
        Ok(if held { Exit::Ok } else { Exit::Lost })
    })
    .await
}

/// `status RESOURCE`: 0 held, 1 free, 2 when the store cannot tell.
pub(crate) async fn status(store: StoreConfig, resource: String, json_out: bool) -> Result<Exit> {
    let holders = if store.store.capabilities().introspection {
        Some(store.store.holders(&resource).await?)
    } else {
        None
    };
    let fencing = match &holders {
        // The counter is one per store (per key prefix), not the resource's: shown only as what
        // it is, an upper bound of every token handed out so far.
        Some(h) if !h.is_empty() => store.store.fencing_counter(&resource).await?,
        _ => None,
    };
    // A queue's waiters (etcd) do not hold: a resource with only waiters is free this moment.
    let state = match &holders {
        Some(h) if h.iter().all(|h| h.waiting) => "free",
        Some(_) => "held",
        None => "unknown",
    };
    let seen = Seen {
        resource: &resource,
        holders: holders.as_deref(),
        fencing,
        location: store.store.location(&resource),
        state,
    };
    if json_out {
        status_json(&store, &seen)?;
    } else {
        status_lines(&store, &seen)?;
    }
    Ok(match state {
        "held" => Exit::Ok,
        "free" => Exit::Free,
        _ => Exit::Error,
    })
}

/// What `status` found out about a resource.
struct Seen<'a> {
    resource: &'a str,
    /// `None` where the store cannot tell.
    holders: Option<&'a [HolderInfo]>,
    /// The store's fencing counter, where it has one and the resource is held.
    fencing: Option<u64>,
    location: Option<String>,
    /// `held`, `free` or `unknown`.
    state: &'static str,
}

/// `status --json`: one object.
fn status_json(store: &StoreConfig, seen: &Seen<'_>) -> Result<()> {
    let list: Option<Vec<_>> = seen
        .holders
        .map(|hs| hs.iter().map(super::list::holder_json).collect());
    print(
        &json!({
            "resource": seen.resource,
            "store": store.scheme,
            "state": seen.state,
            "holders": list,
            "location": seen.location,
            "store_fencing_counter": seen.fencing,
        })
        .to_string(),
    )
}

/// `status`: who holds it (and who queues), where the lock lives, the fencing counter.
fn status_lines(store: &StoreConfig, seen: &Seen<'_>) -> Result<()> {
    let resource = seen.resource;
    match seen.holders {
        None => print(&format!(
            "{resource:?}: the {} store cannot tell who holds a lock",
            store.scheme
        ))?,
        Some([]) => print(&format!("{resource:?}: free"))?,
        Some(h) => {
            let (waiting, holding): (Vec<_>, Vec<_>) = h.iter().cloned().partition(|h| h.waiting);
            if holding.is_empty() {
                print(&format!("{resource:?}: free"))?;
            } else {
                print(&format!(
                    "{resource:?}: held by {}",
                    crate::output::holders(&holding)
                ))?;
                for h in &holding {
                    if let Some(line) = holder_detail(h) {
                        print(&line)?;
                    }
                }
            }
            if !waiting.is_empty() {
                print(&format!("queue: {}", crate::output::holders(&waiting)))?;
            }
        }
    }
    if let Some(location) = &seen.location {
        print(&format!("lock: {location}"))?;
    }
    if let Some(counter) = seen.fencing {
        // A Redis Cluster counts per hash slot (its locks_in is always written `…+cluster://`).
        let per_slot = store
            .store
            .locks_in()
            .and_then(|l| {
                l.split_once("://")
                    .map(|(scheme, _)| scheme.ends_with("+cluster"))
            })
            .unwrap_or(false);
        print(&fencing_line(store.fencing, per_slot, counter))?;
    }
    Ok(())
}

/// `  pid 1234 on host-a: ./job.sh (since 2026-…Z, held 3m 20s, fencing token 42)` and its
/// metadata whole on a line below: what the store keeps of a holder beyond its mode, or `None`
/// where it keeps nothing more.
fn holder_detail(h: &HolderInfo) -> Option<String> {
    if h.meta.is_none() && h.acquired_at.is_none() && h.fencing_token.is_none() {
        return None;
    }
    let mut what = Vec::new();
    if let (Some(at), Some(held)) = (h.acquired_at, super::list::held_for(h)) {
        what.push(format!(
            "since {}, held {}",
            humantime::format_rfc3339_seconds(at),
            crate::output::short(held)
        ));
    }
    if let Some(left) = h.remaining {
        what.push(format!("{} left", crate::output::short(left)));
    }
    if let Some(token) = h.fencing_token {
        what.push(format!("fencing token {token}"));
    }
    let mut line = format!("  {}", super::list::label(h));
    if !what.is_empty() {
        line.push_str(&format!(" ({})", what.join(", ")));
    }
    if let Some(meta) = &h.meta {
        line.push_str(&format!("\n    meta: {}", crate::meta::text(meta)));
    }
    Some(line)
}

/// What the fencing counter of a store of kind `scheme` counts.
fn fencing_line(fencing: Option<Fencing>, per_slot: bool, counter: u64) -> String {
    // The pub/sub store counts per resource (portalocker's `<channel>-fence`), as the SQL
    // store does (its `<table>_fence` rows); a Redis Cluster per hash slot; the others share
    // one counter per store.
    let whose = if fencing == Some(Fencing::PerResource) {
        "this resource's counter"
    } else if per_slot {
        "the counter of this resource's hash slot, shared with the resources in that slot"
    } else {
        "one counter for every resource of this store"
    };
    format!(
        "fencing tokens so far: at most {counter} ({whose}; the holder's own is in its \
         key and $XTR_LOCK_FENCING_TOKEN)"
    )
}
