//! Scheduled-job scenarios any store runs: the minimum hold (left to the store's clock, or
//! held by `xtr-lock` until it ends), staggered cron starts that run the job once, the maximum
//! hold, and `queue-one`. Marker files prove what ran and that nothing overlapped.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use super::{command_pid, run_holding, spawn, wait_exit, wait_gone, xtr};

/// `run -n` of `true` on `resource`: its exit code.
pub(crate) fn try_run(store: &str, resource: &str) -> Option<i32> {
    xtr()
        .args(["run", "-n", "--store", store, resource, "--", "true"])
        .output()
        .unwrap()
        .status
        .code()
}

/// Tries `run -n` until it takes `resource` (up to `limit` from `since`); when it did.
fn free_at(store: &str, resource: &str, since: Instant, limit: Duration) -> Duration {
    loop {
        if try_run(store, resource) == Some(0) {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "{resource} stayed held past {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// On a store whose locks expire: `run --min-hold 5s` of a quick command returns at once (the
/// store lets the lock run out), with the command's status; `run -n` is refused until the
/// minimum hold ends, and takes the lock after.
pub(crate) fn min_hold_left_to_the_store(store: &str, resource: &str) {
    let hold = Duration::from_secs(5);
    let started = Instant::now();
    let out = xtr()
        .args(["run", "--store", store, "--min-hold", "5s", resource])
        .args(["--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    let returned = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "the command's status: {err}");
    assert!(
        returned < Duration::from_secs(4),
        "run waited {returned:?}: it should leave the minimum hold to the store"
    );
    assert_eq!(
        try_run(store, resource),
        Some(1),
        "taken within the min hold"
    );
    assert!(started.elapsed() < hold, "the check came too late to count");
    let free = free_at(store, resource, started, hold + Duration::from_secs(10));
    assert!(
        free + Duration::from_millis(100) >= hold,
        "free after {free:?}, before the minimum hold of {hold:?} ended"
    );
}

/// On a store whose locks end with their holder: `run --min-hold 3s` stays and holds the lock
/// after its command ended, refusing `run -n` meanwhile, then exits with the command's status.
pub(crate) fn min_hold_held_by_xtr_lock(store: &str, resource: &str, tmp: &Path) {
    let marker = tmp.join(format!("{resource}.done"));
    let script = format!("touch {}; exit 5", marker.display());
    let started = Instant::now();
    let mut run = spawn(&[
        "run",
        "--store",
        store,
        "--min-hold",
        "3s",
        "-v",
        resource,
        "--",
        "sh",
        "-c",
        &script,
    ]);
    wait_for_file(&marker);
    assert_eq!(
        try_run(store, resource),
        Some(1),
        "taken within the min hold"
    );
    let status = wait_exit(&mut run, "run did not exit after its minimum hold");
    assert_eq!(status.code(), Some(5), "the command's status");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "run exited after {:?}, before its minimum hold ended",
        started.elapsed()
    );
    let err = stderr_of(&mut run);
    assert!(
        err.contains("stays held until its minimum hold ends"),
        "{err}"
    );
    assert_eq!(
        try_run(store, resource),
        Some(0),
        "still held after run exited"
    );
}

/// Three `run -n -E 0 --min-hold 3s` of a 0.2 s job, started 0.5 s apart, as cron on three
/// machines whose clocks differ: the job runs once, and all three exit 0.
pub(crate) fn staggered_starts_run_once(store: &str, resource: &str, tmp: &Path) {
    let log = tmp.join(format!("{resource}.runs"));
    let script = format!("echo ran >> {}; sleep 0.2", log.display());
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(spawn(&[
            "run",
            "-n",
            "-E",
            "0",
            "--min-hold",
            "3s",
            "--store",
            store,
            resource,
            "--",
            "sh",
            "-c",
            &script,
        ]));
        std::thread::sleep(Duration::from_millis(500));
    }
    for mut run in runs {
        let status = wait_exit(&mut run, "a staggered run did not exit");
        assert_eq!(status.code(), Some(0), "{}", stderr_of(&mut run));
    }
    let ran = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "the job ran {ran:?}");
}

/// `run --max-hold …` (in `flags`) of `sleep 60`: the command is stopped, `run` exits 4 with a
/// `max-hold` event, and the lock is free after.
pub(crate) fn max_hold_stops_the_command(store: &str, resource: &str, tmp: &Path, flags: &[&str]) {
    let mut args = vec!["run", "--store", store, "--json"];
    args.extend(flags);
    args.push(resource);
    let (mut run, pid) = run_holding(&args, &tmp.join(format!("{resource}.pid")));
    let status = wait_exit(&mut run, "run did not stop at its maximum hold");
    let err = stderr_of(&mut run);
    assert_eq!(status.code(), Some(4), "{err}");
    wait_gone(pid, "the command past its maximum hold");
    assert!(err.contains(r#""xtr_lock":"max-hold""#), "{err}");
    assert!(err.contains(r#""held_ms":"#), "{err}");
    assert_eq!(try_run(store, resource), Some(0), "the lock was left held");
}

/// Five `run --on-conflict queue-one` started while a run holds the lock: exactly one of them
/// queues and runs after it, the others are refused (exit 1, saying a run already waits); the
/// job never overlaps (a marker file says when it is inside). At most two runs in a row.
pub(crate) fn queue_one_runs_at_most_twice(store: &str, resource: &str, tmp: &Path) {
    let inside = tmp.join(format!("{resource}.inside"));
    let log = tmp.join(format!("{resource}.log"));
    let job = |secs: u32| {
        format!(
            "if [ -e {i} ]; then echo overlap >> {l}; fi; touch {i}; echo run >> {l}; \
             sleep {secs}; rm -f {i}",
            i = inside.display(),
            l = log.display()
        )
    };
    let first = job(2);
    let mut holder = spawn(&["run", "--store", store, resource, "--", "sh", "-c", &first]);
    wait_for_file(&inside);
    let queued = job(1);
    let runs: Vec<Child> = (0..5)
        .map(|_| {
            spawn(&[
                "run",
                "--store",
                store,
                "--on-conflict",
                "queue-one",
                resource,
                "--",
                "sh",
                "-c",
                &queued,
            ])
        })
        .collect();
    let mut codes = Vec::new();
    for mut run in runs {
        let status = wait_exit(&mut run, "a queue-one run did not exit");
        let err = stderr_of(&mut run);
        if status.code() == Some(1) {
            assert!(err.contains("another run already waits"), "{err}");
        }
        codes.push(status.code());
    }
    let held = wait_exit(&mut holder, "the first run did not exit");
    assert_eq!(held.code(), Some(0));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("overlap"), "{text}");
    assert_eq!(
        text.lines().count(),
        2,
        "the first run and one queued: {codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| **c == Some(0)).count(),
        1,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| **c == Some(1)).count(),
        4,
        "{codes:?}"
    );
}

/// Waits (10 s at most) for `path` to exist.
pub(crate) fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The whole of a finished child's stderr.
pub(crate) fn stderr_of(child: &mut Child) -> String {
    use std::io::Read as _;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

/// A run on `store` whose command writes its pid to `pidfile`, marks `inside` while it runs
/// and removes it when stopped (SIGTERM), with `extra` flags: the run and the command's pid.
pub(crate) fn run_inside(
    store: &str,
    resource: &str,
    extra: &[&str],
    inside: &Path,
    pidfile: &Path,
) -> (Child, i32) {
    let script = format!(
        "echo $$ > {p}; touch {i}; trap 'rm -f {i}; exit 143' TERM; sleep 60 & wait",
        p = pidfile.display(),
        i = inside.display()
    );
    let mut args = vec!["run", "--store", store];
    args.extend(extra);
    args.extend([resource, "--", "sh", "-c", &script]);
    let run = spawn(&args);
    (run, command_pid(pidfile))
}
