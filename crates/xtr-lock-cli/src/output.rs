//! What goes to stderr: holders, durations and errors for people, and while waiting one status
//! line, on a terminal only.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::store::HolderInfo;
use xtr_lock::{Mode, Store};

/// Describes holders: `pid 1234 (write, 12s left), pid 99 (read)`.
pub(crate) fn holders(list: &[HolderInfo]) -> String {
    list.iter()
        .map(|h| {
            let who = match (h.pid, &h.id) {
                (Some(pid), _) => format!("pid {pid}"),
                (None, Some(id)) => format!("holder {id}"),
                (None, None) => "someone".to_owned(),
            };
            let mode = match h.mode {
                Mode::Write => "write",
                Mode::Read => "read",
            };
            match h.remaining {
                Some(left) => format!("{who} ({mode}, {} left)", short(left)),
                None => format!("{who} ({mode})"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// An error and its causes on one line, each after a colon; a cause whose text is already
/// shown (a store error quoting the I/O error it wraps) is not repeated.
pub(crate) fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = cause.source();
    }
    line
}

/// A duration rounded for people: `850ms`, `12s`, `3m 20s`.
pub(crate) fn short(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// While alive, redraws `waiting for 'r' (3s); held by pid 1234 (write)` on stderr every 250 ms,
/// if stderr is a terminal; clears it when dropped.
pub(crate) struct StatusLine {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl StatusLine {
    pub(crate) fn start(store: Arc<dyn Store>, resource: String, quiet: bool) -> StatusLine {
        if quiet || !std::io::stderr().is_terminal() {
            return StatusLine { task: None };
        }
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let introspect = store.capabilities().introspection;
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let mut line = format!(
                    "xtr-lock: waiting for {resource:?} ({})",
                    short(started.elapsed())
                );
                if introspect
                    && let Ok(list) = store.holders(&resource).await
                    && !list.is_empty()
                {
                    line.push_str("; held by ");
                    line.push_str(&holders(&list));
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
}
