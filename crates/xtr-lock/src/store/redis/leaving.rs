//! What a store sends for a waiter that is gone, in the background: its ticket out of the queue
//! (`LEAVE`), a wake that found it gone passed on (`WAKE`), a grant it never took in taken back
//! (`REVOKE`). Each lets the next waiter in, as a release would.

use std::time::Duration;

use super::RedisStore;
use super::conn::Keys;
use super::scripts::Scripts;
use crate::key::Key;
use crate::logging::TARGET;

/// How many times a waiter's leaving (or a grant's taking back) is sent before it is given up
/// (a server unreachable for about 3 s): a ticket left behind keeps later waiters out until a
/// wake finds it gone; a grant left behind holds the lock until its ttl ends.
const TRIES: u32 = 5;

/// Takes a waiter that left out of `lock_key`'s queue, waking whoever that lets in (it may
/// have been woken, and kept the others out meanwhile), and a grant above `taken` (the last
/// token it took in) that a release gave it with a wake it never got; in the background, tried
/// again on a failure. Outside a runtime nothing is sent: its wake will be passed on.
pub(super) fn leave_queue(store: &RedisStore, lock_key: &str, ticket: String, taken: u64) {
    if ticket.starts_with('s') {
        if tokio::runtime::Handle::try_current().is_ok() {
            store.semaphore_leave(lock_key, ticket);
        }
        return;
    }
    in_background(
        store,
        lock_key,
        |s| &s.leave,
        (ticket, taken),
        TRIES,
        "cannot take a waiter that left out of the queue; its store passes on the wakes that find it gone",
    );
}

/// Hands a wake whose waiter is gone (`who`: the ticket's tail, from its store id on) to the
/// next waiter of `lock_key`, taking the gone waiter's ticket out of the queue.
pub(super) fn pass_on(store: &RedisStore, lock_key: &str, who: &str) {
    in_background(
        store,
        lock_key,
        |s| &s.wake,
        (who.to_owned(), 0),
        1,
        "cannot pass a wake on; the next waiter finds the lock when its lease hint ends",
    );
}

/// Takes back a grant of `lock_key` that its waiter never took in (it gave up, or its future
/// was dropped), so the next waiter gets the lock now rather than at the grant's end.
pub(super) fn revoke(store: &RedisStore, lock_key: &str, grant: super::grant::Grant) {
    let score = grant.score();
    in_background(
        store,
        lock_key,
        |s| &s.revoke,
        (grant.token, score),
        TRIES,
        "cannot take back a grant its waiter never took in; the lock stays held until the grant's ttl ends",
    );
}

/// How long a holder's operation waits for its own clean-ups (a leaving, a grant taken back)
/// to reach the server: about their tries' span.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

impl RedisStore {
    /// Waits until no clean-up of `key`'s holder (its leaving, a grant taken back) is under way
    /// in the background, for at most [`SETTLE_WAIT`]: an operation of the holder that follows
    /// a dropped acquire sees the store as that acquire left it (a grant its waiter never took
    /// in is gone), as it does the `Lock`'s own clean-ups.
    pub(super) async fn settled(&self, key: &Key) {
        let pending = {
            let st = self.inner.notifier.state();
            if st.settling.is_empty() {
                return;
            }
            let holder = (self.key_for(key.resource()), key.token(super::KIND));
            match st.settling.get(&holder) {
                Some((_, done)) => {
                    let done = done.clone();
                    // Registered before the state lock goes: its `notify_waiters` cannot be missed.
                    Box::pin(async move { done.notified_owned().await })
                }
                None => return,
            }
        };
        let _ = tokio::time::timeout(SETTLE_WAIT, pending).await;
    }
}

/// A clean-up of one holder under way (see [`RedisStore::settled`]); its end wakes whoever
/// waits for it.
struct Settling {
    store: RedisStore,
    holder: (String, String),
}

impl Settling {
    fn begin(store: &RedisStore, lock_key: &str, token: &str) -> Self {
        let holder = (lock_key.to_owned(), token.to_owned());
        let mut st = store.inner.notifier.state();
        st.settling.entry(holder.clone()).or_default().0 += 1;
        drop(st);
        Settling {
            store: store.clone(),
            holder,
        }
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        let mut st = self.store.inner.notifier.state();
        if let Some((count, done)) = st.settling.get_mut(&self.holder) {
            *count -= 1;
            if *count == 0 {
                done.notify_waiters();
                st.settling.remove(&self.holder);
            }
        }
    }
}

/// Runs the queue script `pick` chooses for `lock_key` with `(ARGV[4], ARGV[5])`, in the
/// background, up to `tries` times (pausing 100 ms, doubling, between them).
fn in_background(
    store: &RedisStore,
    lock_key: &str,
    pick: fn(&Scripts) -> &std::sync::LazyLock<redis::Script>,
    (arg, number): (String, u64),
    tries: u32,
    failure: &'static str,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Some(resource) = lock_key.strip_prefix(store.prefix()) else {
        return;
    };
    let (store, key) = (store.clone(), Key::new(resource));
    // The holder's token: a ticket's (after its mode) or a grant's.
    let token = if arg.len() == 44 {
        &arg[..]
    } else {
        arg.get(1..45).unwrap_or("")
    };
    let settling = Settling::begin(&store, lock_key, token);
    runtime.spawn(async move {
        let _settling = settling;
        let mut pause = Duration::from_millis(100);
        for tried in 1..=tries {
            let sent: crate::Result<i64> = store
                .eval(
                    pick(store.inner.scripts),
                    &key,
                    None,
                    Keys::Queue,
                    Some((&arg, number)),
                )
                .await;
            match sent {
                Ok(_) => return,
                Err(err) if tried == tries => {
                    tracing::debug!(target: TARGET, resource = key.resource(), error = %err, "{failure}");
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
    });
}
