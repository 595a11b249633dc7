//! House rules that a compiler does not check: every public async method of the library, and
//! every async method of a public trait, documents `# Cancel safety` (the `Store` trait's
//! methods once, on the trait: one rule covers them all).

use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The doc comment lines just above line `i` (attributes skipped).
fn doc_above(lines: &[&str], i: usize) -> String {
    let mut doc = Vec::new();
    for line in lines[..i].iter().rev() {
        let t = line.trim_start();
        if t.starts_with("///") {
            doc.push(t);
        } else if t.starts_with("#[") || t.is_empty() && doc.is_empty() {
            continue;
        } else {
            break;
        }
    }
    doc.join("\n")
}

#[test]
fn every_public_async_method_documents_cancel_safety() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in files {
        let rel = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        // Scenarios are documented once, at the module level (they are not cancel-safe).
        let scenario_file = rel.starts_with("conformance/") && rel != "conformance/mod.rs";
        let text = fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut in_pub_trait = false;
        for (i, line) in lines.iter().enumerate() {
            if line.starts_with("#[cfg(test)]") {
                break; // unit tests follow
            }
            if line.starts_with("pub trait Store:") {
                // One rule for every method, on the trait itself.
                checked += 1;
                if !doc_above(&lines, i).contains("# Cancel safety") {
                    missing.push(format!("src/{rel}:{}: {}", i + 1, line));
                }
            } else if line.starts_with("pub trait ") {
                in_pub_trait = true;
            } else if line.starts_with('}') {
                in_pub_trait = false;
            }
            let t = line.trim_start();
            let public = t.starts_with("pub async fn ");
            let trait_method = in_pub_trait && t.starts_with("async fn ");
            if !(public || trait_method) || scenario_file {
                continue;
            }
            checked += 1;
            if !doc_above(&lines, i).contains("# Cancel safety") {
                missing.push(format!("src/{rel}:{}: {}", i + 1, t));
            }
        }
    }
    assert!(
        checked > 20,
        "the scan found only {checked} methods: is it still looking?"
    );
    assert!(
        missing.is_empty(),
        "no `# Cancel safety` section:\n{}",
        missing.join("\n")
    );
}

// ---- the module graph has no circles ------------------------------------------------------------

/// The module path of a source file under `src/`: `store/flock/mod.rs` is `store::flock`.
fn module_of(rel: &str) -> String {
    let rel = rel.trim_end_matches(".rs");
    let mut parts: Vec<&str> = rel.split('/').collect();
    if matches!(parts.last(), Some(&"mod") | Some(&"lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// The lines of `text` that are code: no comments, no unit tests. A `use` list written over
/// several lines (`use super::{\n a,\n b::c,\n};`) is one line here.
fn code_lines(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = 0usize;
    for line in text.lines() {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let depth = |s: &str| s.matches('{').count() as isize - s.matches('}').count() as isize;
        if open > 0 {
            let joined = out.last_mut().unwrap();
            joined.push(' ');
            joined.push_str(t);
            open = usize::try_from(open as isize + depth(t)).unwrap_or(0);
        } else {
            out.push(line.to_owned());
            let unclosed = depth(line);
            if unclosed > 0
                && (t.starts_with("use ")
                    || t.starts_with("pub use ")
                    || t.starts_with("pub(crate) use ")
                    || t.starts_with("pub(super) use "))
            {
                open = unclosed as usize;
            }
        }
    }
    out
}

/// The paths a use tree names below `prefix`: `a::{b, c::{d, e as f}, self}` gives `a::b`,
/// `a::c::d`, `a::c::e` and `a`.
fn use_paths(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let item = tree.split(" as ").next().unwrap_or("").trim();
        let mut path = prefix.to_vec();
        if item != "self" {
            path.extend(
                item.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
        }
        out.push(path);
        return;
    };
    let mut path = prefix.to_vec();
    path.extend(
        tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    );
    let (mut depth, mut start) = (0usize, open + 1);
    for (i, c) in tree.char_indices().skip(open) {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                let item = tree[start..i].trim();
                if !item.is_empty() {
                    use_paths(&path, item, out);
                }
                start = i + 1;
                if c == '}' {
                    return;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
}

/// The modules a file refers to: `crate::a::b` and `super::c` paths, resolved to the longest
/// prefix that is a module, and the crate root's re-exports followed.
fn references(
    module: &str,
    text: &str,
    modules: &std::collections::BTreeSet<String>,
    reexports: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let resolve = |path: Vec<String>, out: &mut std::collections::BTreeSet<String>| {
        let mut path = path;
        if let Some(first) = path.first()
            && let Some(target) = reexports.get(first)
        {
            let mut full: Vec<String> = target.split("::").map(str::to_owned).collect();
            full.extend(path.drain(1..));
            path = full;
        }
        for n in (1..=path.len()).rev() {
            let candidate = path[..n].join("::");
            if modules.contains(&candidate) {
                if candidate != module && !module.starts_with(&format!("{candidate}::")) {
                    out.insert(candidate);
                }
                return;
            }
        }
    };
    let parent: Vec<String> = {
        let mut p: Vec<String> = module.split("::").map(str::to_owned).collect();
        p.pop();
        p
    };
    for line in code_lines(text) {
        let line = line.as_str();
        for (base, rest) in [("crate::", None), ("super::", Some(parent.clone()))] {
            let mut at = 0;
            while let Some(i) = line[at..].find(base) {
                let start = at + i + base.len();
                // Skip identifiers that merely end in the base (`foo_crate::`).
                let before = line[..at + i].chars().last();
                at = start;
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let tail = &line[start..];
                let path_end = tail
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(tail.len());
                // The path, and a `{…}` list right after it with every item in it.
                let tree_end = if tail[path_end..].starts_with('{') {
                    let mut depth = 0usize;
                    tail[path_end..]
                        .char_indices()
                        .find_map(|(k, c)| {
                            match c {
                                '{' => depth += 1,
                                '}' => depth -= 1,
                                _ => {}
                            }
                            (depth == 0).then_some(path_end + k + 1)
                        })
                        .unwrap_or(tail.len())
                } else {
                    path_end
                };
                let mut paths = Vec::new();
                use_paths(
                    &rest.clone().unwrap_or_default(),
                    &tail[..tree_end],
                    &mut paths,
                );
                for path in paths {
                    resolve(path, &mut out);
                }
            }
        }
    }
    out
}

/// Strongly connected groups of more than one node.
fn circles(
    edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    // Kosaraju: finish order on the graph, then components on the reversed graph.
    fn visit(
        n: &str,
        edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        seen: &mut std::collections::BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(n.to_owned()) {
            return;
        }
        for m in edges.get(n).into_iter().flatten() {
            visit(m, edges, seen, order);
        }
        order.push(n.to_owned());
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut order = Vec::new();
    for n in edges.keys() {
        visit(n, edges, &mut seen, &mut order);
    }
    let mut reversed: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            reversed.entry(b.clone()).or_default().insert(a.clone());
        }
    }
    let mut assigned = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for n in order.iter().rev() {
        let mut component = Vec::new();
        visit(n, &reversed, &mut assigned, &mut component);
        if component.len() > 1 {
            component.sort();
            out.push(component);
        }
    }
    out
}

#[test]
fn the_module_graph_has_no_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let texts: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let rel = f
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (module_of(&rel), fs::read_to_string(f).unwrap())
        })
        .collect();
    let modules: std::collections::BTreeSet<String> =
        texts.iter().map(|(m, _)| m.clone()).collect();
    // The crate root's `pub use a::b::{X, Y};` and `pub use a::X;`: X is found in a::b.
    let mut reexports = std::collections::BTreeMap::new();
    let lib = &texts.iter().find(|(m, _)| m.is_empty()).unwrap().1;
    for line in code_lines(lib) {
        let Some(rest) = line.strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.trim_end_matches(';');
        if let Some((path, items)) = rest.split_once("::{") {
            for item in items.trim_end_matches('}').split(',') {
                let name = item.trim().split(" as ").next().unwrap().trim().to_owned();
                reexports.insert(name, path.to_owned());
            }
        } else if let Some((path, name)) = rest.rsplit_once("::") {
            reexports.insert(name.to_owned(), path.to_owned());
        }
    }
    let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for (module, text) in &texts {
        let refs = references(module, text, &modules, &reexports);
        edges.entry(module.clone()).or_default().extend(refs);
    }
    let mut found = circles(&edges)
        .into_iter()
        .map(|c| format!("modules: {}", c.join(" <-> ")))
        .collect::<Vec<_>>();
    // A module and everything below it as one unit, at the top level and one level down: a
    // circle through children (`store::redis::config` -> `dsn` -> `store::redis`) is a circle too.
    for depth in [1, 2] {
        let unit = |m: &str| m.split("::").take(depth).collect::<Vec<_>>().join("::");
        let mut units: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            std::collections::BTreeMap::new();
        for (a, bs) in &edges {
            for b in bs {
                let (ua, ub) = (unit(a), unit(b));
                let nested =
                    ua.starts_with(&format!("{ub}::")) || ub.starts_with(&format!("{ua}::"));
                if ua != ub && !nested && !ua.is_empty() && !ub.is_empty() {
                    units.entry(ua).or_default().insert(ub.clone());
                    units.entry(ub).or_default();
                }
            }
        }
        found.extend(
            circles(&units)
                .into_iter()
                .map(|c| format!("subtrees at depth {depth}: {}", c.join(" <-> "))),
        );
    }
    assert!(
        edges.values().map(|e| e.len()).sum::<usize>() > 30,
        "the scan found almost no imports: is it still looking?"
    );
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

// ---- files stay small, and stand on their own ---------------------------------------------------

/// Every Rust source file of the workspace.
fn workspace_sources() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for entry in fs::read_dir(crates).unwrap() {
        let dir = entry.unwrap().path();
        for sub in ["src", "tests", "examples"] {
            if dir.join(sub).is_dir() {
                sources(&dir.join(sub), &mut files);
            }
        }
    }
    files
}

/// `unsafe` is denied workspace-wide and allowed in two modules: the SysV semaphore calls, and
/// the CLI's `fork` without `exec` (its helpers, forked while it has one thread); every block
/// carries a `// SAFETY:` comment.
#[test]
fn unsafe_code_is_allowed_in_the_semaphore_calls_and_the_fork_only_and_every_block_says_why() {
    let allowed = [
        Path::new("store").join("semaphore").join("sys.rs"),
        Path::new("xtr-lock-cli").join("src").join("fork.rs"),
    ];
    // Spelled in two parts, so this file does not match itself.
    let needle = concat!("allow(", "unsafe_code)");
    let mut allowing = Vec::new();
    let mut blocks = 0;
    for file in workspace_sources() {
        let text = fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let is_sys = allowed.iter().any(|a| file.ends_with(a));
        if lines
            .iter()
            .any(|l| l.contains(needle) && !l.trim_start().starts_with("//"))
            && !is_sys
        {
            allowing.push(file.display().to_string());
        }
        if !is_sys {
            continue;
        }
        for (i, line) in lines.iter().enumerate() {
            if line.contains("unsafe {") {
                blocks += 1;
                let said = lines[..i]
                    .iter()
                    .rev()
                    .take_while(|l| l.trim_start().starts_with("//"))
                    .any(|l| l.contains("SAFETY:"));
                assert!(
                    said,
                    "{}:{}: an unsafe block without a SAFETY comment",
                    file.display(),
                    i + 1
                );
            }
        }
    }
    assert!(
        allowing.is_empty(),
        "unsafe allowed outside the semaphore calls and the fork: {allowing:?}"
    );
    assert!(
        blocks >= 6,
        "the scan found no unsafe blocks in the semaphore calls or the fork: is it looking?"
    );
}

#[test]
fn no_source_file_is_far_over_600_lines() {
    let long: Vec<String> = workspace_sources()
        .into_iter()
        .filter_map(|f| {
            let n = fs::read_to_string(&f).unwrap().lines().count();
            (n > 660).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these files:\n{}", long.join("\n"));
}

#[test]
fn no_comment_cites_the_id_of_a_document_the_reader_lacks() {
    // The behaviour contract's item ids (a prefix such as `DEF` or `CAN`, a hyphen, a number)
    // and its section signs mean nothing to a reader of this repository: say what is meant.
    let prefixes = [
        "DEF", "CAN", "KEY", "REF", "HOLD", "ACQ", "SCOPE", "REL", "COMB", "STRAT", "MEM", "NULL",
        "NOLOCK", "READ", "RW", "EXP", "WAIT", "LIFE", "FAC", "ISA",
    ];
    let mut found = Vec::new();
    for f in workspace_sources() {
        let text = fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let cites_id = prefixes.iter().any(|p| {
                line.match_indices(&format!("{p}-")).any(|(at, m)| {
                    let boundary = line[..at]
                        .chars()
                        .last()
                        .is_none_or(|c| !c.is_alphanumeric() && c != '_');
                    boundary
                        && line[at + m.len()..]
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_ascii_digit())
                })
            });
            if cites_id || line.contains('\u{a7}') {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
