//! `migrate`: make (or check) the tables of SQL stores.

use anyhow::{Result, anyhow};
use xtr_lock::{SqlStore, StoreFactory};

use crate::args::Source;
use crate::exit::Exit;

/// Makes the lock, fencing, holder-record and semaphore tables of every SQL store the source names (or prints their SQL).
pub(crate) async fn migrate(source: &Source, print: bool) -> Result<Exit> {
    let spec = source.spec();
    let sql: Vec<&String> = spec
        .dsns()
        .iter()
        .filter(|d| StoreFactory::kind(d).is_some_and(|k| k.tables))
        .collect();
    if sql.is_empty() {
        return Err(anyhow!(
            "migrate makes the tables of SQL stores, and {} names none (postgres://, mysql://, \
             mariadb://, sqlite:///path)",
            source.name()
        ));
    }
    for dsn in sql {
        let store = SqlStore::from_dsn(dsn)?;
        if print {
            crate::output::print(&format!("-- {store}"))?;
            for statement in store.ddl() {
                crate::output::print(&format!("{statement};"))?;
            }
            continue;
        }
        let made = store.create_table().await?;
        let t = store.table();
        // The fair queue, on a fair store (not with `?fair=false`).
        let queue = if xtr_lock::Store::capabilities(&store).fair {
            format!("{t}_queue, ")
        } else {
            String::new()
        };
        let what = format!("{t}, {t}_fence, {t}_holder, {queue}{t}_sem and {t}_perm in {store}");
        if made {
            crate::output::print(&format!("made {what}"))?;
        } else {
            crate::output::print(&format!("{what}: already there, columns as they should be"))?;
        }
        xtr_lock::Store::close(&store).await?;
    }
    Ok(Exit::Ok)
}
