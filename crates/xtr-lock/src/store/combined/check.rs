//! The quorum's pre-flight check: every member's, gathered.

use futures_util::future::join_all;

use super::CombinedStore;
use crate::error::{Error, Result};
use crate::store::{Store as _, StoreWarning};

impl CombinedStore {
    /// Every member checked at once; their warnings, each naming its member. A member that
    /// cannot be checked is a warning naming it (the quorum may do without it); an error only
    /// when no member can be.
    pub(super) async fn check_members(&self) -> Result<Vec<StoreWarning>> {
        let answers = join_all(self.stores.iter().map(|s| s.check())).await;
        let mut out = Vec::new();
        let mut failed = Vec::new();
        for (member, answer) in self.stores.iter().zip(answers) {
            match answer {
                Ok(found) => out.extend(found.into_iter().map(|w| {
                    if w.store().is_empty() {
                        w.with_store(member)
                    } else {
                        w
                    }
                })),
                Err(err) => failed.push((member, err)),
            }
        }
        if failed.len() == self.stores.len() {
            let why: Vec<String> = failed.iter().map(|(_, e)| e.to_string()).collect();
            return Err(Error::storage(format!(
                "no member of the quorum could be checked: {}",
                why.join("; ")
            ))
            .with_store(self)
            .temporary());
        }
        for (member, err) in failed {
            out.push(
                StoreWarning::new(
                    "member",
                    format!("this member could not be checked: {err}"),
                    "while it cannot be reached the quorum stands on the others, and tolerates \
                     that many failures fewer",
                    "bring it back, or replace it",
                )
                .with_store(member),
            );
        }
        Ok(out)
    }
}
