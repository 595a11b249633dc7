//! Throwaway `redis-server` processes: a free port, a temp dir, no persistence; killed, paused
//! and restarted by fault tests; stopped on drop.

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// A `redis-server` this test started. Dropping it kills it and removes its directory.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    /// Set by [`pause`](RedisServer::pause), cleared by [`resume`](RedisServer::resume) and
    /// by a restart.
    paused: AtomicBool,
    port: u16,
    dir: tempfile::TempDir,
    /// Arguments before the options (a config file, `--sentinel`).
    leading: Vec<OsString>,
    extra: Vec<String>,
    tls_port: Option<u16>,
    _certs: Option<tempfile::TempDir>,
}

impl RedisServer {
    /// Starts a server on a free port of 127.0.0.1, with a unix socket in its directory.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (`apt-get install redis-server`; the README's test
    /// command does it) or does not come up within 10 s.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`start`](RedisServer::start), also listening with TLS on [`tls_port`] with a
    /// self-signed certificate for 127.0.0.1 made by `openssl` in the server's directory.
    ///
    /// [`tls_port`]: RedisServer::tls_port
    ///
    /// # Panics
    ///
    /// When `openssl` is missing (`apt-get install openssl`) or the server does not come up.
    pub fn start_tls() -> RedisServer {
        let certs = tempfile::Builder::new()
            .prefix("xtr-testkit-tls-")
            .tempdir()
            .expect("a temp dir for certificates");
        let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run openssl ({e}): apt-get install openssl"));
        assert!(made.success(), "openssl could not make a certificate");
        let tls_port = free_port().to_string();
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let mut server = Self::start_with(&[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &cert,
            "--tls-auth-clients",
            "no",
        ]);
        server.tls_port = tls_port.parse().ok();
        server._certs = Some(certs);
        server
    }

    /// The TLS port, for a server made by [`start_tls`](RedisServer::start_tls).
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// Like [`start`](RedisServer::start), with extra `redis-server` arguments (`--requirepass x`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        // Another test can take the port found free before the server binds it (rare: see
        // `free_port`): then the server starts again on another (twice at most).
        for attempt in 1.. {
            match std::panic::catch_unwind(|| Self::start_on_with(free_port(), extra)) {
                Ok(server) => return server,
                Err(panic) if attempt < 3 && crate::process::lost_a_port(&panic) => {}
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// Like [`start`](RedisServer::start), on `port`: a free port a client was pointed at
    /// before the server was up (a server that starts late).
    pub fn start_on(port: u16) -> RedisServer {
        Self::start_on_with(port, &[])
    }

    fn start_on_with(port: u16, extra: &[&str]) -> RedisServer {
        Self::start_custom(port, Vec::new(), extra)
    }

    /// A server on `port` started as `redis-server <leading> <the usual options> <extra>`.
    pub(crate) fn start_custom(port: u16, leading: Vec<OsString>, extra: &[&str]) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("xtr-testkit-redis-")
            .tempdir()
            .expect("a temp dir for redis-server");
        let mut server = RedisServer {
            child: None,
            paused: AtomicBool::new(false),
            port,
            dir,
            leading,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            tls_port: None,
            _certs: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let sock = self.socket_path();
        let child = Command::new("redis-server")
            .args(&self.leading)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--unixsocket")
            .arg(&sock)
            .args(["--unixsocketperm", "700"])
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install it with `apt-get install redis-server`")
            });
        self.child = Some(child);
        self.paused.store(false, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers_ping() {
            // One that exited (its port taken meanwhile) is told at once, not after 10 s.
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            assert!(
                !exited && Instant::now() < deadline,
                "redis-server on port {} did not come up; its log: {}",
                self.port,
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether its process runs (paused or not): not killed.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether it runs and is not paused: it answers.
    pub fn is_up(&self) -> bool {
        self.child.is_some() && !self.paused.load(Ordering::Relaxed)
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 64];
        // A password-protected server answers NOAUTH: it is up all the same.
        s.write_all(b"PING\r\n").is_ok() && s.read(&mut buf).is_ok_and(|n| n > 0)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/<db>`.
    pub fn url(&self, db: u32) -> String {
        format!("redis://127.0.0.1:{}/{db}", self.port)
    }

    /// The unix socket.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// The server's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's process.
    pub fn pid(&self) -> Pid {
        crate::process::pid_of(self.child.as_ref().expect("the server runs"))
    }

    /// SIGKILL: the server dies at once, with every lock in it (no persistence).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing persists).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the server keeps its connections but answers nothing; returns once every
    /// thread of it has stopped.
    pub fn pause(&self) {
        crate::process::stop(self.pid()).expect("SIGSTOP redis-server");
        self.paused.store(true, Ordering::Relaxed);
    }

    /// SIGCONT after [`pause`](RedisServer::pause).
    pub fn resume(&self) {
        kill_process(self.pid(), Signal::CONT).expect("SIGCONT redis-server");
        self.paused.store(false, Ordering::Relaxed);
    }

    /// How often `command` ran since the last `CONFIG RESETSTAT` (`INFO commandstats`), not
    /// counting calls the server refused (the `NOSCRIPT` of a script's first use, which a
    /// client then loads and sends again).
    pub fn command_calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let Some(line) = stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
        else {
            return 0;
        };
        let field = |name: &str| -> u64 {
            line.split(&format!("{name}="))
                .nth(1)
                .and_then(|v| v.split(',').next())
                .map_or(0, |v| v.parse().unwrap())
        };
        field("calls") - field("failed_calls")
    }

    /// Runs `redis-cli` against this server with `args`, returning its output (trimmed).
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli (package redis-tools)");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused server must be woken to die cleanly.
            let _ = kill_process(self.pid(), Signal::CONT);
            let _ = child;
        }
        self.kill();
    }
}

/// A port of 127.0.0.1 free when asked, outside the range the kernel hands out to outgoing
/// connections (see [`free_ports`]): a port found with a bind to `:0` is one of those, and any
/// test's client connection could take it before the server binds it.
pub(crate) fn free_port() -> u16 {
    free_ports(1, None)[0]
}

/// `n` ports of 127.0.0.1 free when asked, with `port + offset` free too for each when `offset`
/// is given (a cluster node's bus port). They are picked at random outside the range the kernel
/// hands out to outgoing connections, so a client's connection cannot take one between this
/// choice and the server's start; another test picking the same port meanwhile is possible
/// but rare, and a start that loses its port is tried again on others.
pub(crate) fn free_ports(n: usize, offset: Option<u16>) -> Vec<u16> {
    use rand::Rng as _;
    let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u32>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    let off = u32::from(offset.unwrap_or(0));
    let outside = |p: u32| p < lo || p > hi;
    let usable = |p: u32| outside(p) && outside(p + off) && p + off <= 65535;
    let candidates: Vec<u32> = (10000..=65535).filter(|&p| usable(p)).collect();
    assert!(!candidates.is_empty(), "no port range outside {lo}-{hi}");
    let mut rng = rand::rng();
    // Held until every port is chosen: no port is picked twice.
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..10_000 {
        if ports.len() == n {
            return ports;
        }
        let p = candidates[rng.random_range(0..candidates.len())];
        let bind = |p: u32| TcpListener::bind(("127.0.0.1", u16::try_from(p).ok()?)).ok();
        let Some(main) = bind(p) else { continue };
        let bus = if offset.is_some() {
            bind(p + off)
        } else {
            None
        };
        if offset.is_some() && bus.is_none() {
            continue;
        }
        held.push((main, bus));
        ports.push(u16::try_from(p).expect("a port"));
    }
    panic!("could not find {n} free ports outside {lo}-{hi}")
}
