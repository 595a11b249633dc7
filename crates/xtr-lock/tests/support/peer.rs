//! Real peers in other languages (Python xtr-lock 4.1.0, Symfony Lock 5.4), driven one JSON line
//! at a time over their stdin and stdout (`tests/peers/lock_peer.{py,php}`).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

pub(crate) struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

fn script(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers")
        .join(name)
}

impl Peer {
    /// Python xtr-lock 4.1.0 on `store` (`flock` with a directory, or `redis` with a DSN).
    pub(crate) fn python(kind: &str, location: &str) -> Peer {
        let python = xtr_lock_testkit::python::python_with_peers();
        let mut cmd = Command::new(python);
        cmd.arg(script("lock_peer.py")).arg(kind).arg(location);
        Peer::spawn(cmd)
    }

    /// Symfony Lock's RedisStore (php-cli, php-symfony-lock, php-redis) on `127.0.0.1:port`.
    pub(crate) fn symfony(port: u16) -> Peer {
        Peer::spawn(php("lock_peer.php", &Php::Server(port)))
    }

    /// Symfony Lock's RedisStore on the Redis Cluster with these seed nodes, through
    /// phpredis's `RedisCluster`.
    pub(crate) fn symfony_cluster(seeds: &[u16]) -> Peer {
        Peer::spawn(php("lock_peer.php", &Php::Cluster(seeds)))
    }

    /// Symfony Semaphore's RedisStore (php-symfony-semaphore, php-redis) on `127.0.0.1:port`
    /// (`tests/peers/semaphore_peer.php`).
    pub(crate) fn symfony_semaphore(port: u16) -> Peer {
        Peer::spawn(php("semaphore_peer.php", &Php::Server(port)))
    }

    /// Symfony Semaphore's RedisStore on the Redis Cluster with these seed nodes.
    pub(crate) fn symfony_semaphore_cluster(seeds: &[u16]) -> Peer {
        Peer::spawn(php("semaphore_peer.php", &Php::Cluster(seeds)))
    }

    /// The command that runs `semaphore_peer.php`'s contention loop on `127.0.0.1:port` with
    /// `args` (`RESOURCE LIMIT WEIGHT ROUNDS COUNTER`).
    pub(crate) fn symfony_semaphore_cycle(port: u16, args: &[&str]) -> Command {
        Peer::symfony_semaphore_cycle_on(&Php::Server(port), args)
    }

    /// [`symfony_semaphore_cycle`](Peer::symfony_semaphore_cycle) on one server or a cluster.
    pub(crate) fn symfony_semaphore_cycle_on(at: &Php<'_>, args: &[&str]) -> Command {
        let mut cmd = php("semaphore_peer.php", at);
        cmd.arg("cycle").args(args);
        cmd
    }

    fn spawn(mut cmd: Command) -> Peer {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the peer {cmd:?}: {e}"));
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut peer = Peer {
            child,
            stdin,
            stdout,
        };
        assert_eq!(peer.read()["result"], "ready");
        peer
    }

    pub(crate) fn read(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("the peer said {line:?}: {e}"))
    }

    pub(crate) fn send(&mut self, op: &str, resource: &str, ttl: Option<f64>) {
        let mut cmd = json!({"op": op, "resource": resource});
        if let Some(ttl) = ttl {
            cmd["ttl"] = json!(ttl);
        }
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends `cmd` (a JSON object with `op` and more) and returns its result (panics on a peer
    /// error).
    pub(crate) fn call_json(&mut self, cmd: &Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let answer = self.read();
        assert_eq!(answer["ok"], true, "peer {cmd}: {answer}");
        answer["result"].clone()
    }

    /// Sends a command and returns its result (panics on a peer error).
    pub(crate) fn call(&mut self, op: &str, resource: &str) -> Value {
        self.call_ttl(op, resource, None)
    }

    /// Like [`call`](Peer::call), with a ttl (used when the lock object is first made).
    pub(crate) fn call_ttl(&mut self, op: &str, resource: &str, ttl: Option<f64>) -> Value {
        self.send(op, resource, ttl);
        let answer = self.read();
        assert_eq!(answer["ok"], true, "peer {op} {resource:?}: {answer}");
        answer["result"].clone()
    }
}

/// Where a PHP peer connects: one server on 127.0.0.1, or a cluster by its seed nodes' ports.
pub(crate) enum Php<'a> {
    Server(u16),
    Cluster(&'a [u16]),
}

/// `php <script>` with the arguments that say where it connects.
fn php(name: &str, at: &Php<'_>) -> Command {
    let mut cmd = Command::new("php");
    cmd.arg(script(name));
    match at {
        Php::Server(port) => cmd.arg("127.0.0.1").arg(port.to_string()),
        Php::Cluster(seeds) => {
            let seeds: Vec<String> = seeds.iter().map(|p| format!("127.0.0.1:{p}")).collect();
            cmd.arg("cluster").arg(seeds.join(","))
        }
    };
    cmd
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
