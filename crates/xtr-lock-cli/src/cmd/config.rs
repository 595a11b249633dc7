//! `config check` and `config show`: a lock configuration file checked (every problem at once,
//! optionally every store reached) or printed as checked, credentials redacted.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use serde_json::json;
use xtr_lock::config::{CheckedEntry, Locks, QuorumKind};
use xtr_lock::{StoreFactory, Wait};

use crate::cli::ConfigFileArgs;
use crate::exit::Exit;
use crate::file::{LoadError, Loaded, Origins, origins};
use crate::output;

fn path(file: &ConfigFileArgs) -> Result<PathBuf> {
    crate::file::path(file.config.as_deref()).ok_or_else(|| {
        anyhow!(
            "no lock configuration to read: give --config FILE or set ${}",
            crate::file::CONFIG_ENV
        )
    })
}

/// Loads the file; its problems are printed here (one per line, or as JSON) and are the answer.
fn load(file: &ConfigFileArgs) -> Result<std::result::Result<Loaded, Exit>> {
    let path = path(file)?;
    let problems = match crate::file::load(&path) {
        Ok(loaded) => return Ok(Ok(loaded)),
        Err(LoadError::Unreadable(why)) => vec![why],
        Err(LoadError::Problems(p)) => p,
    };
    if file.json {
        println!(
            "{}",
            json!({"file": path.display().to_string(), "ok": false, "problems": problems})
        );
    } else {
        for problem in &problems {
            eprintln!("xtr-lock: {}: {problem}", path.display());
        }
    }
    Ok(Err(Exit::Error))
}

/// `config check`: every entry checked, and with `ping` (how long each may take to answer)
/// every store reached.
pub(crate) async fn check(file: &ConfigFileArgs, ping: Option<Duration>) -> Result<Exit> {
    let loaded = match load(file)? {
        Ok(loaded) => loaded,
        Err(exit) => return Ok(exit),
    };
    let shown = loaded.path.display().to_string();
    let count = loaded.checked.entries.len();
    let default = loaded.checked.default.clone();
    let Some(deadline) = ping else {
        if file.json {
            println!(
                "{}",
                json!({"file": shown, "ok": true, "default": default, "entries": count})
            );
        } else {
            println!(
                "{shown}: {count} entr{}, default {default:?}: sound",
                if count == 1 { "y" } else { "ies" }
            );
        }
        return Ok(Exit::Ok);
    };
    let locks = Locks::from_checked(loaded.checked);
    let started = Instant::now();
    let report = locks.ping(deadline).await;
    let took = started.elapsed();
    if let Err(err) = locks.close().await {
        output::warning(&output::causes(&err));
    }
    let failed = report.iter().filter(|(_, r)| r.is_err()).count();
    if file.json {
        let entries: serde_json::Map<String, serde_json::Value> = report
            .iter()
            .map(|(entry, answer)| {
                let value = match answer {
                    Ok(()) => json!({"reached": true}),
                    Err(e) => json!({"reached": false, "error": output::causes(e)}),
                };
                (entry.clone(), value)
            })
            .collect();
        println!(
            "{}",
            json!({"file": shown, "ok": failed == 0, "default": default, "entries": entries})
        );
    } else {
        let width = report.iter().map(|(e, _)| e.len()).max().unwrap_or(0);
        for (entry, answer) in &report {
            match answer {
                Ok(()) => println!("{entry:width$}  reached"),
                Err(e) => println!("{entry:width$}  NOT REACHED: {}", output::causes(e)),
            }
        }
        println!(
            "{shown}: {} of {count} reached within {} ({})",
            count - failed,
            output::short(deadline),
            output::short(took)
        );
    }
    Ok(if failed == 0 {
        Exit::Ok
    } else {
        Exit::Unavailable
    })
}

/// `config show`: the file as checked, credentials redacted, each entry's prefix, ttl and wait
/// as `run` and `acquire` use them when no flag says otherwise (the defaults filled in, each
/// value saying where it came from). A reader that stops early (`| head`) ends it quietly.
pub(crate) fn show(file: &ConfigFileArgs) -> Result<Exit> {
    if crate::file::path(file.config.as_deref()).is_none() {
        return show_without_file(file.json);
    }
    let loaded = match load(file)? {
        Ok(loaded) => loaded,
        Err(exit) => return Ok(exit),
    };
    let checked = &loaded.checked;
    if file.json {
        let entries: serde_json::Map<String, serde_json::Value> = checked
            .entries
            .iter()
            .map(|(name, e)| (name.clone(), entry_json(e, origins(&loaded.raw, name))))
            .collect();
        let shown = json!({
            "file": loaded.path.display().to_string(),
            "default": checked.default,
            "entries": entries,
        });
        output::print(&shown.to_string())?;
        return Ok(Exit::Ok);
    }
    let mut text = format!(
        "# {}, checked; variables expanded, credentials redacted\n# prefix, ttl and wait as \
         commands use them without --ttl, -w or -n; after each, where it is set:\n# the \
         entry, the file (its top level), or the default (the library's)\n{}default = {}\n",
        loaded.path.display(),
        store_env_note(),
        quoted(&checked.default)
    );
    for (name, e) in &checked.entries {
        text.push_str(&entry_toml(name, e, origins(&loaded.raw, name)));
    }
    output::print(text.trim_end())?;
    Ok(Exit::Ok)
}

/// `config show` with no file to read: what commands use then, the store of
/// `$XTR_LOCK_STORE` or the default one, with the library's defaults.
fn show_without_file(json: bool) -> Result<Exit> {
    let source = crate::args::Source::of(&crate::cli::StoreArgs::default())?;
    let from = match &source {
        crate::args::Source::Env(_) => format!("${}", crate::args::STORE_ENV),
        _ => "default".to_owned(),
    };
    let stores: Vec<String> = source.spec().dsns().iter().map(|d| redacted(d)).collect();
    let ttl = ttl_text(Some(crate::args::DEFAULT_TTL));
    let wait = wait_text(Wait::Forever);
    if json {
        let shown = json!({
            "file": null,
            "stores": stores,
            "prefix": "",
            "ttl": ttl,
            "wait": wait,
            "from": {"stores": from, "prefix": "default", "ttl": "default", "wait": "default"},
        });
        output::print(&shown.to_string())?;
        return Ok(Exit::Ok);
    }
    let list: Vec<String> = stores.iter().map(|d| quoted(d)).collect();
    let text = format!(
        "# no lock configuration file (--config FILE, ${}): commands use this without --store,\n\
         # --ttl, -w or -n; after each, where it is set\nstores = [{}]  # {from}\nprefix = \"\"  \
         # default\nttl = {}  # default\nwait = {}  # default",
        crate::file::CONFIG_ENV,
        list.join(", "),
        quoted(&ttl),
        quoted(&wait),
    );
    output::print(&text)?;
    Ok(Exit::Ok)
}

/// What `config show` says when `$XTR_LOCK_STORE` is set: commands without --config use it,
/// not the file `$XTR_LOCK_CONFIG` names.
fn store_env_note() -> String {
    match std::env::var_os(crate::args::STORE_ENV) {
        Some(v) if !v.is_empty() => format!(
            "# note: ${} is set: commands without --config or --use use it, not this file\n",
            crate::args::STORE_ENV
        ),
        _ => String::new(),
    }
}

/// One entry as `config show` prints it, after a blank line.
fn entry_toml(name: &str, e: &CheckedEntry, from: Origins) -> String {
    let stores = match e.store.quorum() {
        None => format!("dsn = {}", quoted(&redacted(&e.store.dsns()[0]))),
        Some(kind) => {
            let list: Vec<String> = e
                .store
                .dsns()
                .iter()
                .map(|d| quoted(&redacted(d)))
                .collect();
            format!(
                "dsns = [{}]\nstrategy = {}",
                list.join(", "),
                quoted(quorum_name(kind))
            )
        }
    };
    format!(
        "\n[stores.{}]\n{stores}\nprefix = {}  # {}\nttl = {}  # {}\nwait = {}  # {}\n",
        quoted(name),
        quoted(&e.prefix),
        from.prefix.name(),
        quoted(&ttl_text(e.ttl)),
        from.ttl.name(),
        quoted(&wait_text(e.wait)),
        from.wait.name(),
    )
}

fn entry_json(e: &CheckedEntry, from: Origins) -> serde_json::Value {
    json!({
        "stores": e.store.dsns().iter().map(|d| redacted(d)).collect::<Vec<_>>(),
        "strategy": e.store.quorum().map(quorum_name),
        "prefix": e.prefix,
        "ttl": ttl_text(e.ttl),
        "wait": wait_text(e.wait),
        "from": {
            "prefix": from.prefix.name(),
            "ttl": from.ttl.name(),
            "wait": from.wait.name(),
        },
    })
}

fn quorum_name(kind: QuorumKind) -> &'static str {
    match kind {
        QuorumKind::Consensus => "consensus",
        QuorumKind::Unanimous => "unanimous",
    }
}

fn ttl_text(ttl: Option<Duration>) -> String {
    ttl.map_or_else(
        || "none".to_owned(),
        |d| humantime::format_duration(d).to_string(),
    )
}

fn wait_text(wait: Wait) -> String {
    match wait {
        Wait::Never => "0".to_owned(),
        Wait::Forever => "forever".to_owned(),
        Wait::AtMost(d) => humantime::format_duration(d).to_string(),
    }
}

/// A TOML (and JSON) basic string.
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// A DSN as `config show` prints it: secrets replaced by `***` ([`StoreFactory::redact`]).
fn redacted(dsn: &str) -> String {
    StoreFactory::redact(dsn)
}
