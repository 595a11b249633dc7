//! Which Lua helpers a script carries: every script runs its prelude on every call (each
//! `local function` is a closure made anew), so a script carries only the helpers it calls,
//! directly or through other helpers, in their order.

/// The helpers of `prelude` that `body` calls, directly or through other helpers, in their
/// order.
pub(super) fn prelude_from(prelude: &str, body: &str) -> String {
    // A helper is a comment followed by its code; its names are the functions it defines.
    let mut chunks: Vec<String> = Vec::new();
    let mut current = String::new();
    for line in prelude.lines().filter(|l| !l.is_empty()) {
        let starts_helper = line.starts_with("-- ")
            && !current.is_empty()
            && !current
                .trim_end()
                .lines()
                .last()
                .is_some_and(|l| l.starts_with("--"));
        if starts_helper {
            chunks.push(std::mem::take(&mut current));
        }
        current.push_str(line);
        current.push('\n');
    }
    chunks.push(current);
    let names: Vec<Vec<&str>> = chunks
        .iter()
        .map(|code| {
            code.lines()
                .filter_map(|l| l.strip_prefix("local function "))
                .filter_map(|l| l.split('(').next())
                .collect()
        })
        .collect();
    let calls = |text: &str, name: &str| text.contains(&format!("{name}("));
    let mut needed = vec![false; chunks.len()];
    let mut text = body.to_owned();
    loop {
        let mut grew = false;
        for (i, code) in chunks.iter().enumerate() {
            if !needed[i] && names[i].iter().any(|n| calls(&text, n)) {
                needed[i] = true;
                text.push_str(code);
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    let mut out = String::from("\n");
    for (i, code) in chunks.iter().enumerate() {
        if needed[i] {
            out.push_str(code);
        }
    }
    out
}
