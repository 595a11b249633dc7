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
//! last thing it did). Then:
//!
//! - no two sections whose lines interleave may include a writer (no exclusive section
//!   overlapped another, no reader overlapped a writer);
//! - a writer's token exceeds every token entered before it; a reader's is at least the last
//!   writer's.
//!
//! For faults that only fencing can survive (a whole holder paused past its lease, a server
//! restarted empty), the checker models a **fenced resource** instead, as a storage service that
//! checks tokens would be: a line whose token is below the newest that has entered is refused
//! (fenced off), not applied, and only applied lines must not overlap.

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

/// Checks `log`, the whole file.
///
/// Without `fenced`, the lock alone must exclude: every line applies, a writer's token must
/// exceed every token entered before it, and a reader's must be at least the last writer's.
/// With `fenced` (faults that destroy a lock or pause its holder: only fencing can protect
/// those), the checker models a resource that refuses every line whose token is below the
/// newest it has seen, and only what it applies must not overlap.
pub fn check(log: &str, fenced: bool) -> Verdict {
    let mut verdict = Verdict::default();
    let mut sections: HashMap<&str, Section> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut highest: Option<u64> = None;
    let mut last_writer: Option<u64> = None;
    let mut refused: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (at, line) in log.lines().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["enter", id, mode, token, pid] => {
                let token = token.parse::<u64>().ok();
                let write = *mode == "w";
                if let Ok(pid) = pid.parse() {
                    verdict.pids.push(pid);
                }
                if let Some(t) = token {
                    if fenced && highest.is_some_and(|h| t < h) {
                        verdict.fenced_off += 1;
                        refused.insert(id);
                        continue;
                    }
                    if write && highest.is_some_and(|h| t <= h) {
                        verdict.violations.push(format!(
                            "section {id} (exclusive) entered with token {t}, not above {}",
                            highest.unwrap_or_default()
                        ));
                    }
                    if !write && last_writer.is_some_and(|w| t < w) {
                        verdict.violations.push(format!(
                            "section {id} (shared) entered with token {t}, below the last writer's {}",
                            last_writer.unwrap_or_default()
                        ));
                    }
                    highest = highest.max(Some(t));
                    if write {
                        last_writer = Some(t);
                    }
                }
                verdict.sections += 1;
                order.push(id);
                sections.insert(
                    id,
                    Section {
                        write,
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
                if fenced
                    && let (Some(t), Some(h)) = (s.token, highest)
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
        let v = check("enter a w 1 1\nenter b w 2 2\ntick a\nexit b\n", true);
        assert!(
            v.violations.is_empty(),
            "a's tick is fenced off: {:?}",
            v.violations
        );
        assert_eq!(v.fenced_off, 1);
        let v = check("enter a w 1 1\nenter b w 2 2\ntick a\nexit b\n", false);
        assert_eq!(
            v.violations.len(),
            1,
            "unfenced, it overlaps: {:?}",
            v.violations
        );
        // A reader's token fences a stale writer too.
        let v = check("enter a w 1 1\nenter b r 1 2\ntick a\n", true);
        assert_eq!(
            v.violations.len(),
            1,
            "same token: a is not fenced: {:?}",
            v.violations
        );
        let v = check("enter a w 1 1\nenter b r 5 2\ntick a\n", true);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
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
        let v = check("enter a w 5 1\nexit a\nenter b r 4 2\nexit b\n", false);
        assert_eq!(
            v.violations.len(),
            1,
            "a reader below the writer: {:?}",
            v.violations
        );
        let v = check(
            "enter a r 5 1\nenter b r 5 2\nexit a\nexit b\nenter c w 6 3\n",
            false,
        );
        assert!(v.violations.is_empty(), "readers share: {:?}", v.violations);
    }

    #[test]
    fn garbage_is_reported() {
        assert_eq!(check("enter a\n", false).violations.len(), 1);
    }
}
