//! What goes to stderr: holders, durations and errors for people, and while waiting one status
//! line, on a terminal only.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xtr_lock::store::HolderInfo;
use xtr_lock::{Mode, Store};

/// Prints `text` and a newline on stdout; a closed pipe is not an error (`| head`): the
/// reader has what it wanted.
pub(crate) fn print(text: &str) -> anyhow::Result<()> {
    print_bytes(format!("{text}\n").as_bytes())
}

/// Writes `bytes` on stdout as they are; a closed pipe is not an error, as for [`print()`].
pub(crate) fn print_bytes(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// A mode as the command shows it (lines, JSON, `XTR_LOCK_MODE`): `write` or `read`.
pub(crate) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Write => "write",
        Mode::Read => "read",
    }
}

/// Describes holders: `pid 1234 (write, 12s left), pid 99 (read)`; a store's queue also has
/// waiters: `lease 694d, queued at revision 42 (write, 58s left), …`.
pub(crate) fn holders(list: &[HolderInfo]) -> String {
    list.iter()
        .map(|h| {
            let who = match (h.pid, &h.id) {
                _ if h.backend.is_some() => h.backend.clone().unwrap_or_default(),
                (Some(pid), _) => format!("pid {pid}"),
                (None, Some(id)) => format!("holder {id}"),
                (None, None) => "someone".to_owned(),
            };
            let mut what = vec![match h.permits {
                Some(1) => "1 permit".to_owned(),
                Some(n) => format!("{n} permits"),
                None => mode_name(h.mode).to_owned(),
            }];
            if h.waiting {
                what.push("waiting".to_owned());
            }
            if let Some(left) = h.remaining {
                what.push(format!("{} left", short(left)));
            }
            format!("{who} ({})", what.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `; held by …` for the holders in `list`, and `; N queued` for a store's queue (this waiter
/// among them); empty when there is neither.
pub(crate) fn held_by(list: &[HolderInfo]) -> String {
    let (waiting, holding): (Vec<HolderInfo>, Vec<HolderInfo>) =
        list.iter().cloned().partition(|h| h.waiting);
    let mut out = String::new();
    if !holding.is_empty() {
        out.push_str("; held by ");
        out.push_str(&holders(&holding));
    }
    if !waiting.is_empty() {
        out.push_str(&format!("; {} queued", waiting.len()));
    }
    out
}

/// An error and its causes on one line, each once, the lock and the store named once (the
/// library's [`xtr_lock::Report`]).
pub(crate) fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    xtr_lock::Report::new(err).to_string()
}

/// Whether `run --json` asked for events as JSON lines: every line xtr-lock itself writes on
/// stderr is then one JSON object, `{"xtr_lock": "<event>", ...}`.
static JSON: AtomicBool = AtomicBool::new(false);

pub(crate) fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

pub(crate) fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Whether the command asked for -v (what the exit says about clean-ups left running).
static VERBOSE: AtomicBool = AtomicBool::new(false);

pub(crate) fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

pub(crate) fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// Writes the event `name` with `fields` as one JSON line on stderr.
pub(crate) fn event(name: &str, fields: serde_json::Value) {
    let mut object = serde_json::Map::new();
    object.insert("xtr_lock".to_owned(), name.into());
    if let serde_json::Value::Object(more) = fields {
        object.extend(more);
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{}", serde_json::Value::Object(object));
}

/// An error line: `xtr-lock: error: …`, or an `error` event under `--json`.
pub(crate) fn error_line(message: &str) {
    if json() {
        event("error", serde_json::json!({"message": message}));
    } else {
        eprintln!("xtr-lock: error: {message}");
    }
}

/// A warning line: `xtr-lock: warning: …`, or a `warning` event under `--json`.
pub(crate) fn warning(message: &str) {
    if json() {
        event("warning", serde_json::json!({"message": message}));
    } else {
        eprintln!("xtr-lock: warning: {message}");
    }
}

/// A duration rounded for people: `850ms`, `12s`, `3m 20s`.
pub(crate) fn short(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// Who holds what `key` asks for, where the store can tell: a semaphore's holders (with their
/// permits) for a semaphore's key, the lock's holders otherwise; `None` where the store cannot
/// tell or the question failed.
pub(crate) async fn who_holds(store: &dyn Store, key: &xtr_lock::Key) -> Option<Vec<HolderInfo>> {
    if key.permits().is_some() {
        return store.usage(key).await.ok().map(|u| u.holders);
    }
    if !store.capabilities().introspection {
        return None;
    }
    store.holders(key.resource()).await.ok()
}

/// While alive, redraws `waiting for 'r' (3s); held by pid 1234 (write)` on stderr every 250 ms,
/// if stderr is a terminal; clears it when dropped.
pub(crate) struct StatusLine {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl StatusLine {
    pub(crate) fn start(store: Arc<dyn Store>, key: xtr_lock::Key, quiet: bool) -> StatusLine {
        if quiet || !std::io::stderr().is_terminal() {
            return StatusLine { task: None };
        }
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let resource = key.resource();
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let mut line = format!(
                    "xtr-lock: waiting for {resource:?} ({})",
                    short(started.elapsed())
                );
                if let Some(list) = who_holds(store.as_ref(), &key).await {
                    line.push_str(&held_by(&list));
                }
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{line}");
                let _ = err.flush();
            }
        });
        StatusLine { task: Some(task) }
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::causes;

    #[test]
    fn causes_already_shown_are_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let store = xtr_lock::Error::storage(format!("cannot reach the server: {io}"))
            .with_source(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let top = anyhow::Error::new(store).context("lock 'r': failed to acquire the lock");
        assert_eq!(
            causes(top.as_ref()),
            format!("lock 'r': failed to acquire the lock: cannot reach the server: {io}")
        );
        let plain = anyhow::anyhow!("outer").context("top");
        assert_eq!(causes(plain.as_ref()), "top: outer");
    }

    #[test]
    fn a_wrapped_store_error_names_the_lock_and_the_store_once() {
        let root = xtr_lock::Error::storage("cannot reach the Redis server: Connection refused")
            .with_resource("r")
            .with_store("redis://h:1/0");
        let err = anyhow::Error::new(root).context("lock 'r': failed to acquire the lock");
        assert_eq!(
            causes(err.as_ref()),
            "lock 'r': failed to acquire the lock: cannot reach the Redis server: Connection \
             refused (store redis://h:1/0)"
        );
    }
}
