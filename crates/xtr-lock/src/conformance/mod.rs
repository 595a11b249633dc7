//! The store conformance suite: every scenario written once, run against every store.
//!
//! Each scenario is a `pub async fn(Harness) -> Outcome`. It checks what its store's
//! [`Capabilities`] say applies and returns
//! [`Outcome::NotApplicable`] (printed, never silent) otherwise. The
//! [`conformance_tests!`](crate::conformance_tests) macro expands into one `#[tokio::test]` per
//! scenario, so one failure never hides another:
//!
//! ```text
//! xtr_lock::conformance_tests!(|| async {
//!     xtr_lock::conformance::Harness::new(std::sync::Arc::new(MyStore::connect().await))
//! });
//! ```
//!
//! Scenarios use unique resource names and never touch what they did not create, so they can
//! share a server. They panic on failure, with a message saying what was expected.
//!
//! # Cancel safety
//!
//! Scenarios are not cancel-safe: one dropped midway may leave locks on its own unique
//! resources behind. Run each to completion (the macro does).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{BoxFuture, Clock, MonotonicClock};
use crate::key::Key;
use crate::lock::Lock;
use crate::lock::factory::LockFactory;
use crate::store::{Capabilities, Store};

mod basic;
mod election;
mod expiring;
mod fair;
mod jobs;
mod listing;
mod loss;
mod registry;
mod semaphore;
mod shared;
mod siblings;
mod waiting;

pub use basic::*;
pub use election::*;
pub use expiring::*;
pub use fair::*;
pub use jobs::*;
pub use listing::*;
pub use loss::*;
pub use semaphore::*;
pub use shared::*;
pub use siblings::*;
pub use waiting::*;

/// Takes a holder's lock away behind its back, as an outsider would (an operator deleting the
/// Redis key, someone removing the lock file). See [`Harness::with_sabotage`].
pub type Sabotage = Arc<dyn Fn(Key) -> BoxFuture<'static, ()> + Send + Sync>;

/// What a scenario runs against: a store, and the clock its keys use.
#[derive(Clone)]
pub struct Harness {
    /// The store under test.
    pub store: Arc<dyn Store>,
    /// The clock of the keys and locks the scenarios make. Expiring stores must measure their
    /// lifetimes on the same time line (the monotonic clock for real servers).
    pub clock: Arc<dyn Clock>,
    /// A generous bound on how long something expected to happen "at once" may take on a loaded
    /// machine (default 10 s). Never a speed target.
    pub patience: Duration,
    /// The ttl scenarios give locks and saves when the lifetime is not what they test: 30 s on
    /// expiring stores (which refuse a lock without one), none elsewhere.
    pub ttl: Option<Duration>,
    /// What the timed scenarios multiply their lifetimes and sleeps by (1 unless set with
    /// [`with_time_scale`](Harness::with_time_scale)).
    pub time_scale: u32,
    /// Whatever must live as long as the harness: a temporary directory, a server process.
    /// Whether the store shows its queue's waiters ([`HolderInfo::waiting`](crate::store::HolderInfo::waiting))
    /// in [`holders`](Store::holders) and [`list`](Store::list): the fair-waiting scenarios see
    /// that a waiter is registered there (true unless [`hiding_waiters`](Harness::hiding_waiters)).
    pub shows_waiters: bool,
    keep_alive: Vec<Arc<dyn std::any::Any + Send + Sync>>,
    sabotage: Option<Sabotage>,
    names: Option<NameRule>,
}

/// Which resource names a store can lock (see [`Harness::with_name_rule`]).
pub type NameRule = Arc<dyn Fn(&str) -> bool + Send + Sync>;

impl Harness {
    /// A harness on the monotonic clock.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_clock(store, Arc::new(MonotonicClock))
    }

    /// A harness whose keys use `clock`.
    pub fn with_clock(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        let ttl = store
            .capabilities()
            .expiring
            .then_some(Duration::from_secs(30));
        Harness {
            store,
            clock,
            ttl,
            patience: Duration::from_secs(10),
            time_scale: 1,
            shows_waiters: true,
            keep_alive: Vec::new(),
            sabotage: None,
            names: None,
        }
    }

    /// Says which resource names the store can lock, for a store whose names are restricted by
    /// what it stores them in (the pub/sub store: printable ASCII channel names). The scenarios
    /// then expect every other name to be refused as an invalid argument, before anything is
    /// stored. Without it, every name must work.
    pub fn with_name_rule(mut self, valid: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.names = Some(Arc::new(valid));
        self
    }

    /// Multiplies the lifetimes and sleeps of the timed scenarios (written for stores that
    /// keep time in milliseconds: a 0.3 s ttl, 0.25 s steps) by `scale`, for a store whose
    /// lifetimes are coarser: the SQL table store keeps whole seconds and refuses a ttl under
    /// 2 s, so its scenarios run eight times slower. The patience grows with it.
    pub fn with_time_scale(mut self, scale: u32) -> Self {
        self.time_scale = scale.max(1);
        self.patience = self
            .patience
            .max(Duration::from_secs(10) + Duration::from_secs(2) * self.time_scale);
        self
    }

    /// Says that the store does not show its waiters: the fair-waiting scenarios, which see
    /// a waiter registered by its showing as waiting, do not apply (they say so).
    pub fn hiding_waiters(mut self) -> Self {
        self.shows_waiters = false;
        self
    }

    /// `d` on this store's time scale.
    pub fn time(&self, d: Duration) -> Duration {
        d * self.time_scale
    }

    /// Whether the store can lock `resource`.
    pub fn can_name(&self, resource: &str) -> bool {
        self.names.as_ref().is_none_or(|valid| valid(resource))
    }

    /// Says how to take a holder's lock away behind its back on this store (flock: remove or
    /// replace the lock file). Without it, stores whose keys travel lose a lock to a
    /// deserialized copy of the key deleting it, and the loss scenarios do not apply to others.
    pub fn with_sabotage(
        mut self,
        sabotage: impl Fn(Key) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        self.sabotage = Some(Arc::new(sabotage));
        self
    }

    /// How to take a holder's lock away behind its back, if there is a way.
    pub fn sabotage(&self) -> Option<Sabotage> {
        if let Some(s) = &self.sabotage {
            return Some(s.clone());
        }
        if !self.caps().serializable_keys {
            return None;
        }
        let store = self.store.clone();
        let clock = self.clock.clone();
        Some(Arc::new(move |key: Key| {
            let store = store.clone();
            let clock = clock.clone();
            Box::pin(async move {
                let copy =
                    Key::from_json_with_clock(&key.to_json().expect("a key that travels"), clock)
                        .expect("a key that reads back");
                store.delete(&copy).await.expect("the copy deletes");
            })
        }))
    }

    /// Keeps `thing` (a temporary directory, a server) alive as long as the harness.
    pub fn keep_alive(mut self, thing: impl std::any::Any + Send + Sync) -> Self {
        self.keep_alive.push(Arc::new(thing));
        self
    }

    /// The store's capabilities.
    pub fn caps(&self) -> Capabilities {
        self.store.capabilities()
    }

    /// A resource name no other test uses: `name` plus a random suffix.
    pub fn resource(&self, name: &str) -> String {
        let mut bytes = [0u8; 6];
        getrandom::fill(&mut bytes).expect("random source");
        let suffix: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("xtr-conformance:{name}:{suffix}")
    }

    /// A new holder for `resource`.
    pub fn key(&self, resource: &str) -> Key {
        Key::with_clock(resource, self.clock.clone())
    }

    /// A factory on the store and clock, with [`ttl`](Harness::ttl) as its default.
    pub fn factory(&self) -> LockFactory {
        LockFactory::from_arc(self.store.clone())
            .with_clock(self.clock.clone())
            .with_ttl(self.ttl)
    }

    /// A lock with a new holder for `resource`, with `ttl`.
    pub fn lock(&self, resource: &str, ttl: Option<Duration>) -> Lock {
        self.factory().create_lock(resource).with_ttl(ttl)
    }

    /// Sleeps `d` on the harness clock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn sleep(&self, d: Duration) {
        self.clock.sleep(d).await;
    }

    /// Awaits `fut`, failing the scenario with `what` if it takes longer than the patience.
    ///
    /// # Cancel safety
    ///
    /// As cancel-safe as `fut`.
    pub async fn within<T>(&self, what: &str, fut: impl Future<Output = T>) -> T {
        match tokio::time::timeout(self.patience, fut).await {
            Ok(v) => v,
            Err(_) => panic!("{what}: did not happen within {:?}", self.patience),
        }
    }
}

impl fmt::Debug for Harness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("store", &format_args!("{}", self.store))
            .field("clock", &self.clock)
            .finish()
    }
}

/// How a scenario ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The scenario ran and its assertions held.
    Ran,
    /// The store lacks what the scenario is about; the reason is printed.
    NotApplicable(&'static str),
}

/// Runs one scenario and reports a not-applicable one on stderr, so it is never silent.
///
/// # Cancel safety
///
/// Not cancel-safe, like the scenarios: a scenario dropped midway may leave locks on its own
/// unique resources behind. Run each to completion.
pub async fn run(name: &str, scenario: impl Future<Output = Outcome>) {
    match scenario.await {
        Outcome::Ran => {}
        Outcome::NotApplicable(why) => {
            eprintln!("conformance scenario {name}: not applicable to this store: {why}");
        }
    }
}

/// Returns [`Outcome::NotApplicable`] from the scenario unless `cond` holds.
macro_rules! require {
    ($cond:expr, $why:literal) => {
        if !$cond {
            return $crate::conformance::Outcome::NotApplicable($why);
        }
    };
}
pub(crate) use require;

/// Expands into one `#[tokio::test]` per conformance scenario for the store that `$make` (an
/// async closure returning a [`Harness`]) builds. Every scenario is listed here once.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            // basic
            save_exists_delete,
            independent_resources,
            second_holder_conflicts_until_the_first_deletes,
            same_holder_saves_twice,
            delete_on_another_resource_leaves_the_lock,
            deserialized_key_is_the_same_holder,
            key_is_unserializable_after_save,
            odd_resource_names,
            reentrant_acquire_and_no_counting,
            refresh_of_a_lock_never_acquired_is_a_conflict,
            refresh_on_a_non_expiring_store_checks_the_hold,
            release_reports_what_it_found,
            scoped_use_releases_on_error_and_panic,
            holders_tell_who_holds,
            // jobs
            a_minimum_hold_keeps_others_out_after_the_release,
            a_minimum_hold_outlives_a_dropped_guard,
            a_maximum_hold_stops_the_body_and_releases,
            bounded_renewals_end_the_hold,
            a_revoked_holder_gives_its_lock_up,
            queue_one_keeps_at_most_one_waiter,
            replace_revokes_the_holder_and_takes_over,
            // shared
            readers_coexist_and_a_writer_waits_for_both,
            writer_excludes_readers,
            read_release_then_write_with_the_same_holder,
            promotion_with_other_readers_conflicts_and_keeps_the_read_lock,
            sole_reader_promotes,
            writer_demotes_and_a_reader_joins,
            read_falls_back_to_write_without_shared_locks,
            a_travelled_reader_keeps_its_read_lock_when_promotion_is_refused,
            // loss
            a_lock_lost_behind_its_holders_back_is_reported,
            a_body_whose_lock_is_lost_does_not_succeed,
            guards_and_scopes_keep_an_expiring_lock_alive,
            without_renewal_a_scope_ends_when_its_lock_expires,
            a_dropped_holder_keeps_its_lock_only_where_keys_travel,
            // expiring
            put_off_lock_expires,
            tiny_put_off_raises_expired,
            refresh_keeps_alive_then_expires,
            remaining_lifetime_after_put_off,
            pre_expired_key_stores_nothing,
            expired_reader_cannot_revive_itself,
            waiter_takes_over_an_abandoned_lock,
            long_wait_ends_with_a_full_lease,
            release_after_expiry_and_takeover_reports_lost,
            // waiting, cancellation, races, fencing
            native_wait_returns_after_release,
            cancelled_native_wait_holds_nothing,
            native_read_wait_returns_after_writer_release,
            readers_do_not_wait_for_each_other,
            blocking_acquire_wakes_on_release,
            waiters_wake_on_release_without_polling,
            cancelled_wait_holds_nothing,
            cancelled_reacquire_keeps_the_lock,
            cancellation_at_random_points_leaves_nothing,
            acquire_timeout_gives_up_and_holds_nothing,
            counter_race_under_the_lock,
            many_waiters_all_get_their_turn,
            fencing_tokens_strictly_increase,
            // fair waiting
            fair_waiters_are_served_in_arrival_order,
            fair_a_writer_is_not_starved_by_readers,
            fair_a_newcomer_does_not_pass_a_waiter,
            fair_a_dropped_head_does_not_stall_the_queue,
            fair_random_mixes_keep_exclusion_and_order,
            fair_semaphore_waiters_are_served_in_order,
            // siblings: several tasks per lock, several locks, random calls dropped at random
            siblings_chaos_keeps_exclusion_and_leaves_nothing,
            // counting semaphores
            semaphore_admits_up_to_its_limit,
            semaphore_weights_count,
            semaphore_reacquire_takes_nothing_more,
            semaphore_limit_mismatch_is_refused,
            semaphore_and_lock_of_one_name_are_apart,
            semaphore_waiter_gets_a_freed_permit,
            semaphore_never_exceeds_its_limit_under_contention,
            semaphore_expired_permits_come_back,
            semaphore_keys_travel,
            semaphore_scopes_and_guards_give_permits_back,
            semaphore_loss_is_reported,
            a_shared_semaphore_admits_its_limit_per_task,
            // metadata, listing, observers
            holders_carry_metadata,
            metadata_is_size_checked,
            list_lists_exactly_what_is_held,
            observers_wake_on_acquire_and_release,
            // elections
            election_one_leader_at_a_time,
            election_observers_see_every_change_in_order,
            election_loss_is_reported_and_recampaign_leads_again,
            dropped_campaign_holds_nothing,
            election_never_has_two_leaders,
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness: $crate::conformance::Harness = ($make)().await;
                $crate::conformance::run(
                    stringify!($name),
                    $crate::conformance::$name(harness),
                )
                .await;
            }
        )*
    };
}
