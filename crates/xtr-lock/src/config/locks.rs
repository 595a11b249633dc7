//! [`Locks`]: the registry of a checked configuration's entries.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use super::{CheckedConfig, CheckedEntry, LocksConfig};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::lock::Lock;
use crate::lock::factory::{LockFactory, RunOptions};
use crate::mutex::lock;
use crate::store::Store;

/// The resource [`Locks::ping`] locks (after the entry's prefix).
pub const PING_RESOURCE: &str = "xtr-lock-ping";

/// The locks of an application: one [`LockFactory`] per configured entry, built when the entry
/// is first used (so nothing connects, and no directory is made, before then), each lock
/// getting its entry's prefix, ttl and wait.
///
/// Clones share the entries' stores.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::config::{Locks, LocksConfig};
///
/// let config = LocksConfig::from_toml_str(r#"
///     prefix = "billing:"
///     ttl = "1 minute"
///     [stores]
///     default = "in-memory"
/// "#)?;
/// let locks = Locks::new(&config)?; // checks every entry, reports every problem
/// let sent = locks
///     .run("invoice-42", || async { Ok::<_, xtr_lock::Error>("sent") })
///     .await?;
/// assert_eq!(sent, "sent");
/// assert_eq!(locks.lock("invoice-42")?.resource(), "billing:invoice-42");
/// locks.close().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locks {
    inner: Arc<Inner>,
}

struct Inner {
    config: CheckedConfig,
    built: Mutex<BTreeMap<String, LockFactory>>,
}

impl Locks {
    /// Checks `config` with the process's environment and builds the registry.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) listing every problem
    /// of the configuration (see [`LocksConfig::check`]).
    pub fn new(config: &LocksConfig) -> Result<Self> {
        Ok(Self::from_checked(config.check()?))
    }

    /// The registry of a configuration already checked.
    pub fn from_checked(config: CheckedConfig) -> Self {
        Locks {
            inner: Arc::new(Inner {
                config,
                built: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// The entry used when none is named.
    pub fn default_entry(&self) -> &str {
        &self.inner.config.default
    }

    /// The entries' names, in order.
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.inner.config.entries.keys().map(String::as_str)
    }

    /// What the configuration says about `entry`.
    pub fn entry(&self, entry: &str) -> Option<&CheckedEntry> {
        self.inner.config.entries.get(entry)
    }

    fn checked(&self, entry: &str) -> Result<&CheckedEntry> {
        self.entry(entry).ok_or_else(|| {
            Error::invalid_argument(format!(
                "no lock configuration entry named {entry:?} (the entries: {})",
                self.entries().collect::<Vec<_>>().join(", ")
            ))
        })
    }

    /// The factory of `entry` (its store built on first use), with the entry's ttl. Its locks
    /// get no prefix: [`lock_on`](Self::lock_on) adds it.
    ///
    /// # Errors
    ///
    /// An unknown entry; a store that cannot be built (a flock directory that cannot be made).
    pub fn factory(&self, entry: &str) -> Result<LockFactory> {
        let checked = self.checked(entry)?;
        let mut built = lock(&self.inner.built);
        if let Some(factory) = built.get(entry) {
            return Ok(factory.clone());
        }
        let store = checked.store.build()?;
        let factory = LockFactory::from_arc(store).with_ttl(checked.ttl);
        built.insert(entry.to_owned(), factory.clone());
        Ok(factory)
    }

    /// A lock (a new holder) on the default entry for `resource`, with the entry's prefix.
    ///
    /// # Errors
    ///
    /// As [`factory`](Self::factory).
    pub fn lock(&self, resource: &str) -> Result<Lock> {
        self.lock_on(self.default_entry(), resource)
    }

    /// A lock (a new holder) on `entry` for `resource`, with the entry's prefix and ttl.
    ///
    /// # Errors
    ///
    /// As [`factory`](Self::factory).
    pub fn lock_on(&self, entry: &str, resource: &str) -> Result<Lock> {
        let prefix = &self.checked(entry)?.prefix;
        Ok(self
            .factory(entry)?
            .create_lock(format!("{prefix}{resource}")))
    }

    /// A new key (a new holder) for `resource` on the default entry, prefixed: hand it to
    /// another process (`Key::to_json`) and take it back with [`from_key`](Self::from_key).
    ///
    /// # Errors
    ///
    /// As [`factory`](Self::factory).
    pub fn key(&self, resource: &str) -> Result<Key> {
        let entry = self.default_entry();
        let prefix = &self.checked(entry)?.prefix;
        Ok(self.factory(entry)?.new_key(format!("{prefix}{resource}")))
    }

    /// The lock of a key made by [`key`](Self::key) (here or in another process with the same
    /// configuration), on the default entry, acting as that key's holder.
    ///
    /// # Errors
    ///
    /// A key whose resource lacks the entry's prefix (made by another configuration), and the
    /// errors of [`factory`](Self::factory).
    pub fn from_key(&self, key: Key) -> Result<Lock> {
        let entry = self.default_entry();
        let prefix = &self.checked(entry)?.prefix;
        if !key.resource().starts_with(prefix.as_str()) {
            return Err(Error::invalid_argument(format!(
                "the key's resource does not start with entry {entry:?}'s prefix {prefix:?}: \
                 it was made by another configuration"
            ))
            .with_resource(key.resource()));
        }
        Ok(self.factory(entry)?.create_lock_from_key(key))
    }

    /// Runs `body` under the write lock on `resource` on the default entry, with the entry's
    /// prefix, ttl and wait, as [`LockFactory::run`] does (renewed while it runs, released on
    /// the way out, stopped if the lock is lost).
    ///
    /// # Errors
    ///
    /// As [`LockFactory::run`]; and the errors of [`factory`](Self::factory).
    ///
    /// # Cancel safety
    ///
    /// As [`LockFactory::run`]: dropped while waiting it leaves nothing held; dropped while the
    /// body runs, a release is scheduled.
    pub async fn run<T, E, F, Fut>(&self, resource: &str, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.run_on(self.default_entry(), resource, RunOptions::new(), body)
            .await
    }

    /// Runs `body` under the read lock on `resource` on the default entry, with the entry's
    /// prefix, ttl and wait: readers run together, a writer waits for them.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run).
    pub async fn run_read<T, E, F, Fut>(&self, resource: &str, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.run_on(
            self.default_entry(),
            resource,
            RunOptions::new().shared(),
            body,
        )
        .await
    }

    /// As [`run`](Self::run), on `entry`, with `options` (its wait replaced by the entry's
    /// unless it sets one; use [`RunOptions::shared`] for the read lock).
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run).
    pub async fn run_on<T, E, F, Fut>(
        &self,
        entry: &str,
        resource: &str,
        options: RunOptions,
        body: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let (factory, resource, options) = self.for_run(entry, resource, options)?;
        factory.run(resource, options, body).await
    }

    /// What `run_on` runs with, shared with the blocking API: the entry's factory, the
    /// prefixed resource, and the options with the entry's wait unless they set one.
    pub(crate) fn for_run(
        &self,
        entry: &str,
        resource: &str,
        options: RunOptions,
    ) -> Result<(LockFactory, String, RunOptions)> {
        let checked = self.checked(entry)?;
        let options = if options.wait_is_set() {
            options
        } else {
            options.wait(checked.wait)
        };
        let resource = format!("{}{resource}", checked.prefix);
        Ok((self.factory(entry)?, resource, options))
    }

    /// Reaches every entry's store, for readiness probes: a trying write lock on the entry's
    /// `xtr-lock-ping` resource (prefixed), released at once. A lock someone else holds (another
    /// probe) counts as reached. The entries are tried together, each within `deadline`.
    ///
    /// The answer has one line per entry, in order: `Ok(())`, or the error that entry gave (a
    /// store that cannot be built, reached, or written to, or no answer within `deadline`).
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, a ping lock taken is released in the background, as any dropped lock
    /// is.
    pub async fn ping(&self, deadline: std::time::Duration) -> Vec<(String, Result<()>)> {
        let names: Vec<String> = self.entries().map(str::to_owned).collect();
        let pings = names.iter().map(|entry| async move {
            // A scope that tries once and does nothing: released on the way out, also when
            // dropped; a lock someone else holds is a conflict, and an answer all the same.
            let options = RunOptions::new().wait(crate::Wait::Never).keep_alive(false);
            let attempt = self.run_on(entry, PING_RESOURCE, options, || async {
                Ok::<_, Error>(())
            });
            match tokio::time::timeout(deadline, attempt).await {
                Ok(Err(err)) if err.is_conflict() => Ok(()),
                Ok(answer) => answer,
                Err(_) => {
                    let prefix = self.entry(entry).map_or("", |e| e.prefix.as_str());
                    Err(Error::storage(format!(
                        "the store did not answer within {} s",
                        deadline.as_secs_f64()
                    ))
                    .temporary()
                    .with_resource(format!("{prefix}{PING_RESOURCE}")))
                }
            }
        });
        let answers = futures_util::future::join_all(pings).await;
        names.into_iter().zip(answers).collect()
    }

    /// Closes every store built so far (see [`Store::close`]); a registry used again after
    /// `close` reconnects.
    ///
    /// # Errors
    ///
    /// Every store that failed to close, each named by its entry.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, some stores may be closed and others not; calling it again finishes
    /// the job.
    pub async fn close(&self) -> Result<()> {
        let built: Vec<(String, LockFactory)> = lock(&self.inner.built)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut failed = Vec::new();
        for (entry, factory) in built {
            if let Err(e) = factory.store().close().await {
                failed.push(format!("{entry}: {e}"));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Error::storage(format!(
                "could not close every store: {}",
                failed.join("; ")
            )))
        }
    }
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}
