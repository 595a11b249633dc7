//! Throwaway `etcd` clusters (Debian `etcd-server`): one member or several, on free ports of
//! 127.0.0.1 in temp dirs; members killed, paused and restarted by fault tests; stopped on drop.
//!
//! Elections are tuned for tests (50 ms heartbeats, 500 ms election timeout), so a lost leader
//! is replaced within about a second and the smallest lease is 1 s.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// One member of an [`EtcdCluster`].
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// `etcd` processes this test started. Dropping it kills them and removes their directory.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    /// The CA's certificate, and the certificate and key a TLS cluster serves.
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
    initial_cluster: String,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// One member: a single-node cluster.
    ///
    /// # Panics
    ///
    /// As [`start`](EtcdCluster::start).
    pub fn single() -> EtcdCluster {
        Self::start(1)
    }

    /// `n` members with a static initial cluster, started together; returns once every member
    /// answers and the cluster has a leader.
    ///
    /// # Panics
    ///
    /// When `etcd` is not installed (`apt-get install etcd-server`; the README's test command
    /// does it) or the cluster does not come up within 30 s.
    pub fn start(n: usize) -> EtcdCluster {
        Self::start_with(n, false)
    }

    /// One member serving clients over TLS only, with a certificate for 127.0.0.1 signed by a
    /// CA made by `openssl` in its directory ([`ca_file`](EtcdCluster::ca_file)).
    ///
    /// # Panics
    ///
    /// As [`start`](EtcdCluster::start), and when `openssl` is missing.
    pub fn single_tls() -> EtcdCluster {
        Self::start_with(1, true)
    }

    fn start_with(n: usize, tls: bool) -> EtcdCluster {
        // A port found free can be taken by another test's connection before etcd binds it:
        // then the cluster is started again on other ports (twice at most).
        for attempt in 1.. {
            match std::panic::catch_unwind(|| Self::try_start(n, tls)) {
                Ok(cluster) => return cluster,
                Err(panic) if attempt < 3 && crate::process::lost_a_port(&panic) => {}
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        unreachable!("the loop returns or panics")
    }

    fn try_start(n: usize, tls: bool) -> EtcdCluster {
        assert!(n >= 1, "a cluster has at least one member");
        let dir = tempfile::Builder::new()
            .prefix("xtr-testkit-etcd-")
            .tempdir()
            .expect("a temp dir for etcd");
        // Every port taken at once, the listeners held until all are known: a port given back
        // can be handed out again at once, and two members (or a member's two ports) on one
        // port fail to start.
        let listeners: Vec<std::net::TcpListener> = (0..2 * n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1"))
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().expect("a bound port").port())
            .collect();
        drop(listeners);
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data: dir.path().join(format!("m{i}.etcd")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let tls = tls.then(|| certificate(dir.path()));
        let mut cluster = EtcdCluster {
            members,
            tls,
            initial_cluster,
            dir,
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.wait_healthy(i);
        }
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let initial_cluster = self.initial_cluster.clone();
        let tls = self.tls.clone();
        let m = &mut self.members[i];
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log)
            .expect("etcd's log file");
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut cmd = Command::new("etcd");
        if let Some((_, cert, key)) = &tls {
            cmd.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
        }
        let child = cmd
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "xtr-testkit"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start etcd ({e}): install it with `apt-get install etcd-server`")
            });
        m.child = Some(child);
    }

    fn wait_healthy(&mut self, i: usize) {
        if self.tls.is_some() {
            return self.wait_healthy_tls(i);
        }
        let port = self.members[i].client_port;
        let log = self.members[i].log.clone();
        let what = format!("etcd member {} on port {port}", self.members[i].name);
        let child = self.members[i].child.as_mut().expect("the member runs");
        crate::process::wait_up(child, &what, &log, Duration::from_secs(30), || {
            healthy(port)
        });
    }

    fn wait_healthy_tls(&mut self, i: usize) {
        let endpoint = self.etcdctl_endpoints();
        let ca = self.ca_file().expect("a TLS cluster").to_owned();
        let log = self.members[i].log.clone();
        let what = format!("etcd member {} (TLS)", self.members[i].name);
        let child = self.members[i].child.as_mut().expect("the member runs");
        crate::process::wait_up(child, &what, &log, Duration::from_secs(30), || {
            Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={endpoint}"))
                .arg("--cacert")
                .arg(&ca)
                .args(["endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
    }

    /// The CA that signed a TLS cluster's certificate.
    pub fn ca_file(&self) -> Option<&std::path::Path> {
        self.tls.as_ref().map(|(ca, ..)| ca.as_path())
    }

    /// How many members it has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether it has no members (never: a cluster has at least one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client endpoint, `127.0.0.1:<port>`, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// `etcd://<every endpoint, comma-separated><path>`: `path` is empty or `/prefix`.
    pub fn dsn(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}{path}", self.endpoints().join(","))
    }

    /// The endpoints as `etcdctl --endpoints` wants them.
    pub fn etcdctl_endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let scheme = if self.tls.is_some() { "https" } else { "http" };
                format!("{scheme}://127.0.0.1:{}", m.client_port)
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// An `etcdctl` command (API v3) on every member, with a 5 s command timeout.
    pub fn etcdctl(&self) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.etcdctl_endpoints()))
            .arg("--command-timeout=5s");
        if let Some(ca) = self.ca_file() {
            cmd.arg("--cacert").arg(ca);
        }
        cmd
    }

    /// Runs `etcdctl` with `args`, returning its standard output.
    ///
    /// # Panics
    ///
    /// When etcdctl is missing (`apt-get install etcd-client`) or fails.
    pub fn etcdctl_output(&self, args: &[&str]) -> String {
        let out =
            self.etcdctl().args(args).output().unwrap_or_else(|e| {
                panic!("cannot run etcdctl ({e}): apt-get install etcd-client")
            });
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The index of the member that leads now, from the members that answer (plain clusters:
    /// it asks their HTTP gateway).
    pub fn leader(&self) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let Some(status) = status(m.client_port) else {
                continue;
            };
            let (Some(me), Some(leader)) = (
                json_number(&status, "member_id"),
                json_number(&status, "leader"),
            ) else {
                continue;
            };
            if me == leader {
                return Some(i);
            }
        }
        None
    }

    /// Waits until a running member reports itself leader, and returns its index.
    ///
    /// # Panics
    ///
    /// When there is no leader within 30 s.
    pub fn wait_leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(i) = self.leader() {
                return i;
            }
            assert!(Instant::now() < deadline, "no etcd leader within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The process of member `i`.
    pub fn pid(&self, i: usize) -> Pid {
        crate::process::pid_of(self.members[i].child.as_ref().expect("the member runs"))
    }

    /// SIGKILL member `i`; its data stays for [`restart`](EtcdCluster::restart).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data (it rejoins the cluster).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_up_tcp(i);
    }

    fn wait_up_tcp(&mut self, i: usize) {
        let port = self.members[i].client_port;
        let log = self.members[i].log.clone();
        let what = format!("etcd member {} on port {port}", self.members[i].name);
        let child = self.members[i].child.as_mut().expect("the member runs");
        crate::process::wait_up(child, &what, &log, Duration::from_secs(30), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// SIGSTOP member `i`: it keeps its sockets but answers nothing.
    pub fn pause(&self, i: usize) {
        crate::process::stop(self.pid(i)).expect("SIGSTOP etcd");
    }

    /// SIGCONT member `i` after [`pause`](EtcdCluster::pause).
    pub fn resume(&self, i: usize) {
        kill_process(self.pid(i), Signal::CONT).expect("SIGCONT etcd");
    }

    /// The cluster's directory (data and logs of every member).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            if let Some(child) = &self.members[i].child {
                // A paused member dies of SIGKILL all the same.
                let _ = kill_process(crate::process::pid_of(child), Signal::CONT);
            }
            self.kill(i);
        }
    }
}

/// One HTTP/1.0 exchange with an etcd member's client port (its JSON gateway), within 1 s.
fn http(port: u16, request: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// Whether the member on `port` says it is healthy (it has a leader and serves).
fn healthy(port: u16) -> bool {
    http(port, "GET /health HTTP/1.0\r\n\r\n").is_some_and(|a| a.contains("\"health\":\"true\""))
}

/// The member's `Maintenance.Status`, as JSON.
fn status(port: u16) -> Option<String> {
    let body = "{}";
    http(
        port,
        &format!(
            "POST /v3/maintenance/status HTTP/1.0\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// A number field of a JSON text, written as a string or a number (the gateway quotes 64-bit
/// integers).
fn json_number(json: &str, field: &str) -> Option<u64> {
    let at = json.find(&format!("\"{field}\":"))? + field.len() + 3;
    let rest = json[at..].trim_start().trim_start_matches('"');
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A CA, and a certificate for 127.0.0.1 it signed with its key, in `dir`, made by `openssl`:
/// (the CA's certificate, the server's certificate, the server's key). rustls refuses a
/// self-signed CA certificate used as the server's own.
fn certificate(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    let openssl = |args: &[&str]| {
        let made = Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run openssl ({e}): apt-get install openssl"));
        assert!(made.success(), "openssl {args:?} failed");
    };
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("the certificate's extensions");
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=xtr-testkit-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "server.ext",
        "-out",
        "cert.pem",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    )
}
