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

/// The scheme as errors may show it: itself when it looks like one, never a pasted secret.
pub(crate) fn shown_scheme(scheme: &str) -> &str {
    if looks_like_keyword(scheme) {
        scheme
    } else {
        "(redacted)"
    }
}

/// Query options that hold secrets in any store's DSN.
const SECRET_OPTIONS: &[&str] = &[
    "password",
    "pass",
    "passwd",
    "auth",
    "secret",
    "token",
    "sslpassword",
    "sslkey",
];

/// A whole DSN with its secrets replaced by `***` (see [`StoreFactory::redact`](crate::StoreFactory::redact)).
pub(crate) fn redact_dsn(dsn: &str, own: &[&str], lone_user_is_secret: bool) -> String {
    if !dsn.contains(':') {
        return dsn.to_owned(); // a keyword: flock, in-memory, null
    }
    let Ok(mut url) = url::Url::parse(dsn) else {
        let scheme = dsn.split_once(':').map_or("", |(s, _)| s);
        return format!("{}:(redacted: not a URL)", shown_scheme(scheme));
    };
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    } else if lone_user_is_secret && !url.username().is_empty() {
        let _ = url.set_username("***");
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let name = k.to_ascii_lowercase();
                let secret =
                    SECRET_OPTIONS.contains(&name.as_str()) || own.contains(&name.as_str());
                (
                    k.into_owned(),
                    if secret { "***".into() } else { v.into_owned() },
                )
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
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
