//! The cluster's members as the store reaches them: a client per member, each request sent to
//! the next member in turn among those that answer, and a member found silent left aside
//! until it answers a probe.
//!
//! Why not one client balanced over every member (etcd-client's own): its balancer sends each
//! request to a member picked at random among those whose connection is ready, and the
//! connection to a member that stopped answering (paused by SIGSTOP, hung, cut off behind a
//! live TCP stack) is ready again as soon as it is made anew: the kernel accepts the TCP
//! connection, and the HTTP/2 handshake does not wait for the server to say anything. Every
//! request sent there waits until the HTTP/2 keep-alive finds the connection silent (two
//! seconds), the client connects again at once, and the next request goes there as often as
//! before: a third of all requests, for as long as the member is stopped, so that a request
//! tried three times failed three times now and then. A failed request does not say which
//! member it went to, so that balancer cannot be told to leave one aside.
//!
//! Which member a request went to is known here: a request to it that failed in a way that
//! may be the member's (temporary: unanswered, refused, a broken connection, no leader) leaves
//! it aside, and a probe (a status request that must find a leader) asks it again and again,
//! until it answers. The HTTP/2 keep-alive remains what finds a member silent (a ping goes
//! unanswered), not how long a request takes: a slow cluster answers pings all the same.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::sync::OnceCell;

use crate::error::Error;

/// How long a probe waits for a member's answer: a member that answers within it is asked
/// again.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause before the first probe, doubled after each probe that went unanswered, up to
/// [`PROBE_EVERY_AT_MOST`].
const PROBE_FIRST: Duration = Duration::from_millis(100);
const PROBE_EVERY_AT_MOST: Duration = Duration::from_secs(1);

/// The members, their clients (connected on first use) and which ones were found silent.
pub(super) struct Members {
    slots: Vec<Slot>,
    /// Where the next pick starts its turn.
    next: AtomicUsize,
    options: ConnectOptions,
    /// The store's name, for logs.
    shown: Arc<str>,
}

struct Slot {
    endpoint: String,
    client: OnceCell<Client>,
    /// Found silent, not heard from since: a probe is under way.
    silent: AtomicBool,
}

/// A member picked for a request: its client, and a way to say the request failed there.
pub(super) struct Member {
    pub(super) client: Client,
    at: usize,
    members: Arc<Members>,
}

impl Members {
    pub(super) fn new(endpoints: &[String], options: ConnectOptions, shown: Arc<str>) -> Members {
        Members {
            slots: endpoints
                .iter()
                .map(|e| Slot {
                    endpoint: e.clone(),
                    client: OnceCell::new(),
                    silent: AtomicBool::new(false),
                })
                .collect(),
            next: AtomicUsize::new(0),
            options,
            shown,
        }
    }

    /// The members to try for the next request, best first: those that answer, in turn (each
    /// request starts one further), then those found silent (when every member was, the
    /// cluster is asked all the same).
    pub(super) fn order(&self) -> Vec<usize> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let turn = (0..n).map(|i| (start + i) % n);
        let (mut live, silent): (Vec<_>, Vec<_>) = turn.partition(|&at| !self.is_silent(at));
        live.extend(silent);
        live
    }

    fn is_silent(&self, at: usize) -> bool {
        self.slots[at].silent.load(Ordering::Acquire)
    }

    /// Member `at`, its client connected on first use (connecting asks the network only with
    /// a user to authenticate; the caller bounds it).
    pub(super) async fn member(
        self: &Arc<Self>,
        at: usize,
    ) -> std::result::Result<Member, etcd_client::Error> {
        let client = self.client(at).await?;
        Ok(Member {
            client,
            at,
            members: self.clone(),
        })
    }

    async fn client(&self, at: usize) -> std::result::Result<Client, etcd_client::Error> {
        let slot = &self.slots[at];
        slot.client
            .get_or_try_init(|| {
                Client::connect([slot.endpoint.as_str()], Some(self.options.clone()))
            })
            .await
            .cloned()
    }

    /// Member `at` failed a request in a way that may be its own: it is left aside until a
    /// probe finds it answering. A lone member is never left aside (there is nowhere else to
    /// go), nor without a runtime to probe it on.
    pub(super) fn silent(self: &Arc<Self>, at: usize) {
        if self.slots.len() < 2 {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.slots[at].silent.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(target: crate::logging::TARGET, store = %self.shown,
            member = %self.slots[at].endpoint,
            "an etcd member did not answer; leaving it aside until it does");
        rt.spawn(probe(Arc::downgrade(self), at));
    }
}

/// Asks member `at` for its status until it answers with a leader, then takes it back. Ends
/// without it when the members are dropped (the store closed or gone).
async fn probe(members: Weak<Members>, at: usize) {
    let mut pause = PROBE_FIRST;
    loop {
        tokio::time::sleep(pause).await;
        let Some(members) = members.upgrade() else {
            return;
        };
        let status = tokio::time::timeout(PROBE_TIMEOUT, async {
            members.client(at).await?.status().await
        })
        .await;
        if let Ok(Ok(status)) = status
            && status.leader() != 0
        {
            members.slots[at].silent.store(false, Ordering::Release);
            tracing::debug!(target: crate::logging::TARGET, store = %members.shown,
                member = %members.slots[at].endpoint, "an etcd member answers again");
            return;
        }
        pause = (pause * 2).min(PROBE_EVERY_AT_MOST);
    }
}

impl Member {
    /// `err`, from a request to this member: a temporary one (unanswered, refused, a broken
    /// connection, no leader) leaves the member aside until it answers a probe.
    pub(super) fn failed(&self, err: Error) -> Error {
        if err.is_temporary() {
            self.leave_aside();
        }
        err
    }

    /// Leaves the member aside until it answers a probe.
    pub(super) fn leave_aside(&self) {
        self.members.silent(self.at);
    }
}
