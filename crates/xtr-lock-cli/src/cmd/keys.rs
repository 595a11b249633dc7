//! `acquire`, `release`, `refresh`, `status`: locks handed between processes as keys.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use anyhow::{Result, anyhow};
use serde_json::json;
use xtr_lock::Lockable as _;
use xtr_lock::{Key, Mode, Release};

use crate::config::{StoreConfig, Take};
use crate::exit::Exit;

fn refuse_local(store: &StoreConfig) -> Result<()> {
    if store.keys_travel {
        return Ok(());
    }
    Err(anyhow!(
        "a {} lock cannot be handed to another process (it lives in this process: an open file \
         or memory); use `xtr-lock run` instead, or a store such as redis://",
        store.scheme
    ))
}

/// Prints `text` on stdout; a closed pipe is not an error (`| head`).
fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

pub(crate) async fn acquire(store: StoreConfig, take: Take, resource: &str) -> Result<Exit> {
    refuse_local(&store)?;
    if crate::stdio::stdout_closed() {
        return Err(anyhow!(
            "stdout is closed: the key would reach nobody, so no lock was taken"
        ));
    }
    let lock = store.lock(resource, take.ttl);
    if !super::take(&lock, &store, &take).await? {
        if !take.quiet {
            eprintln!("{}", super::conflict_message(&lock, &take));
        }
        return Ok(Exit::Conflict(take.conflict_exit_code));
    }
    let key = match lock.key().to_json() {
        Ok(k) => k,
        Err(e) => {
            let _ = lock.release().await;
            return Err(e.into());
        }
    };
    if let Err(e) = deliver(&key) {
        // Nobody got the key: do not leave the lock behind.
        let released = lock.release().await;
        let outcome = match released {
            Ok(_) => "the lock was released",
            Err(_) => "releasing the lock failed too; it is left to its ttl",
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

fn read_key(arg: Option<String>) -> Result<Key> {
    let text = match arg {
        Some(k) if k != "-" => k,
        _ => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
    };
    Key::from_json(text.trim())
        .map_err(|e| anyhow!("the key is not one `xtr-lock acquire` printed: {e}"))
}

pub(crate) async fn release(store: StoreConfig, key: Option<String>) -> Result<Exit> {
    refuse_local(&store)?;
    let lock = store.factory().create_lock_from_key(read_key(key)?);
    Ok(match lock.release().await? {
        Release::Released | Release::Kept => Exit::Ok,
        _ => {
            eprintln!(
                "xtr-lock: {:?} was not held by this key any more (expired or released)",
                lock.resource()
            );
            Exit::Lost
        }
    })
}

pub(crate) async fn refresh(
    store: StoreConfig,
    ttl: Duration,
    key: Option<String>,
) -> Result<Exit> {
    refuse_local(&store)?;
    let lock = store.factory().create_lock_from_key(read_key(key)?);
    match lock.refresh(Some(ttl)).await {
        Ok(()) => Ok(Exit::Ok),
        Err(e) if e.is_conflict() || e.is_lost() || e.is_expired() => {
            eprintln!(
                "xtr-lock: {:?} is not held by this key any more",
                lock.resource()
            );
            Ok(Exit::Lost)
        }
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn status(
    store: StoreConfig,
    resource: Option<String>,
    key: Option<String>,
    json_out: bool,
) -> Result<Exit> {
    if key.is_some() {
        refuse_local(&store)?;
        let lock = store.factory().create_lock_from_key(read_key(key)?);
        let held = lock.is_acquired().await?;
        if json_out {
            print(&json!({"resource": lock.resource(), "held_by_key": held}).to_string())?;
        } else {
            print(&format!(
                "{:?}: {}",
                lock.resource(),
                if held {
                    "held by this key"
                } else {
                    "not held by this key"
                }
            ))?;
        }
        return Ok(if held { Exit::Ok } else { Exit::Lost });
    }
    let resource = resource.expect("clap requires a resource without --key");
    let holders = if store.store.capabilities().introspection {
        Some(store.store.holders(&resource).await?)
    } else {
        None
    };
    let fencing = store.store.fencing_counter(&resource).await?;
    if json_out {
        let list: Option<Vec<_>> = holders.as_ref().map(|hs| {
            hs.iter()
                .map(|h| {
                    json!({
                        "mode": match h.mode { Mode::Write => "write", Mode::Read => "read" },
                        "pid": h.pid,
                        "id": h.id,
                        "remaining_ms": h.remaining.map(|d| d.as_millis() as u64),
                    })
                })
                .collect()
        });
        let state = match &holders {
            Some(h) if h.is_empty() => "free",
            Some(_) => "held",
            None => "unknown",
        };
        print(
            &json!({
                "resource": resource,
                "store": store.scheme,
                "state": state,
                "holders": list,
                "fencing_counter": fencing,
            })
            .to_string(),
        )?;
    } else {
        match &holders {
            None => print(&format!(
                "{resource:?}: the {} store cannot tell who holds a lock",
                store.scheme
            ))?,
            Some(h) if h.is_empty() => print(&format!("{resource:?}: free"))?,
            Some(h) => print(&format!(
                "{resource:?}: held by {}",
                crate::output::holders(h)
            ))?,
        }
        if let Some(counter) = fencing {
            print(&format!("fencing counter: {counter}"))?;
        }
    }
    Ok(Exit::Ok)
}
