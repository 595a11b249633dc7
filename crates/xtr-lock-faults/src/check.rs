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
//!
//! Two more kinds of lines come from the harness, not from sections: `clock`, appended every
//! [`CLOCK_TICK`] (the log's time scale), and `destroyed <section>` / `destroyed-all`, written
//! just before a fault destroys a lock under its holder (its database session terminated, its
//! server restarted empty). Such a holder learns it only at its next check, and without fencing
//! tokens nothing can refuse its command's writes until then: an overlap with a section that
//! entered after the mark is *excused* when the destroyed section ended within
//! [`Rules::destroyed_bound`] of it, and a violation when it ran on longer. `destroyed-all` marks
//! every section active at it, and those that enter within half a second after it (their lock
//! was granted before the fault, their command started after).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// How often the harness appends a `clock` line to the log.
pub const CLOCK_TICK: Duration = Duration::from_millis(100);

/// What the checker allows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    /// Model a fenced resource (see the module's documentation).
    pub fenced: bool,
    /// How long a holder whose lock a fault destroyed may still run its section.
    pub destroyed_bound: Duration,
}

/// What the checker found.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    /// Sections that entered.
    pub sections: usize,
    /// Lines refused by the fenced resource (a holder that resumed after losing its lock).
    pub fenced_off: usize,
    /// Overlaps with a holder whose lock a fault destroyed, within the bound.
    pub excused: usize,
    /// Every violation, one line each.
    pub violations: Vec<String>,
    /// The pids that ran sections (to check that none survives).
    pub pids: Vec<i32>,
}

struct Section {
    write: bool,
    token: Option<u64>,
    /// Index in the log of its first and last applied line, and the clock at each.
    first: usize,
    last: usize,
    first_clock: u32,
    last_clock: u32,
    /// The line and clock of the mark that destroyed its lock, if one did.
    destroyed: Option<(usize, u32)>,
}

/// Checks `log`, the whole file.
///
/// Without `fenced`, the lock alone must exclude: every line applies, a writer's token must
/// exceed every token entered before it, and a reader's must be at least the last writer's.
/// With `fenced` (faults that destroy a lock or pause its holder: only fencing can protect
/// those), the checker models a resource that refuses every line whose token is below the
/// newest it has seen, and only what it applies must not overlap.
pub fn check(log: &str, fenced: bool) -> Verdict {
    check_with(
        log,
        Rules {
            fenced,
            destroyed_bound: Duration::ZERO,
        },
    )
}

/// Checks `log` under `rules`.
pub fn check_with(log: &str, rules: Rules) -> Verdict {
    let mut scan = Scan::new(rules.fenced);
    for (at, line) in log.lines().enumerate() {
        scan.line(at, line);
    }
    let Scan {
        mut verdict,
        mut sections,
        order,
        marks,
        all_marks,
        ..
    } = scan;
    mark_destroyed(&mut sections, &marks, &all_marks);
    let bound = u32::try_from(rules.destroyed_bound.as_millis() / CLOCK_TICK.as_millis())
        .unwrap_or(u32::MAX);
    overlaps(&order, &sections, bound, &mut verdict);
    verdict
}

/// The log read line by line: its sections, its marks, and what is wrong already (tokens,
/// unreadable lines).
struct Scan<'a> {
    fenced: bool,
    verdict: Verdict,
    clock: u32,
    /// `destroyed <id>` marks, and `destroyed-all` marks (line, clock).
    marks: HashMap<&'a str, (usize, u32)>,
    all_marks: Vec<(usize, u32)>,
    sections: HashMap<&'a str, Section>,
    order: Vec<&'a str>,
    highest: Option<u64>,
    last_writer: Option<u64>,
    refused: HashSet<&'a str>,
}

impl<'a> Scan<'a> {
    fn new(fenced: bool) -> Scan<'a> {
        Scan {
            fenced,
            verdict: Verdict::default(),
            clock: 0,
            marks: HashMap::new(),
            all_marks: Vec::new(),
            sections: HashMap::new(),
            order: Vec::new(),
            highest: None,
            last_writer: None,
            refused: HashSet::new(),
        }
    }

    /// Reads line `at` of the log.
    fn line(&mut self, at: usize, line: &'a str) {
        let fields: Vec<&'a str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["enter", id, mode, token, pid] => self.enter(at, id, *mode == "w", token, pid),
            ["tick" | "exit", id] => self.step(at, id),
            ["clock"] => self.clock += 1,
            ["destroyed", id] => {
                self.marks.entry(id).or_insert((at, self.clock));
            }
            ["destroyed-all"] => self.all_marks.push((at, self.clock)),
            [] => {}
            _ => self
                .verdict
                .violations
                .push(format!("line {}: unreadable: {line:?}", at + 1)),
        }
    }

    /// `enter <id> <w|r> <token or -> <pid>` at line `at`.
    fn enter(&mut self, at: usize, id: &'a str, write: bool, token: &str, pid: &str) {
        let token = token.parse::<u64>().ok();
        if let Ok(pid) = pid.parse() {
            self.verdict.pids.push(pid);
        }
        if let Some(t) = token {
            if self.fenced && self.highest.is_some_and(|h| t < h) {
                self.verdict.fenced_off += 1;
                self.refused.insert(id);
                return;
            }
            self.check_token(id, write, t);
        }
        self.verdict.sections += 1;
        self.order.push(id);
        self.sections.insert(
            id,
            Section {
                write,
                token,
                first: at,
                last: at,
                first_clock: self.clock,
                last_clock: self.clock,
                destroyed: None,
            },
        );
    }

    /// A writer's token `t` must exceed every token entered before it; a reader's must be at
    /// least the last writer's.
    fn check_token(&mut self, id: &str, write: bool, t: u64) {
        if write && self.highest.is_some_and(|h| t <= h) {
            self.verdict.violations.push(format!(
                "section {id} (exclusive) entered with token {t}, not above {}",
                self.highest.unwrap_or_default()
            ));
        }
        if !write && self.last_writer.is_some_and(|w| t < w) {
            self.verdict.violations.push(format!(
                "section {id} (shared) entered with token {t}, below the last writer's {}",
                self.last_writer.unwrap_or_default()
            ));
        }
        self.highest = self.highest.max(Some(t));
        if write {
            self.last_writer = Some(t);
        }
    }

    /// `tick <id>` or `exit <id>` at line `at`: the section's last applied line, unless the
    /// fenced resource refuses it.
    fn step(&mut self, at: usize, id: &str) {
        let Some(s) = self.sections.get_mut(id) else {
            if self.refused.contains(id) {
                self.verdict.fenced_off += 1;
            }
            return;
        };
        if self.fenced
            && let (Some(t), Some(h)) = (s.token, self.highest)
            && t < h
        {
            self.verdict.fenced_off += 1;
            return;
        }
        s.last = at;
        s.last_clock = self.clock;
    }
}

/// Overlaps: sections in the order they entered, each compared with those that entered
/// before it and were still active; an overlap that includes a writer is a violation, unless
/// a destroyed lock excuses it within `bound` clock ticks.
fn overlaps(order: &[&str], sections: &HashMap<&str, Section>, bound: u32, verdict: &mut Verdict) {
    let mut active: Vec<&str> = Vec::new();
    for id in order {
        let s = &sections[id];
        active.retain(|other| sections[other].last > s.first);
        for other in &active {
            let o = &sections[other];
            if (s.write || o.write) && (excused(o, s, bound) || excused(s, o, bound)) {
                verdict.excused += 1;
            } else if s.write || o.write {
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
}

/// Sets each section's `destroyed` from the marks: its own (at its enter if it entered after
/// it), or a `destroyed-all` it was active at or entered at most half a second after.
fn mark_destroyed(
    sections: &mut HashMap<&str, Section>,
    marks: &HashMap<&str, (usize, u32)>,
    all_marks: &[(usize, u32)],
) {
    let soon = u32::try_from(500 / CLOCK_TICK.as_millis()).unwrap_or(5);
    for (id, s) in sections.iter_mut() {
        if let Some(&(line, clock)) = marks.get(id) {
            s.destroyed = Some(if line < s.first {
                (s.first, s.first_clock)
            } else {
                (line, clock)
            });
            continue;
        }
        s.destroyed = all_marks.iter().copied().find_map(|(line, clock)| {
            let active = s.first < line && s.last >= line;
            let late = s.first > line && s.first_clock <= clock + soon;
            if active {
                Some((line, clock))
            } else if late {
                Some((s.first, s.first_clock))
            } else {
                None
            }
        });
    }
}

/// Whether `gone`'s lock was destroyed before `other` entered and `gone` ended within `bound`
/// clock ticks of that.
fn excused(gone: &Section, other: &Section, bound: u32) -> bool {
    gone.destroyed
        .is_some_and(|(line, clock)| line <= other.first && gone.last_clock <= clock + bound)
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
    fn a_destroyed_lock_excuses_a_bounded_overlap() {
        let rules = Rules {
            fenced: false,
            destroyed_bound: Duration::from_millis(300),
        };
        // a's lock destroyed; b enters; a stops within two ticks: excused.
        let log =
            "enter a w - 1\ndestroyed a\nenter b w - 2\nclock\ntick a\nclock\nexit a\nexit b\n";
        let v = check_with(log, rules);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.excused, 1);
        // a runs on for five ticks: a violation.
        let log = "enter a w - 1\ndestroyed-all\nenter b w - 2\nclock\nclock\nclock\nclock\nclock\ntick a\nexit b\n";
        assert_eq!(check_with(log, rules).violations.len(), 1);
        // An overlap that began before the mark is not excused.
        let log = "enter a w - 1\nenter b w - 2\ndestroyed a\nexit a\nexit b\n";
        assert_eq!(check_with(log, rules).violations.len(), 1);
        // A section entering just after a destroyed-all was granted before it.
        let log = "destroyed-all\nenter b w - 2\nenter a w - 1\nexit b\nexit a\n";
        let v = check_with(log, rules);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
    }

    #[test]
    fn garbage_is_reported() {
        assert_eq!(check("enter a\n", false).violations.len(), 1);
    }
}
