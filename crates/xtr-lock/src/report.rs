//! [`Report`]: an error and its causes on one line, each said once: what `Error`'s `Debug`
//! shows (so `fn main() -> xtr_lock::Result<()>` ends with a line, not a dump) and what the
//! `xtr-lock` command prints.

use std::error::Error as StdError;
use std::fmt;

/// An error and its [`source`](StdError::source) chain as one line: each cause after a colon,
/// each once.
///
/// A store error names its cause in its own message and keeps the backend's error as its
/// source (for code that inspects it), so a cause whose text is already shown is left out;
/// so are the parts of a cause that repeat what is shown (`lock 'r': ` again, the same
/// `(store …)`, which is said once, at the end). A cause of several lines is joined into one.
///
/// # Examples
///
/// ```
/// use xtr_lock::{Error, Report};
/// let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let err = Error::storage(format!("cannot reach the server: {io}"))
///     .with_store("redis://h:6379/0")
///     .with_source(io);
/// assert_eq!(
///     Report::new(&err).to_string(),
///     "cannot reach the server: connection refused (store redis://h:6379/0)"
/// );
/// // `Debug` is the same line: what `fn main() -> xtr_lock::Result<()>` prints.
/// assert_eq!(format!("{err:?}"), Report::new(&err).to_string());
/// ```
#[derive(Clone, Copy)]
pub struct Report<'a>(&'a (dyn StdError + 'static));

impl<'a> Report<'a> {
    /// The report of `err` and its causes.
    pub fn new(err: &'a (dyn StdError + 'static)) -> Self {
        Report(err)
    }
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&with_causes(self.0.to_string(), self.0.source()))
    }
}

/// `said` followed by the causes from `next` on, as a [`Report`] shows them: what a store uses
/// to word a backend error whose own message hides its cause (a gRPC status saying "tcp connect
/// error", its source saying the connection was refused).
pub(crate) fn with_causes(said: String, mut next: Option<&(dyn StdError + 'static)>) -> String {
    // Which store: said once, at the end.
    let mut store: Option<String> = None;
    let mut take_store = |text: &mut String| {
        if text.ends_with(')')
            && let Some(at) = text.rfind(" (store ")
        {
            store.get_or_insert_with(|| text[at..].to_owned());
            text.truncate(at);
        }
    };
    let mut line = said;
    take_store(&mut line);
    let mut line = one_line(line);
    while let Some(cause) = next {
        let mut text = cause.to_string();
        take_store(&mut text);
        let text = one_line(text);
        let text = unrepeated(&line, text);
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = cause.source();
    }
    if let Some(store) = store {
        line.push_str(&store);
    }
    line
}

impl fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `text` without a leading `lock 'r': ` that `shown` already names (a wrapped error naming its
/// lock again).
fn unrepeated(shown: &str, text: String) -> String {
    match text.split_once(": ") {
        Some((head, rest)) if head.starts_with("lock ") && shown.contains(head) => rest.to_owned(),
        _ => text,
    }
}

/// A text of several lines (a parser's dump) as one: its non-empty lines, trimmed, joined by
/// `; `.
fn one_line(text: String) -> String {
    if !text.contains(['\n', '\r']) {
        return text;
    }
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, ErrorKind, LostReason};

    fn report(err: &(dyn StdError + 'static)) -> String {
        Report::new(err).to_string()
    }

    #[test]
    fn causes_already_shown_are_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let store = Error::storage(format!("cannot reach the server: {io}"))
            .with_source(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let top = Error::wrap(
            ErrorKind::Acquiring,
            "r",
            "failed to acquire the lock",
            store,
        );
        assert_eq!(
            report(&top),
            format!("lock 'r': failed to acquire the lock: cannot reach the server: {io}")
        );
    }

    #[test]
    fn a_wrapped_store_error_names_the_lock_and_the_store_once() {
        let root = Error::storage("cannot reach the Redis server: Connection refused")
            .with_resource("r")
            .with_store("redis://h:1/0");
        let err = Error::wrap(
            ErrorKind::Acquiring,
            "r",
            "failed to acquire the lock",
            root,
        );
        assert_eq!(
            report(&err),
            "lock 'r': failed to acquire the lock: cannot reach the Redis server: Connection \
             refused (store redis://h:1/0)"
        );
    }

    #[test]
    fn a_loss_does_not_name_its_lock_twice() {
        let refused = Error::wrap(
            ErrorKind::Acquiring,
            "r",
            "failed to define an expiration",
            Error::storage("refused"),
        );
        let lost = Error::lost("r", LostReason::Unreachable).with_source(refused);
        assert_eq!(
            report(&lost),
            "lock 'r' was lost: the store could not be reached before its lifetime ran out: \
             failed to define an expiration: refused"
        );
        assert_eq!(
            unrepeated("lock 'r' was lost", "lock 'other': x".into()),
            "lock 'other': x",
            "another lock is named"
        );
    }

    #[test]
    fn a_cause_of_several_lines_is_one() {
        let dump = std::io::Error::other("Parse error at 1\nUnexpected `82`\nUnexpected `69`\n");
        let err = Error::storage("the server answered something else").with_source(dump);
        assert_eq!(
            report(&err),
            "the server answered something else: Parse error at 1; Unexpected `82`; Unexpected `69`"
        );
        let dumped = Error::storage("refused: Parse error at 1\nUnexpected `82`\n").with_store("s");
        assert_eq!(
            report(&dumped),
            "refused: Parse error at 1; Unexpected `82` (store s)"
        );
    }
}
