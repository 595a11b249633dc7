//! The in-memory store's wait queues: per lock and per semaphore, the registered waiters in the
//! order their waits began (ties by registration). Only the waiters at the head that can get in
//! now are woken, and a save gets in only if no waiter it would pass stands before it: the lock
//! is reserved for the head (see `docs/waking.md`, "In-memory and flock").

use std::sync::Weak;
use std::time::SystemTime;

use tokio::sync::watch;

use super::{InMemoryStore, KIND, Shared};
use crate::key::{Key, Mode};
use crate::mutex::lock;
use crate::store::{HolderInfo, Watcher};

/// What a waiter waits for: learned from its saves (a lock's mode) or its key (permits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// Registered, no save seen yet: it stops everyone behind it, as a writer would.
    Unknown,
    Read,
    Write,
    Permits(u32),
}

impl Want {
    fn mode(self) -> Mode {
        match self {
            Want::Read => Mode::Read,
            _ => Mode::Write,
        }
    }
}

pub(super) struct Ticket {
    id: u64,
    pub(super) token: String,
    since: SystemTime,
    pub(super) want: Want,
    /// Watchers registered for it (a waiter keeps its old one until the next is registered).
    refs: usize,
    wake: watch::Sender<u64>,
}

impl Ticket {
    /// Wakes its waiter (a spurious wake only costs an attempt).
    pub(super) fn wake(&self) {
        self.wake.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// How it shows in `holders` and listings.
    pub(super) fn info(&self) -> HolderInfo {
        let info = HolderInfo::new(self.want.mode(), Some(std::process::id()), None)
            .with_token(&self.token)
            .queued();
        match self.want {
            Want::Permits(n) => info.with_permits(n),
            _ => info,
        }
    }
}

/// Waiters in the order their waits began.
#[derive(Default)]
pub(super) struct Queue {
    tickets: Vec<Ticket>,
}

impl Queue {
    pub(super) fn is_empty(&self) -> bool {
        self.tickets.is_empty()
    }

    /// The waiters, first first.
    pub(super) fn tickets(&self) -> &[Ticket] {
        &self.tickets
    }

    fn position(&self, token: &str) -> Option<usize> {
        self.tickets.iter().position(|t| t.token == token)
    }

    /// The waiters a save of `token` would pass: those before its ticket, or all of them.
    pub(super) fn ahead(&self, token: &str) -> &[Ticket] {
        let end = self.position(token).unwrap_or(self.tickets.len());
        &self.tickets[..end]
    }

    /// Registers `token` (or keeps its place and counts one more watcher); the ticket's id
    /// and a receiver of its wakes.
    fn join(&mut self, id: u64, token: &str, since: SystemTime, want: Want) -> (u64, Rx) {
        if let Some(i) = self.position(token) {
            let t = &mut self.tickets[i];
            t.refs += 1;
            if want != Want::Unknown {
                t.want = want;
            }
            let mut rx = t.wake.subscribe();
            rx.mark_unchanged();
            return (t.id, rx);
        }
        let (wake, rx) = watch::channel(0);
        let at = self
            .tickets
            .partition_point(|t| (t.since, t.id) <= (since, id));
        self.tickets.insert(
            at,
            Ticket {
                id,
                token: token.to_owned(),
                since,
                want,
                refs: 1,
                wake,
            },
        );
        (id, rx)
    }

    /// One watcher of ticket `id` went; whether the ticket left with it.
    fn leave(&mut self, id: u64) -> bool {
        let Some(i) = self.tickets.iter().position(|t| t.id == id) else {
            return false;
        };
        self.tickets[i].refs -= 1;
        if self.tickets[i].refs > 0 {
            return false;
        }
        self.tickets.remove(i);
        true
    }

    /// `token` got in: its ticket is done (its watchers find it gone).
    pub(super) fn admitted(&mut self, token: &str) {
        if let Some(i) = self.position(token) {
            self.tickets.remove(i);
        }
    }

    /// A save of `token` was refused while it waits for `want`; whether that is news.
    pub(super) fn note(&mut self, token: &str, want: Want) -> bool {
        match self.position(token) {
            Some(i) if self.tickets[i].want != want => {
                self.tickets[i].want = want;
                true
            }
            _ => false,
        }
    }

    /// Wakes every waiter (what they wait behind changed how long it lasts).
    pub(super) fn wake_all(&self) {
        self.tickets.iter().for_each(Ticket::wake);
    }
}

type Rx = watch::Receiver<u64>;

/// Which queue a ticket is in.
#[derive(Clone, Copy)]
pub(super) enum Of {
    Lock,
    Semaphore,
}

/// A watcher's hold on its ticket: the last one dropped takes the ticket out of the queue and
/// lets the next waiters in (cancel safety: a dropped waiter never stalls the queue).
struct Place {
    store: Weak<Shared>,
    of: Of,
    resource: String,
    id: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(shared) = self.store.upgrade() {
            InMemoryStore { inner: shared }.leave(self.of, &self.resource, self.id);
        }
    }
}

impl InMemoryStore {
    /// Registers `key`'s holder in the queue of its lock or semaphore; a watcher woken when its
    /// turn may have come. Dropping the watcher (the last one of the holder) leaves the queue.
    pub(super) fn queue_up(&self, key: &Key, since: SystemTime) -> Watcher {
        let token = key.token(KIND);
        let resource = key.resource().to_owned();
        let (of, (id, mut rx)) = {
            let mut guard = self.state();
            let st = &mut *guard;
            st.next_ticket += 1;
            let id = st.next_ticket;
            match key.permits() {
                Some(p) => {
                    let sem = st.semaphore(&resource, p.limit());
                    let joined = sem.queue.join(id, &token, since, Want::Permits(p.count()));
                    (Of::Semaphore, joined)
                }
                None => {
                    let entry = st.resources.entry(resource.clone()).or_default();
                    (Of::Lock, entry.queue.join(id, &token, since, Want::Unknown))
                }
            }
        };
        let place = Place {
            store: std::sync::Arc::downgrade(&self.inner),
            of,
            resource,
            id,
        };
        let fut = async move {
            // An error means the store is gone: nothing will change any more, so wake up.
            let _ = rx.changed().await;
        };
        // The place goes with the watcher, not with its future (which ends when it fires): a
        // woken waiter keeps its place until it has made its attempt and let the watcher go.
        Watcher::with_coverage(fut, move || {
            let _ = &place;
            true
        })
    }

    /// One watcher of ticket `id` went: when it was the last, the ticket leaves and the next
    /// waiters are let in.
    fn leave(&self, of: Of, resource: &str, id: u64) {
        let (now, _) = self.times(None);
        let mut guard = lock(&self.inner.state);
        let st = &mut *guard;
        match of {
            Of::Lock => {
                if let Some(entry) = st.resources.get_mut(resource)
                    && entry.queue.leave(id)
                {
                    entry.serve(now);
                    st.tidy(resource);
                }
            }
            Of::Semaphore => {
                if let Some(sem) = st.semaphores.get_mut(resource)
                    && sem.queue.leave(id)
                {
                    sem.serve();
                    st.tidy_semaphore(resource);
                }
            }
        }
    }
}
