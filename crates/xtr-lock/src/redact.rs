//! How connection strings may appear in messages: never with a credential.

/// How a DSN may be shown: its scheme and colon, or a keyword-looking word, never more.
pub(crate) fn redact(dsn: &str) -> String {
    match dsn.split_once(':') {
        Some((scheme, _)) if looks_like_keyword(scheme) => format!("\"{scheme}:\""),
        Some(_) => "(a connection string, redacted)".to_owned(),
        None if looks_like_keyword(dsn) => format!("\"{dsn}\""),
        None => "(a connection string, redacted)".to_owned(),
    }
}

fn looks_like_keyword(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'+' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_schemes_and_keywords_are_shown() {
        assert_eq!(redact("mysql://u:secret@h/db"), "\"mysql:\"");
        assert_eq!(redact("semaphore"), "\"semaphore\"");
        assert_eq!(redact("p@ss:word"), "(a connection string, redacted)");
        assert_eq!(redact("hunter2 pasted"), "(a connection string, redacted)");
    }
}
