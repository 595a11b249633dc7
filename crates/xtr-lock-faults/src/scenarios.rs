//! The scenarios: every store with every fault it can suffer, and why the others are left out.

use std::time::Duration;

use crate::Fault;

/// Where the lock lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Lock files in a temp directory.
    Flock,
    /// One Redis server.
    Redis,
    /// A consensus quorum of three Redis servers.
    Quorum,
    /// A 3-member etcd cluster (the `xtr-lock` under test needs the `etcd` feature).
    Etcd,
    /// One Redis server, the pub/sub store (`redis+pubsub://`).
    PubSub,
    /// The SQL table store on PostgreSQL.
    SqlPostgres,
    /// The SQL table store on MariaDB.
    SqlMariaDb,
    /// The SQL table store on SQLite (a file in a temp directory).
    Sqlite,
    /// PostgreSQL advisory locks (`postgres+advisory://`).
    Advisory,
    /// MariaDB's `GET_LOCK` (`mysql+getlock://`).
    GetLock,
    /// One Memcached server.
    Memcached,
    /// SysV semaphores (the resource's name is unique per run).
    Semaphore,
}

impl Target {
    /// The name in a scenario's name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Flock => "flock",
            Target::Redis => "redis",
            Target::Quorum => "quorum",
            Target::Etcd => "etcd",
            Target::PubSub => "pubsub",
            Target::SqlPostgres => "sql-postgres",
            Target::SqlMariaDb => "sql-mariadb",
            Target::Sqlite => "sqlite",
            Target::Advisory => "advisory",
            Target::GetLock => "getlock",
            Target::Memcached => "memcached",
            Target::Semaphore => "semaphore",
        }
    }

    /// Whether a lock expires at its ttl unless renewed (a killed holder's lock lasts until
    /// then).
    fn expires(self) -> bool {
        matches!(
            self,
            Target::Redis
                | Target::Quorum
                | Target::Etcd
                | Target::SqlPostgres
                | Target::SqlMariaDb
                | Target::Sqlite
                | Target::Memcached
        )
    }
}

/// One run: a target, a fault, how long, how many workers.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Where the lock lives.
    pub target: Target,
    /// What is done, again and again.
    pub fault: Fault,
    /// How long the workers contend (faults are injected all along).
    pub duration: Duration,
    /// How many processes contend, a quarter of their runs shared.
    pub workers: usize,
    /// How many more processes contend that only ever read.
    pub readers: usize,
    /// The lock's ttl (on expiring stores: renewed at a third of it); pauses and partitions
    /// last 1.5 of it.
    pub ttl: Duration,
}

impl Scenario {
    /// Every target with every fault that applies to it, each for `duration`.
    ///
    /// Left out, and why:
    /// - a whole holder paused past its lease (`StopHolder`) where the lock can be taken from a
    ///   live but silent holder and there are no fencing tokens (quorum, Memcached): it resumes
    ///   believing it holds, as with any lease, and nothing can refuse its writes;
    /// - server faults where there is no server (flock, SQLite, semaphores: the kernel or the
    ///   file is the server), and partitions there (no network);
    /// - ending a holder's server session (`TerminateBackend`) on Memcached: its connections
    ///   hold nothing, a lock is an entry;
    /// - read mixes on stores without a shared mode (the table stores, `GET_LOCK`, Memcached,
    ///   semaphores: a read lock is exclusive there, which plain contention covers).
    ///
    /// Where a fault destroys a lock under a holder that learns it only at its next check (a
    /// terminated session, a server restarted without its locks) and there are no tokens, the
    /// checker bounds how long the holder may run on (see `Fault::destroys_lock`).
    pub fn all(duration: Duration) -> Vec<Scenario> {
        let holder = [Fault::KillHolder, Fault::KillXtrLock, Fault::StopXtrLock];
        let mut out = Vec::new();
        for target in ORDER {
            for fault in holder.into_iter().chain(faults_of(target)) {
                out.push(Scenario {
                    target,
                    fault,
                    duration,
                    workers: 4,
                    readers: if fault == Fault::ReadMix { 8 } else { 0 },
                    ttl: ttl(target),
                });
            }
        }
        out
    }

    /// `flock/kill-holder`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.target.name(), self.fault.name())
    }

    /// How long a holder whose lock this scenario's fault destroyed may run on: its next
    /// check (a keepalive ping, a renewal, its connection closing) and stopping its command.
    pub(crate) fn destroyed_bound(&self) -> Duration {
        if self.fault.destroys_lock(self.target) {
            Duration::from_secs(3)
        } else {
            Duration::ZERO
        }
    }

    /// How long after the run a lock may still be held or something left: a killed holder's
    /// lock on an expiring store lasts until its ttl (whole seconds on a database's clock), and
    /// on the SQL table's fair queue a killed waiter's ticket keeps newcomers out of the free
    /// lock until it expires (6 s after its last save).
    pub(crate) fn leftover_wait(&self) -> Duration {
        let ticket = match self.target {
            Target::SqlPostgres | Target::SqlMariaDb | Target::Sqlite => Duration::from_secs(7),
            _ => Duration::ZERO,
        };
        if self.target.expires() {
            (self.ttl + Duration::from_secs(1)).max(ticket)
        } else {
            Duration::from_millis(500)
        }
    }
}

/// The order of the targets in [`Scenario::all`]: a target's scenarios are adjacent (they share
/// its servers).
const ORDER: [Target; 12] = [
    Target::Flock,
    Target::Semaphore,
    Target::Sqlite,
    Target::Redis,
    Target::Quorum,
    Target::Etcd,
    Target::PubSub,
    Target::SqlPostgres,
    Target::SqlMariaDb,
    Target::Advisory,
    Target::GetLock,
    Target::Memcached,
];

/// The faults `target` suffers besides every holder's (killed, its `xtr-lock` killed or
/// stopped); [`Scenario::all`] says why the others are left out.
fn faults_of(target: Target) -> Vec<Fault> {
    use Fault::*;
    // Rows with a ttl and tokens (the SQL tables): the database restarted keeps them, a
    // terminated session is only a broken connection. Session locks (advisory, `GET_LOCK`):
    // the server never takes one from a live session (a paused holder keeps it); a terminated
    // session or a restart frees it at once.
    let table_or_session = [
        StopHolder,
        StopServer,
        RestartServer,
        TerminateBackend,
        Partition,
    ];
    match target {
        // The kernel frees a killed holder's lock and never takes it from a live one: a paused
        // holder keeps it, with or without tokens.
        Target::Flock => vec![StopHolder, ReadMix],
        Target::Semaphore | Target::Sqlite => vec![StopHolder],
        Target::Redis => vec![
            StopHolder,
            StopServer,
            RestartServerEmpty,
            Delay,
            Partition,
            ReadMix,
        ],
        // No StopHolder: a quorum has no fencing tokens, and a holder paused past its lease
        // resumes believing it holds (as with any lease); nothing can refuse its writes.
        Target::Quorum => vec![
            StopMembers(1),
            StopMembers(2),
            KillMembers(1),
            KillMembers(2),
            Delay,
            Partition,
            ReadMix,
        ],
        // A lock on a Raft cluster: a member (the leader, or a follower) paused or killed and
        // brought back must change nothing; the holder's faults are every store's.
        Target::Etcd => vec![StopHolder, StopMembers(1), KillLeader, Partition, ReadMix],
        // The lock is a subscription; a restart or a killed connection ends it at once (the
        // holder must notice and stop); a silent holder is killed by any prober after
        // `unavailable_timeout`: paused holders are fenced by portalocker's counter.
        Target::PubSub => vec![
            StopHolder,
            StopServer,
            RestartServer,
            TerminateBackend,
            Partition,
            ReadMix,
        ],
        Target::SqlPostgres | Target::SqlMariaDb | Target::GetLock => table_or_session.to_vec(),
        Target::Advisory => [&table_or_session[..], &[ReadMix]].concat(),
        // No StopHolder (no tokens, the entry expires); a restart comes back empty.
        Target::Memcached => vec![StopServer, RestartServer, Partition],
    }
}

/// The ttl each target runs with: as short as the store allows.
fn ttl(target: Target) -> Duration {
    match target {
        // etcd's leases are whole seconds; pub/sub's lease is its `unavailable_timeout` (1 s,
        // the ttl is ignored): pauses last 1.5 s.
        Target::Etcd | Target::PubSub => Duration::from_secs(1),
        // Whole seconds, at least 2.
        Target::SqlPostgres | Target::SqlMariaDb | Target::Sqlite | Target::Memcached => {
            Duration::from_secs(2)
        }
        _ => Duration::from_millis(1500),
    }
}
