//! `config check` and `config show`: a lock configuration file checked (every problem at once,
//! optionally every store reached) or printed as checked, credentials redacted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use serde_json::json;
use xtr_lock::config::{CheckedEntry, Locks, QuorumKind};
use xtr_lock::store::{Severity, StoreWarning};
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
/// every store reached and its server's set-up checked (warnings, and with `verbose` notes,
/// printed; they do not change the exit status).
pub(crate) async fn check(
    file: &ConfigFileArgs,
    ping: Option<Duration>,
    verbose: bool,
) -> Result<Exit> {
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
    let checks = store_checks(&locks, &report, deadline, verbose).await;
    let took = started.elapsed();
    if let Err(err) = locks.close().await {
        output::warning(&output::causes(&err));
    }
    let failed = report.iter().filter(|(_, r)| r.is_err()).count();
    let text = if file.json {
        let entries = entries_json(&report, &checks);
        json!({"file": shown, "ok": failed == 0, "default": default, "entries": entries})
            .to_string()
    } else {
        let mut text = entries_text(&report, &checks);
        let warned = checks
            .values()
            .flatten()
            .flatten()
            .filter(|w| w.severity() == Severity::Warning)
            .count();
        text.push_str(&format!(
            "{shown}: {} of {count} reached within {} ({}){}",
            count - failed,
            output::short(deadline),
            output::short(took),
            match warned {
                0 => String::new(),
                1 => ", 1 warning".to_owned(),
                n => format!(", {n} warnings"),
            }
        ));
        text
    };
    // A reader that stops early (`| head`) ends it quietly.
    output::print(&text)?;
    Ok(if failed == 0 {
        Exit::Ok
    } else {
        Exit::Unavailable
    })
}

/// What a check of an entry's store came to: its warnings, or why it could not be checked.
type Checked = std::result::Result<Vec<StoreWarning>, String>;

/// Each reached entry's store checked ([`Store::check`]), all at once,
/// each within `deadline`: its warnings (notes only with `verbose`), or why not.
async fn store_checks(
    locks: &Locks,
    report: &[(String, xtr_lock::Result<()>)],
    deadline: Duration,
    verbose: bool,
) -> BTreeMap<String, Checked> {
    let reached = report.iter().filter(|(_, r)| r.is_ok()).map(|(e, _)| e);
    let tasks: Vec<_> = reached
        .map(|entry| {
            let store = locks.factory(entry).map(|f| f.store().clone());
            let task = tokio::spawn(async move {
                let store = store.map_err(|e| output::causes(&e))?;
                match tokio::time::timeout(deadline, store.check()).await {
                    Ok(found) => found.map_err(|e| output::causes(&e)),
                    Err(_) => Err(format!(
                        "the store did not answer within {}",
                        output::short(deadline)
                    )),
                }
            });
            (entry.clone(), task)
        })
        .collect();
    let mut out = BTreeMap::new();
    for (entry, task) in tasks {
        let found = task.await.unwrap_or_else(|e| Err(e.to_string()));
        let found = found.map(|all| {
            all.into_iter()
                .filter(|w| verbose || w.severity() != Severity::Note)
                .collect()
        });
        out.insert(entry, found);
    }
    out
}

/// Each entry reached or not, and what its check found, as `--json` prints them.
fn entries_json(
    report: &[(String, xtr_lock::Result<()>)],
    checks: &BTreeMap<String, Checked>,
) -> serde_json::Map<String, serde_json::Value> {
    report
        .iter()
        .map(|(entry, answer)| {
            let value = match (answer, checks.get(entry)) {
                (Ok(()), Some(Ok(found))) => json!({"reached": true,
                    "warnings": found.iter().map(warning_json).collect::<Vec<_>>()}),
                (Ok(()), Some(Err(e))) => json!({"reached": true, "check_error": e}),
                (Ok(()), None) => json!({"reached": true}),
                (Err(e), _) => json!({"reached": false, "error": output::causes(e)}),
            };
            (entry.clone(), value)
        })
        .collect()
}

/// Each entry reached or not, then a line per warning its check found, each line naming the
/// entry.
fn entries_text(
    report: &[(String, xtr_lock::Result<()>)],
    checks: &BTreeMap<String, Checked>,
) -> String {
    let width = report.iter().map(|(e, _)| e.len()).max().unwrap_or(0);
    let mut text = String::new();
    for (entry, answer) in report {
        match answer {
            Ok(()) => text.push_str(&format!("{entry:width$}  reached\n")),
            Err(e) => text.push_str(&format!(
                "{entry:width$}  NOT REACHED: {}\n",
                output::causes(e)
            )),
        }
        match checks.get(entry) {
            Some(Ok(found)) => {
                for w in found {
                    text.push_str(&format!("{entry:width$}  {}: {w}\n", severity_name(w)));
                }
            }
            Some(Err(e)) => text.push_str(&format!("{entry:width$}  not checked: {e}\n")),
            None => {}
        }
    }
    text
}

/// `warning` or `note`.
fn severity_name(w: &StoreWarning) -> &'static str {
    match w.severity() {
        Severity::Note => "note",
        _ => "warning",
    }
}

/// A store's warning as `config check --json` prints it.
fn warning_json(w: &StoreWarning) -> serde_json::Value {
    json!({
        "severity": severity_name(w),
        "code": w.code(),
        "store": w.store(),
        "problem": w.problem(),
        "risk": w.risk(),
        "remedy": w.remedy(),
        "message": w.to_string(),
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
