//! Throwaway `memcached` servers: a free port, nothing on disk; killed, paused and restarted by
//! fault tests; stopped on drop.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// A `memcached` this test started. Dropping it kills it.
#[derive(Debug)]
pub struct MemcachedServer {
    child: Option<Child>,
    port: u16,
    extra: Vec<String>,
}

impl MemcachedServer {
    /// Starts a server on a free port of 127.0.0.1 (TCP only, 64 MB).
    ///
    /// # Panics
    ///
    /// When `memcached` is not installed (`apt-get install memcached`; the README's test
    /// command does it) or does not come up within 10 s.
    pub fn start() -> MemcachedServer {
        Self::start_with(&[])
    }

    /// Like [`start`](MemcachedServer::start), with extra `memcached` arguments (`-m 1`).
    pub fn start_with(extra: &[&str]) -> MemcachedServer {
        let mut server = MemcachedServer {
            child: None,
            port: crate::redis::free_port(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("memcached")
            .args(["-l", "127.0.0.1", "-p", &self.port.to_string(), "-U", "0"])
            // Only read when run as root, which memcached refuses without it.
            .args(["-u", "root"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start memcached ({e}): install it with `apt-get install memcached`")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.command("version").is_none() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("memcached on port {} exited at start: {status}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "memcached on port {} did not come up",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends one text-protocol command line and returns the reply up to its last line end
    /// (`None` if the server cannot be reached): `flush_all`, `stats`, `mg key v`.
    pub fn command(&self, line: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("{line}\r\n").as_bytes()).ok()?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&reply);
            let done = [
                "END\r\n", "OK\r\n", "HD\r\n", "EN\r\n", "NF\r\n", "EX\r\n", "NS\r\n",
            ]
            .iter()
            .any(|end| text.ends_with(end))
                || text.starts_with("VERSION ") && text.ends_with("\r\n")
                || text.starts_with("VA ") && text.matches("\r\n").count() >= 2
                || text.contains("ERROR");
            if done {
                break;
            }
        }
        Some(String::from_utf8_lossy(&reply).into_owned())
    }

    /// The value stored at `key`, if any (`mg <key> v`).
    pub fn get(&self, key: &str) -> Option<String> {
        let reply = self.command(&format!("mg {key} v"))?;
        let mut lines = reply.split("\r\n");
        lines
            .next()
            .filter(|l| l.starts_with("VA "))
            .and(lines.next().map(str::to_owned))
    }

    /// A server statistic (`stats`): `cmd_touch`, `evictions`, `curr_items`.
    pub fn stat(&self, name: &str) -> u64 {
        let stats = self.command("stats").unwrap_or_default();
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `memcached://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("memcached://127.0.0.1:{}", self.port)
    }

    /// The server's process.
    pub fn pid(&self) -> Pid {
        crate::process::pid_of(self.child.as_ref().expect("the server runs"))
    }

    /// SIGKILL: the server dies at once, with every lock in it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill_process(crate::process::pid_of(&child), Signal::CONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the server keeps its connections but answers nothing; returns once every
    /// thread of it has stopped.
    pub fn pause(&self) {
        crate::process::stop(self.pid()).expect("SIGSTOP memcached");
    }

    /// SIGCONT after [`pause`](MemcachedServer::pause).
    pub fn resume(&self) {
        kill_process(self.pid(), Signal::CONT).expect("SIGCONT memcached");
    }
}

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        self.kill();
    }
}
