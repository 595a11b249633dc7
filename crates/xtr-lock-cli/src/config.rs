//! Raw arguments turned into checked settings, with errors that name the flag at fault.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use xtr_lock::store::{CombinedStore, ConsensusStrategy};
use xtr_lock::{Lock, LockFactory, Mode, Store, StoreFactory, Wait};

use crate::cli::{StoreArgs, WaitArgs};

/// Parses a humantime duration (`30s`, `2m`, `1h30m`, `500ms`) of at most
/// [`MAX_DURATION`](xtr_lock::MAX_DURATION) (3650 days), naming the flag on error.
pub(crate) fn duration(flag: &str, text: &str) -> Result<Duration> {
    let d = humantime::parse_duration(text).map_err(|e| {
        anyhow!("{flag} {text:?} is not a duration ({e}); write it like 30s, 2m, 1h30m or 500ms")
    })?;
    if d > xtr_lock::MAX_DURATION {
        return Err(anyhow!(
            "{flag} {text:?} is too long: the longest accepted is 3650days"
        ));
    }
    Ok(d)
}

/// How to take a lock.
#[derive(Debug, Clone)]
pub(crate) struct Take {
    /// `-n`: [`Wait::Never`]; `-w D`: [`Wait::AtMost`]; neither: [`Wait::Forever`], the same
    /// meanings as in the library.
    pub wait: Wait,
    pub mode: Mode,
    pub ttl: Duration,
    pub conflict_exit_code: u8,
    pub quiet: bool,
}

/// The default lifetime on stores where locks expire: renewed while a command runs.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(60);

impl Take {
    pub(crate) fn from_args(args: &WaitArgs) -> Result<Take> {
        let ttl = match &args.ttl {
            Some(t) => duration("--ttl", t)?,
            None => DEFAULT_TTL,
        };
        if ttl.is_zero() {
            return Err(anyhow!("--ttl must be more than zero"));
        }
        let wait = match (&args.wait, args.nonblock) {
            (_, true) => Wait::Never,
            (Some(w), false) => Wait::AtMost(duration("--wait", w)?),
            (None, false) => Wait::Forever,
        };
        Ok(Take {
            wait,
            mode: if args.shared { Mode::Read } else { Mode::Write },
            ttl,
            conflict_exit_code: args.conflict_exit_code,
            quiet: args.quiet,
        })
    }
}

/// The store a DSN names. Errors show the scheme only, never the DSN.
pub(crate) struct StoreConfig {
    pub store: Arc<dyn Store>,
    /// What the command may be told about the store: its scheme only.
    pub scheme: String,
    /// Whether a key from this store can be used by another process.
    pub keys_travel: bool,
}

impl StoreConfig {
    pub(crate) fn from_args(args: &StoreArgs) -> Result<StoreConfig> {
        let scheme_of = |dsn: &str| dsn.split_once(':').map_or(dsn, |(s, _)| s).to_owned();
        let (store, scheme): (Arc<dyn Store>, String) = match args.store.as_slice() {
            [dsn] => (
                StoreFactory::create_store(dsn).with_context(|| {
                    "--store (or XTR_LOCK_STORE) names no usable store".to_owned()
                })?,
                scheme_of(dsn),
            ),
            dsns => {
                let refs: Vec<&str> = dsns.iter().map(String::as_str).collect();
                let combined = CombinedStore::from_dsns(&refs, ConsensusStrategy)
                    .with_context(|| "a --store names no usable store".to_owned())?;
                let schemes: Vec<String> = dsns.iter().map(|d| scheme_of(d)).collect();
                (
                    Arc::new(combined),
                    format!("combined({})", schemes.join(",")),
                )
            }
        };
        let caps = store.capabilities();
        // In-memory locks die with this process; flock keys hold an open file.
        let keys_travel = caps.serializable_keys && !args.store.iter().any(|d| d == "in-memory");
        Ok(StoreConfig {
            store,
            scheme,
            keys_travel,
        })
    }

    pub(crate) fn factory(&self) -> LockFactory {
        LockFactory::from_arc(self.store.clone())
    }

    pub(crate) fn lock(&self, resource: &str, ttl: Duration) -> Lock {
        self.factory().create_lock(resource).with_ttl(Some(ttl))
    }
}
