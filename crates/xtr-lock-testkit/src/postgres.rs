//! Throwaway PostgreSQL servers: `initdb` and `postgres` in a temp dir, on a free port of
//! 127.0.0.1 and a unix socket in that dir, trust authentication, no fsync (a killed server
//! keeps what was committed: the WAL is written, only not forced to disk); run as an
//! unprivileged user when the tests run as root (PostgreSQL refuses root). Killed, paused and
//! restarted by fault tests; stopped on drop.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::process::{pid_of, wait_up};
use crate::redis::free_port;
use crate::user::{Account, unprivileged};

/// A PostgreSQL server this test started. Dropping it kills it and removes its directory.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    account: Option<Account>,
}

/// The directory of the server binaries: Debian keeps them out of `PATH`, under
/// `/usr/lib/postgresql/<version>/bin` (the newest is taken).
fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    // Elsewhere the binaries are in PATH.
    let found = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|p| PathBuf::from(p.trim()));
    match found.as_deref().and_then(Path::parent) {
        Some(dir) => dir.to_owned(),
        None => panic!(
            "PostgreSQL's server is not installed (initdb, postgres): apt-get install postgresql"
        ),
    }
}

impl PostgresServer {
    /// Makes a database cluster and starts a server on it.
    ///
    /// # Panics
    ///
    /// When PostgreSQL is not installed (`apt-get install postgresql`; the README's test command
    /// does it), when running as root without a way to make the unprivileged user, or when the
    /// server does not come up within 30 s.
    pub fn start() -> PostgresServer {
        let account = unprivileged();
        let dir = tempfile::Builder::new()
            .prefix("xtr-testkit-pg-")
            .tempdir()
            .expect("a temp dir for postgres");
        if let Some(a) = &account {
            std::os::unix::fs::chown(dir.path(), Some(a.uid), Some(a.gid))
                .expect("give the server's directory to its user");
        }
        let bin = bin_dir();
        let mut server = PostgresServer {
            child: None,
            port: free_port(),
            dir,
            bin,
            account,
        };
        let init = server
            .command("initdb")
            .arg("-D")
            .arg(server.data())
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb ({e}): apt-get install postgresql"));
        assert!(
            init.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        server.spawn();
        server
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some(a) = &self.account {
            cmd.uid(a.uid).gid(a.gid);
        }
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.log()).expect("the server's log file");
        if let Some(a) = &self.account {
            std::os::unix::fs::chown(self.log(), Some(a.uid), Some(a.gid))
                .expect("give the log to the server's user");
        }
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off"])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=200"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start postgres ({e}): apt-get install postgresql"));
        let mut child = child;
        let what = format!("postgres on port {}", self.port);
        wait_up(
            &mut child,
            &what,
            &self.log(),
            Duration::from_secs(30),
            || self.ready(),
        );
        self.child = Some(child);
    }

    fn ready(&self) -> bool {
        Command::new("pg_isready")
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres` (trust authentication: no password).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// What the server has written to its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// The directory of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `sql` with `psql` (unaligned, tuples only) and returns its output, trimmed.
    ///
    /// # Panics
    ///
    /// When `psql` fails.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args([
                "-d",
                "postgres",
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("psql (package postgresql-client)");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The server's main process.
    pub fn pid(&self) -> Pid {
        pid_of(self.child.as_ref().expect("the server runs"))
    }

    /// Immediate shutdown (SIGQUIT: the server ends its sessions at once, without a checkpoint).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill_process(pid_of(&child), Signal::CONT);
            let _ = kill_process(pid_of(&child), Signal::QUIT);
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data (what was committed is still there).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP of the server and every backend: nothing answers, connections stay open.
    pub fn pause(&self) {
        // The main process first: once it is stopped it forks no new backend, so the list
        // read after it is complete (read before, it could miss a backend being forked for a
        // connection just opened, which would go on answering).
        let _ = crate::process::stop(self.pid());
        for pid in self.processes() {
            let _ = crate::process::stop(pid);
        }
    }

    /// SIGCONT after [`pause`](PostgresServer::pause).
    pub fn resume(&self) {
        for pid in self.processes() {
            let _ = kill_process(pid, Signal::CONT);
        }
    }

    /// The main process and its children (backends, background workers), from `/proc`.
    fn processes(&self) -> Vec<Pid> {
        let main = self.pid();
        let mut all = vec![main];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The parent's pid is the second field after the parenthesized command name.
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(main.as_raw_nonzero().get())
                && let Some(child) = Pid::from_raw(pid)
            {
                all.push(child);
            }
        }
        all
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
    }
}
