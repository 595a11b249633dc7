//! FlockStore's semaphores with portalocker 4.4.2's `NamedBoundedSemaphore` on the same slot
//! files (`bounded_semaphore_peer.py`, a process per peer), both ways: their slots count
//! against our limit, ours against theirs, a killed holder's slot is free at once, and mixed
//! contenders never exceed the limit (a checker file both sides update under a flock).

#![cfg(target_os = "linux")]

use std::fs::OpenOptions;
use std::io::{BufRead as _, BufReader, Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use xtr_lock::{FlockStore, LockFactory, Semaphore};

const PATIENCE: Duration = Duration::from_secs(20);

/// One portalocker process (`bounded_semaphore_peer.py DIR NAME MAXIMUM MODE ARGS`).
struct Py {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Py {
    fn start(dir: &Path, name: &str, maximum: u32, mode: &[&str]) -> Py {
        let python = xtr_lock_testkit::python::python_with_peers();
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/bounded_semaphore_peer.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(dir)
            .arg(name)
            .arg(maximum.to_string())
            .args(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python with portalocker");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Py {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The next line it prints (panics if it ends or says nothing in time).
    fn line(&self) -> String {
        self.lines
            .recv_timeout(PATIENCE)
            .expect("the portalocker peer said nothing")
    }

    /// Lets a `hold` peer release (its stdin closes).
    fn release(&mut self) {
        self.stdin.take();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A store whose waiters are woken only by releases (the safety-net poll never fires).
fn factory(dir: &Path) -> LockFactory {
    let store = FlockStore::in_dir(dir)
        .unwrap()
        .with_poll_interval(Duration::from_secs(3600));
    LockFactory::new(store)
}

fn sem(f: &LockFactory, name: &str, limit: u32, count: u32) -> Semaphore {
    f.create_semaphore(name, limit)
        .unwrap()
        .permits(count)
        .unwrap()
}

#[tokio::test]
async fn flock_semaphore_python_holds_two_of_three_and_rust_gets_one_not_two() {
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(tmp.path());
    let py = Py::start(tmp.path(), "exports", 3, &["hold", "2"]);
    assert_eq!(py.line(), "held exports.00.lock exports.01.lock");
    assert!(!sem(&f, "exports", 3, 2).try_acquire().await.unwrap());
    let one = sem(&f, "exports", 3, 1);
    assert!(one.try_acquire().await.unwrap());
    let usage = one.usage().await.unwrap();
    assert_eq!(usage.used, 3, "{usage:?}");
    assert_eq!(usage.holders.len(), 2, "python's 2 and ours: {usage:?}");
    assert!(!sem(&f, "exports", 3, 1).try_acquire().await.unwrap());
    let full = Py::start(tmp.path(), "exports", 3, &["try", "0.2"]);
    assert_eq!(full.line(), "timeout");
}

#[tokio::test]
async fn flock_semaphore_rust_holds_and_pythons_acquire_times_out_until_released() {
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(tmp.path());
    let all = sem(&f, "reindex", 3, 3);
    assert!(all.try_acquire().await.unwrap());
    assert_eq!(
        Py::start(tmp.path(), "reindex", 3, &["try", "0.2"]).line(),
        "timeout"
    );
    let _ = all.release().await.unwrap();
    let two = sem(&f, "reindex", 3, 2);
    assert!(two.try_acquire().await.unwrap());
    assert_eq!(
        Py::start(tmp.path(), "reindex", 3, &["try", "0.2"]).line(),
        "got",
        "one slot left for portalocker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_semaphore_a_killed_python_holders_slot_comes_back_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(tmp.path());
    let mut holder = Py::start(tmp.path(), "deploy", 2, &["hold", "1"]);
    assert_eq!(holder.line(), "held deploy.00.lock");
    let mut other = Py::start(tmp.path(), "deploy", 2, &["hold", "1"]);
    assert_eq!(other.line(), "held deploy.01.lock");
    let waiter = sem(&f, "deploy", 2, 1);
    let waiting = tokio::spawn(async move {
        let got = waiter.acquire_timeout(PATIENCE).await.unwrap();
        (got, waiter)
    });
    holder.kill();
    let (got, waiter) = waiting.await.unwrap();
    assert!(
        got,
        "woken by the kernel closing the killed holder's slot file"
    );
    assert_eq!(waiter.usage().await.unwrap().used, 2);
    other.release();
    assert_eq!(other.line(), "released");
}

/// The checker: permits in use now, in a file changed under its flock by every holder; `over`
/// is appended by whoever finds it above the limit.
fn checker_add(path: &Path, change: i64, limit: i64) {
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    file.lock().unwrap();
    let mut text = String::new();
    file.read_to_string(&mut text).unwrap();
    let mut lines = text.lines();
    let now = lines.next().unwrap_or("0").parse::<i64>().unwrap() + change;
    let mut rest: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    if now > limit {
        rest.push("over");
    }
    file.set_len(0).unwrap();
    file.rewind().unwrap();
    writeln!(file, "{now}").unwrap();
    for line in rest {
        writeln!(file, "{line}").unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_semaphore_mixed_contenders_never_exceed_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let checker: PathBuf = tmp.path().join("checker");
    let checker_arg = checker.to_str().unwrap().to_owned();
    let pythons: Vec<Py> = (0..3)
        .map(|_| Py::start(tmp.path(), "mixed", 3, &["churn", "25", &checker_arg]))
        .collect();
    let mut tasks = Vec::new();
    for (i, count) in [1u32, 2, 1, 2].into_iter().enumerate() {
        let f = factory(tmp.path());
        let checker = checker.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..25 {
                let s = sem(&f, "mixed", 3, count);
                assert!(
                    s.acquire_timeout(PATIENCE * 3).await.unwrap(),
                    "{i}/{round}"
                );
                checker_add(&checker, count.into(), 3);
                tokio::time::sleep(Duration::from_millis(2)).await;
                checker_add(&checker, -i64::from(count), 3);
                let _ = s.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for py in &pythons {
        assert_eq!(py.line(), "done");
    }
    let text = std::fs::read_to_string(&checker).unwrap();
    assert_eq!(text, "0\n", "in use at the end, and no `over`");
}
