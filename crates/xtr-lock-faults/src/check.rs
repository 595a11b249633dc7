//! The checker: reads the sections' shared log and proves what the locks promised.
//!
//! Each critical section appends lines to one file opened with `O_APPEND`, so the file's order
//! is a total order of every section's steps, consistent with real time:
//!
//! ```text
//! enter <section> <w|r> <fencing token or -> <pid>
//! tick <section>
//! exit <section>
//! ```
//!
//! A section is active from its `enter` to its last line (a killed section's last line is the
//! last thing it did). The checker models a **fenced resource**, as a storage service that
//! checks fencing tokens would be: a line of a section whose token is below the highest token
//! that has entered before it is refused (fenced off), not applied. Then:
//!
//! - no two sections whose applied lines interleave may include a writer (no exclusive section
//!   overlapped another, no reader overlapped a writer);
//! - tokens of exclusive sections strictly increase in the order they entered.

use std::collections::HashMap;

/// What the checker found.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    /// Sections that entered.
    pub sections: usize,
    /// Lines refused by the fenced resource (a holder that resumed after losing its lock).
    pub fenced_off: usize,
    /// Every violation, one line each.
    pub violations: Vec<String>,
    /// The pids that ran sections (to check that none survives).
    pub pids: Vec<i32>,
}

struct Section {
    write: bool,
    token: Option<u64>,
    /// Index in the log of its first and last applied line.
    first: usize,
    last: usize,
}

/// Checks `log`, the whole file. A section that enters with a token older than one already
/// entered is a violation (tokens went back), unless `stale_entries` allows it: a holder paused
/// between its acquisition and its first line enters late, and the fenced resource refuses it.
pub fn check(log: &str, stale_entries: bool) -> Verdict {
    let mut verdict = Verdict::default();
    let mut sections: HashMap<&str, Section> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut highest: Option<u64> = None;
    let mut refused: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (at, line) in log.lines().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["enter", id, mode, token, pid] => {
                let token = token.parse::<u64>().ok();
                if let Ok(pid) = pid.parse() {
                    verdict.pids.push(pid);
                }
                if let (Some(t), Some(h)) = (token, highest)
                    && t < h
                {
                    // Entered with a token older than one already seen: never applied.
                    verdict.fenced_off += 1;
                    refused.insert(id);
                    if !stale_entries {
                        verdict.violations.push(format!(
                            "section {id} entered with token {t} after token {h}"
                        ));
                    }
                    continue;
                }
                if *mode == "w" && token.is_some() && token == highest {
                    verdict
                        .violations
                        .push(format!("section {id} entered with token {token:?} again"));
                }
                highest = highest.max(token);
                verdict.sections += 1;
                order.push(id);
                sections.insert(
                    id,
                    Section {
                        write: *mode == "w",
                        token,
                        first: at,
                        last: at,
                    },
                );
            }
            ["tick" | "exit", id] => {
                let Some(s) = sections.get_mut(id) else {
                    if refused.contains(id) {
                        verdict.fenced_off += 1;
                    }
                    continue;
                };
                if let (Some(t), Some(h)) = (s.token, highest)
                    && t < h
                {
                    verdict.fenced_off += 1;
                    continue;
                }
                s.last = at;
            }
            [] => {}
            _ => verdict
                .violations
                .push(format!("line {}: unreadable: {line:?}", at + 1)),
        }
    }
    // Overlaps: sections sorted by their first line; each is compared with those that entered
    // before it and were still active.
    let mut active: Vec<&str> = Vec::new();
    for id in &order {
        let s = &sections[id];
        active.retain(|other| sections[other].last > s.first);
        for other in &active {
            let o = &sections[other];
            if s.write || o.write {
                verdict.violations.push(format!(
                    "section {id} ({}) entered at line {} while {other} ({}) was active until line {}",
                    mode(s.write),
                    s.first + 1,
                    mode(o.write),
                    o.last + 1
                ));
            }
        }
        active.push(id);
    }
    verdict
}

fn mode(write: bool) -> &'static str {
    if write { "exclusive" } else { "shared" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_sections_and_overlapping_readers_pass() {
        let log = "enter a w 1 10\ntick a\nexit a\nenter b r - 11\nenter c r - 12\nexit b\nexit c\nenter d w 2 13\nexit d\n";
        let v = check(log, false);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.sections, 4);
        assert_eq!(v.pids, [10, 11, 12, 13]);
    }

    #[test]
    fn an_overlap_with_a_writer_is_a_violation() {
        let v = check("enter a w 1 1\nenter b w 2 2\ntick a\nexit b\n", false);
        assert_eq!(
            v.violations.len(),
            0,
            "a's tick is fenced off: {:?}",
            v.violations
        );
        assert_eq!(v.fenced_off, 1);
        let v = check("enter a w - 1\nenter b r - 2\nexit a\nexit b\n", false);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        let v = check("enter a r - 1\nenter b w - 2\nexit a\n", false);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
    }

    #[test]
    fn a_killed_section_ends_at_its_last_line() {
        let v = check("enter a w - 1\ntick a\nenter b w - 2\nexit b\n", false);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
    }

    #[test]
    fn tokens_must_increase() {
        let v = check("enter a w 5 1\nexit a\nenter b w 5 2\nexit b\n", false);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        let v = check("enter a w 5 1\nexit a\nenter b w 3 2\nexit b\n", true);
        assert_eq!(v.fenced_off, 2, "an older token never applies");
        assert!(v.violations.is_empty());
        let v = check("enter a w 5 1\nexit a\nenter b w 3 2\nexit b\n", false);
        assert_eq!(
            v.violations.len(),
            1,
            "tokens went back: {:?}",
            v.violations
        );
    }

    #[test]
    fn garbage_is_reported() {
        assert_eq!(check("enter a\n", false).violations.len(), 1);
    }
}
