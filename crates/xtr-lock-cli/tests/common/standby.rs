//! `run --standby` scenarios any store runs: turns that never overlap, and how long a standby
//! takes to lead after the leader's xtr-lock is SIGKILLed.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use super::{bin, kill, wait_exit};

/// A standby `xtr-lock run --standby` on `store` with `$XTR_LOCK_ID` = `id`, in a process group
/// of its own (so that the test can kill it as a crashed service is killed), its stderr piped.
pub(crate) fn start(store: &str, resource: &str, id: &str, extra: &[&str], script: &str) -> Child {
    let mut cmd = Command::new(bin());
    cmd.args(["run", "--standby", "--store", store, "--kill-after", "1s"])
        .args(extra)
        .args([resource, "--", "sh", "-c", script])
        .env("XTR_LOCK_ID", id)
        .env_remove("XTR_LOCK_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    cmd.spawn().unwrap()
}

/// Stops a standby (SIGTERM: it stops its command, releases and exits); its stderr.
pub(crate) fn stop(mut child: Child) -> String {
    kill(child.id() as i32, Signal::TERM);
    let status = wait_exit(&mut child, "a standby did not stop on SIGTERM");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut err);
    }
    assert!(
        status.code().is_some() || status.success(),
        "{status:?}: {err}"
    );
    err
}

/// Three standbys on one resource, each command creating a marker file exclusively (O_EXCL, by
/// `set -C`), recording its turn and removing the marker after a short while: `changes`
/// changes of leader at least, never two markers at once; with `fences`, each turn's fencing
/// token (its term) larger than the one before.
pub(crate) fn turns_never_overlap(store: &str, extra: &[&str], changes: usize, fences: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().display();
    // A command stopped by the test's SIGTERM removes its marker (the trap); turns after the
    // test began stopping are not counted (a standby not yet told may take one).
    let script = format!(
        "[ -e {dir}/stopping ] && exit 0; trap 'rm -f {dir}/marker; exit 143' TERM INT; \
         ( set -C; : > {dir}/marker ) 2>/dev/null || echo \"$XTR_LOCK_ID\" >> {dir}/overlaps; \
         echo \"$XTR_LOCK_ID ${{XTR_LOCK_FENCING_TOKEN:-}}\" >> {dir}/turns; sleep 0.05; \
         rm -f {dir}/marker"
    );
    let resource = format!("standby-turns-{}", std::process::id());
    let standbys: Vec<Child> = ["a", "b", "c"]
        .iter()
        .map(|id| start(store, &resource, id, extra, &script))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let started = Instant::now();
    while leader_changes(&lines(&tmp.path().join("turns"))) < changes {
        assert!(
            Instant::now() < deadline,
            "fewer than {changes} changes of leader in 120s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    std::fs::write(tmp.path().join("stopping"), "").unwrap();
    for s in &standbys {
        kill(s.id() as i32, Signal::TERM);
    }
    for s in standbys {
        stop(s);
    }
    let overlaps = lines(&tmp.path().join("overlaps"));
    assert!(overlaps.is_empty(), "two markers at once: {overlaps:?}");
    let seen = lines(&tmp.path().join("turns"));
    let leaders: std::collections::BTreeSet<&str> =
        seen.iter().filter_map(|l| l.split(' ').next()).collect();
    let changes = leader_changes(&seen);
    println!(
        "{store}: {} turns in {took:?}, {changes} changes of leader among {leaders:?}",
        seen.len()
    );
    if fences {
        let terms: Vec<u64> = seen
            .iter()
            .map(|l| l.split(' ').nth(1).unwrap_or("").parse().expect("a term"))
            .collect();
        assert!(
            terms.windows(2).all(|w| w[0] < w[1]),
            "terms not strictly increasing: {terms:?}"
        );
    }
}

/// A fail-over where the lock dies with its holder: milliseconds, given seconds on a loaded
/// machine.
pub(crate) const AT_ONCE: Duration = Duration::from_secs(5);

/// A fail-over where the lock expires: the ttl (`secs`) and the loaded machine's seconds.
pub(crate) fn after_ttl(secs: u64) -> Duration {
    Duration::from_secs(secs + 4)
}

/// How many times the leader changed along `turns` (`<id> <term>` lines).
fn leader_changes(turns: &[String]) -> usize {
    turns
        .windows(2)
        .filter(|w| w[0].split(' ').next() != w[1].split(' ').next())
        .count()
}

/// Two standbys; the leader's xtr-lock (its process group) SIGKILLed once the other waits: how
/// long until the other's command runs, at most `promise` (the store's: at once, or about its
/// ttl), the new leader's term larger where the store fences. Printed, for the fail-over times.
pub(crate) fn failover(store: &str, extra: &[&str], promise: Duration) -> Duration {
    let tmp = tempfile::tempdir().unwrap();
    let leader = tmp.path().join("leader");
    let script = format!(
        "echo \"$XTR_LOCK_ID ${{XTR_LOCK_FENCING_TOKEN:-}}\" > {0}.tmp && mv {0}.tmp {0}; \
         exec sleep 60",
        leader.display()
    );
    let resource = format!("standby-failover-{}", std::process::id());
    let a = start(store, &resource, "a", extra, &script);
    let first_term = wait_for(&leader, "a");
    let mut json = extra.to_vec();
    json.push("--json");
    let mut b = start(store, &resource, "b", &json, &script);
    let (first, rest) = super::stderr_after_first_line(&mut b);
    assert!(first.contains("\"waiting\""), "b does not wait: {first}");
    let killed = Instant::now();
    let group = -(a.id() as i32);
    let _ = rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(-group).unwrap(),
        Signal::KILL,
    );
    let second_term = wait_for(&leader, "b");
    let took = killed.elapsed();
    println!("fail-over on {store} {extra:?}: {} ms", took.as_millis());
    assert!(
        took <= promise,
        "b led {took:?} after a was killed, later than {promise:?}"
    );
    if let (Some(first), Some(second)) = (first_term, second_term) {
        assert!(second > first, "the new leader's term {second} <= {first}");
    }
    let mut a = a;
    let _ = a.wait();
    kill(b.id() as i32, Signal::TERM);
    let status = wait_exit(&mut b, "b did not stop on SIGTERM");
    let err = rest.join().unwrap();
    assert!(err.contains("\"leading\""), "{status:?} {err}");
    took
}

/// Two turns of a command that leaves a `sleep` running in the background: each turn's
/// leftover is stopped before the next turn (on flock it would hold the lock's descriptor and
/// keep the next turn out); a command that leaves nothing behind stops nothing (its helpers,
/// the supervisor or the watcher, are not taken for leftovers).
pub(crate) fn leftovers_are_stopped_between_turns(store: &str, extra: &[&str]) {
    const STOPPING: &str = "stopping what the command left running";
    let tmp = tempfile::tempdir().unwrap();
    let pids = tmp.path().join("pids");
    let resource = format!("standby-leftovers-{}", std::process::id());
    let turns = |script: &str| {
        let out = Command::new(bin())
            .args([
                "run",
                "--standby",
                "--max-restarts",
                "1",
                "-v",
                "--kill-after",
                "5s",
            ])
            .args(["--store", store])
            .args(extra)
            .args([resource.as_str(), "--", "sh", "-c", script])
            .env_remove("XTR_LOCK_STORE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        stderr
    };
    let stderr = turns(&format!("sleep 60 & echo $! >> {}; exit 0", pids.display()));
    assert_eq!(stderr.matches(STOPPING).count(), 2, "{stderr}");
    let pids = lines(&pids);
    assert_eq!(pids.len(), 2, "{stderr}");
    for pid in &pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "the background sleep {pid} of a finished turn still runs: {stderr}"
        );
    }
    let stderr = turns("exit 0");
    assert!(!stderr.contains(STOPPING), "{stderr}");
}

/// Waits (up to 60 s) until the file `path` says `who` leads; its term, where it has one.
fn wait_for(path: &Path, who: &str) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let said = std::fs::read_to_string(path).unwrap_or_default();
        let mut words = said.split_whitespace();
        if words.next() == Some(who) {
            return words.next().map(|t| t.parse().expect("a term"));
        }
        assert!(Instant::now() < deadline, "{who} never led");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `leader` once says nobody leads (exit 1); `leader --watch --json` prints one line per
/// change, in order, as three `run`s take the election's lock one after the other (each led
/// by its pid, nobody between them), and `leader` once names the leader meanwhile (exit 0);
/// SIGTERM ends the watch (exit 0).
pub(crate) fn leader_sees_each_change_in_order(store: &str) {
    use std::io::BufRead as _;
    let once = || {
        Command::new(bin())
            .args(["leader", "--store", store, "elected"])
            .env_remove("XTR_LOCK_STORE")
            .output()
            .unwrap()
    };
    let nobody = once();
    assert_eq!(nobody.status.code(), Some(1), "{nobody:?}");
    assert_eq!(
        String::from_utf8_lossy(&nobody.stdout).trim(),
        "\"elected\": nobody leads"
    );
    let mut watch = super::spawn(&["leader", "--watch", "--json", "--store", store, "elected"]);
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap_or_default());
        }
    });
    let next = || rx.recv_timeout(Duration::from_secs(10)).expect("a line");
    let leader = |line: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["name"], "elected", "{line}");
        v["leader"].clone()
    };
    assert!(leader(&next()).is_null(), "nobody leads at first");
    let mut pids = Vec::new();
    for turn in 0..3 {
        let mut run = super::spawn(&[
            "run", "--store", store, "--ttl", "30s", "elected", "--", "sleep", "1.5",
        ]);
        let led = leader(&next());
        // The CLI's metadata says its pid; flock also tells the holding process's.
        assert_eq!(led["value"]["pid"], run.id(), "{led}");
        if turn == 0 {
            let named = once();
            let line = String::from_utf8_lossy(&named.stdout).into_owned();
            assert_eq!(named.status.code(), Some(0), "{named:?}");
            assert!(line.starts_with("\"elected\": led by {"), "{line}");
            assert!(line.contains(&format!("\"pid\":{}", run.id())), "{line}");
        }
        pids.push(run.id());
        wait_exit(&mut run, "run did not end");
        assert!(leader(&next()).is_null(), "nobody leads after {pids:?}");
    }
    kill(watch.id() as i32, Signal::TERM);
    assert_eq!(
        wait_exit(&mut watch, "leader --watch ignores SIGTERM").code(),
        Some(0)
    );
}
