//! The pre-flight check of a Memcached server ([`Store::check`](crate::Store::check)): whether
//! it evicts items, locks included, when its memory runs short.

use std::io;

use super::MemcachedStore;
use crate::error::{Error, Result};
use crate::store::StoreWarning;

impl MemcachedStore {
    /// `stats settings` on a new connection, within the response timeout: `evictions on` (the
    /// default; `-M` turns it off) is a warning.
    pub(super) async fn check_server(&self) -> Result<Vec<StoreWarning>> {
        let pool = &self.inner.pool;
        let ask = async {
            let (mut conn, _) = pool.get(true).await?;
            let settings = conn.stats("settings").await?;
            pool.put(conn);
            Ok::<_, io::Error>(settings)
        };
        let settings = match tokio::time::timeout(pool.timeout(), ask).await {
            Ok(Ok(settings)) => settings,
            Ok(Err(err)) => return Err(self.check_failed(&err.to_string()).with_source(err)),
            Err(_) => {
                return Err(self.check_failed(&format!("no answer within {:?}", pool.timeout())));
            }
        };
        Ok(warnings(&settings)
            .into_iter()
            .map(|w| w.with_store(self))
            .collect())
    }

    fn check_failed(&self, why: &str) -> Error {
        Error::storage(format!("cannot check the Memcached server: {why}"))
            .with_store(self)
            .temporary()
    }
}

/// What `stats settings` says that endangers locks.
fn warnings(settings: &[(String, String)]) -> Vec<StoreWarning> {
    let evicts = settings
        .iter()
        .any(|(name, value)| name == "evictions" && value == "on");
    if !evicts {
        return Vec::new();
    }
    vec![StoreWarning::new(
        "eviction",
        "evictions are on (memcached runs without -M)",
        "when its memory runs short Memcached evicts items before they expire, locks included: \
         a held lock can vanish and another holder take it",
        "start memcached with -M (it then refuses new items when memory runs out, and an \
         acquire fails instead of a lock vanishing), or give locks a server of their own",
    )]
}

#[cfg(test)]
mod tests {
    use super::warnings;

    fn settings(evictions: &str) -> Vec<(String, String)> {
        vec![
            ("maxbytes".to_owned(), "67108864".to_owned()),
            ("evictions".to_owned(), evictions.to_owned()),
        ]
    }

    #[test]
    fn evictions_on_is_a_warning() {
        let found = warnings(&settings("on"));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].code(), "eviction");
        assert!(warnings(&settings("off")).is_empty());
    }
}
