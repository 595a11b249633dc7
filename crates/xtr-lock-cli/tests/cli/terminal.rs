//! `xtr-lock run` on a real terminal (tmux): the waiting line while the lock is held, cleared
//! once it is taken, and `-v`'s report. Needs tmux (the README test command installs it).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{bin, flock_dsn, spawn, stop, wait_held};

/// A tmux server of this test's own, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(command: &str) -> Tmux {
        let socket = format!("xtr-lock-test-{}", std::process::id());
        let out = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "160",
                "-y",
                "20",
            ])
            .arg(command)
            .output()
            .unwrap_or_else(|e| panic!("cannot run tmux ({e}): install it (apt-get install tmux)"));
        assert!(
            out.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmux { socket }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen satisfies `ok`, failing with the screen after 10 s.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "never saw {what}:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

#[test]
fn the_waiting_line_and_verbose_report_on_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let holder = spawn(&["run", "--store", &store, "term", "--", "sleep", "30"]);
    wait_held(&store, "term");
    let tmux = Tmux::start(&format!(
        "{} run -v --store {store} term echo the-command-ran; sleep 30",
        shell_quote(&bin())
    ));
    let screen = tmux.wait_for("the waiting line", |s| {
        s.contains("xtr-lock: waiting for \"term\" (") && s.contains("; held by pid ")
    });
    assert!(!screen.contains("getting lock"), "{screen}");
    stop(holder);
    // Its own line: `executing …` names it too.
    let screen = tmux.wait_for("the command's output", |s| {
        s.lines().any(|l| l.trim_end() == "the-command-ran")
    });
    let lines: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines[0].starts_with("xtr-lock: getting lock \"term\" took ")
            && lines[0].ends_with(" seconds (write)"),
        "the waiting line is replaced by the report: {screen}"
    );
    assert_eq!(
        lines[1], "xtr-lock: executing echo the-command-ran",
        "{screen}"
    );
    assert_eq!(lines[2].trim_end(), "the-command-ran", "{screen}");
    assert!(
        !screen.contains("waiting for"),
        "the waiting line is cleared: {screen}"
    );
}
