//! `${VAR}` in configuration values, from the environment.
//!
//! Only the braced form is expanded (`$VAR` is left alone: passwords contain `$`); `${VAR:-text}`
//! gives `text` when `VAR` is unset or empty; `$${` is a literal `${`.

/// Expands `text`, looking variables up with `env`. On failure, the names of the variables that
/// are unset (each once, in order), or why the text is malformed.
pub(super) fn expand(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, Problem> {
    let mut out = String::with_capacity(text.len());
    let mut unset: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let Some(end) = tail.find('}') else {
                return Err(Problem::Unclosed);
            };
            let inner = &tail[..end];
            let (name, fallback) = match inner.split_once(":-") {
                Some((name, fallback)) => (name, Some(fallback)),
                None => (inner, None),
            };
            if !is_name(name) {
                return Err(Problem::BadName(name.to_owned()));
            }
            match (env(name).filter(|v| !v.is_empty()), fallback) {
                (Some(value), _) => out.push_str(&value),
                (None, Some(fallback)) => out.push_str(fallback),
                (None, None) => {
                    if !unset.iter().any(|n| n == name) {
                        unset.push(name.to_owned());
                    }
                }
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    if unset.is_empty() {
        Ok(out)
    } else {
        Err(Problem::Unset(unset))
    }
}

/// Why a value could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Problem {
    /// These variables are unset (or empty) and have no fallback.
    Unset(Vec<String>),
    /// A `${` without its `}`.
    Unclosed,
    /// `${…}` around something that is not a variable name.
    BadName(String),
}

fn is_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PASS" => Some("s3cr$t".into()),
            "EMPTY" => Some(String::new()),
            "HOST" => Some("cache".into()),
            _ => None,
        }
    }

    #[test]
    fn expands_braced_variables_and_fallbacks_only() {
        let cases = [
            (
                "redis://:${PASS}@${HOST}:6379",
                "redis://:s3cr$t@cache:6379",
            ),
            ("redis://${MISSING:-localhost}", "redis://localhost"),
            ("redis://${EMPTY:-localhost}", "redis://localhost"),
            ("redis://:pa$word@h", "redis://:pa$word@h"),
            ("literal $${HOST}", "literal ${HOST}"),
            ("trailing $", "trailing $"),
            ("no variables", "no variables"),
        ];
        for (text, want) in cases {
            assert_eq!(expand(text, &env).as_deref(), Ok(want), "{text}");
        }
    }

    #[test]
    fn reports_every_unset_variable_once_and_malformed_text() {
        assert_eq!(
            expand("${A}${B}${A}${HOST}", &env),
            Err(Problem::Unset(vec!["A".into(), "B".into()]))
        );
        assert_eq!(
            expand("${EMPTY}", &env),
            Err(Problem::Unset(vec!["EMPTY".into()]))
        );
        assert_eq!(expand("x${HOST", &env), Err(Problem::Unclosed));
        assert_eq!(expand("${1X}", &env), Err(Problem::BadName("1X".into())));
        assert_eq!(expand("${}", &env), Err(Problem::BadName(String::new())));
    }
}
