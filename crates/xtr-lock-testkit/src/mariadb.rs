//! Throwaway MariaDB servers: `mariadb-install-db` and `mariadbd` in a temp dir, on a free port
//! of 127.0.0.1 and a unix socket in that dir, without grant tables (any user, no password), a
//! database `xtr` made at start. Killed, paused and restarted by fault tests; stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

use crate::process::{pid_of, wait_up};
use crate::redis::free_port;

/// A MariaDB server this test started. Dropping it kills it and removes its directory.
#[derive(Debug)]
pub struct MariaDbServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

/// The user `mariadbd` runs as: root may only run it when it says so.
fn run_as() -> String {
    if rustix::process::geteuid().is_root() {
        "root".to_owned()
    } else {
        std::env::var("USER").unwrap_or_else(|_| "nobody".to_owned())
    }
}

impl MariaDbServer {
    /// Makes a data directory and starts a server on it.
    ///
    /// # Panics
    ///
    /// When MariaDB is not installed (`apt-get install mariadb-server`; the README's test
    /// command does it), or when the server does not come up within 30 s.
    pub fn start() -> MariaDbServer {
        let dir = tempfile::Builder::new()
            .prefix("xtr-testkit-mariadb-")
            .tempdir()
            .expect("a temp dir for mariadbd");
        let server = MariaDbServer {
            child: None,
            port: free_port(),
            dir,
        };
        // A temp dir of its own: a starting server removes the `#sql*` files it finds in its
        // temp dir, which breaks another server bootstrapping next to it in a shared /tmp.
        std::fs::create_dir_all(server.tmp()).expect("the server's temp dir");
        let init = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data().display()))
            .arg(format!("--tmpdir={}", server.tmp().display()))
            .arg(format!("--user={}", run_as()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run mariadb-install-db ({e}): apt-get install mariadb-server")
            });
        assert!(
            init.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let mut server = server;
        server.spawn();
        server.sql("CREATE DATABASE IF NOT EXISTS xtr");
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn tmp(&self) -> PathBuf {
        self.dir.path().join("tmp")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("error.log")
    }

    fn spawn(&mut self) {
        let dir = self.dir.path();
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data().display()))
            .arg(format!("--tmpdir={}", self.tmp().display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!("--log-error={}", self.log().display()))
            .arg(format!("--user={}", run_as()))
            .args([
                "--skip-grant-tables",
                "--skip-log-bin",
                "--max-connections=300",
            ])
            .args([
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start mariadbd ({e}): apt-get install mariadb-server")
            });
        let mut child = child;
        let what = format!("mariadbd on port {}", self.port);
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
        Command::new("mariadb-admin")
            .args([
                "--no-defaults",
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
            ])
            .args(["-u", "root", "--connect-timeout=1", "ping"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:<port>/xtr` (no grant tables: no password).
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/xtr", self.port)
    }

    /// The server's unix socket.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    /// The server's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `sql` with the `mariadb` client (batch mode, no column names) and returns its
    /// output, trimmed.
    ///
    /// # Panics
    ///
    /// When the client fails.
    pub fn sql(&self, sql: &str) -> String {
        let out = Command::new("mariadb")
            .args([
                "--no-defaults",
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
            ])
            .args(["-u", "root", "-N", "-B", "-e", sql])
            .output()
            .expect("the mariadb client (package mariadb-client)");
        assert!(
            out.status.success(),
            "mariadb {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The server's process.
    pub fn pid(&self) -> Pid {
        pid_of(self.child.as_ref().expect("the server runs"))
    }

    /// SIGKILL: the server dies at once (InnoDB recovers committed work at the next start).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill_process(pid_of(&child), Signal::CONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the server keeps its connections but answers nothing; returns once every
    /// thread of it has stopped.
    pub fn pause(&self) {
        crate::process::stop(self.pid()).expect("SIGSTOP mariadbd");
    }

    /// SIGCONT after [`pause`](MariaDbServer::pause).
    pub fn resume(&self) {
        kill_process(self.pid(), Signal::CONT).expect("SIGCONT mariadbd");
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.kill();
    }
}
