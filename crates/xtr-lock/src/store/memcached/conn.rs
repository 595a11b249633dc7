//! The few commands of Memcached's meta protocol the store needs, over a small pool of
//! connections. A request that fails, times out or is dropped mid-flight takes its connection
//! with it, so a connection back in the pool never has a reply left unread but those of quiet
//! commands, which it counts and reads before the next reply.

use std::io;
use std::pin::Pin;
use std::time::Duration;

use crate::mutex::lock;
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _,
};

use super::config::{Address, MemcachedConfig};

/// Idle connections kept for later requests.
const IDLE: usize = 16;

/// The longest reply line accepted (a `VA` line with its flags is far shorter).
const MAX_LINE: usize = 4096;

/// The longest value read back (a token is 44 bytes; a foreign value may be larger).
const MAX_VALUE: usize = 1 << 20;

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// One connection.
pub(super) struct Conn {
    io: tokio::io::BufStream<Pin<Box<dyn Io>>>,
    /// Batches of quiet commands sent without waiting ([`Conn::send_quiet`]), each ended by
    /// an `mn` whose `MN` is still to be read.
    pending: usize,
}

/// A lock entry as `mg` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) value: Vec<u8>,
    pub(super) cas: u64,
    /// Seconds left; `None` for an entry without expiry.
    pub(super) ttl: Option<u64>,
}

/// What a conditional store or delete found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    /// Done (`HD`).
    Done,
    /// Not stored: the key exists (`NS`, for an add).
    Exists,
    /// The entry changed since it was read (`EX`).
    Changed,
    /// No such key (`NF`).
    Missing,
}

/// Whether `err` says the connection was closed under the request: on a connection taken from
/// the pool, the server closed it while it was idle (a restart), and the request can be sent
/// again on a new one.
pub(super) fn is_closed(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

fn protocol(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl Conn {
    pub(super) async fn connect(config: &MemcachedConfig) -> io::Result<Conn> {
        let io: Pin<Box<dyn Io>> = match &config.address {
            Address::Tcp(host, port) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Box::pin(stream)
            }
            Address::Unix(path) => Box::pin(tokio::net::UnixStream::connect(path).await?),
        };
        Ok(Conn {
            io: tokio::io::BufStream::new(io),
            pending: 0,
        })
    }

    async fn send(&mut self, line: &[u8], data: Option<&[u8]>) -> io::Result<()> {
        self.io.write_all(line).await?;
        self.io.write_all(b"\r\n").await?;
        if let Some(data) = data {
            self.io.write_all(data).await?;
            self.io.write_all(b"\r\n").await?;
        }
        self.io.flush().await
    }

    /// Sends quiet meta commands (`commands`, whole lines) and an `mn`, without waiting: a
    /// write, no round trip. What they answer (nothing when they succeed, being quiet; an error
    /// line otherwise) is read and dropped before the next reply on this connection, up to the
    /// `MN`. For what is best effort: the holders' records.
    pub(super) async fn send_quiet(&mut self, commands: &[u8]) -> io::Result<()> {
        self.io.write_all(commands).await?;
        self.io.write_all(b"mn\r\n").await?;
        self.io.flush().await?;
        self.pending += 1;
        Ok(())
    }

    async fn line(&mut self) -> io::Result<String> {
        while self.pending > 0 {
            if self.raw_line().await? == b"MN" {
                self.pending -= 1;
            }
        }
        let buf = self.raw_line().await?;
        let line = String::from_utf8(buf).map_err(|_| protocol("a reply line is not text"))?;
        if line == "ERROR" {
            return Err(protocol(
                "the server does not know the meta protocol (memcached 1.6 or later is needed)",
            ));
        }
        if let Some(msg) = line
            .strip_prefix("CLIENT_ERROR ")
            .or_else(|| line.strip_prefix("SERVER_ERROR "))
        {
            return Err(io::Error::other(format!("the server answered: {msg}")));
        }
        Ok(line)
    }

    /// One reply line, without its `\r\n`.
    async fn raw_line(&mut self) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        let n = (&mut self.io)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut buf)
            .await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        if !buf.ends_with(b"\r\n") {
            return Err(protocol("a reply line too long or cut short"));
        }
        buf.truncate(buf.len() - 2);
        Ok(buf)
    }

    /// The server's version (`version`).
    pub(super) async fn version(&mut self) -> io::Result<String> {
        self.send(b"version", None).await?;
        let line = self.line().await?;
        line.strip_prefix("VERSION ")
            .map(str::to_owned)
            .ok_or_else(|| {
                // The first exchange on a connection: a server that answers otherwise is not
                // a Memcached (a Redis answers `-ERR unknown command`).
                protocol(format!(
                    "the server does not speak the Memcached protocol (it answered {:?} to \
                     `version`: is a Memcached server at this address?)",
                    line.chars().take(60).collect::<String>()
                ))
            })
    }

    /// `stats <group>` (`settings`): its `STAT <name> <value>` lines, up to `END`.
    pub(super) async fn stats(&mut self, group: &str) -> io::Result<Vec<(String, String)>> {
        self.send(format!("stats {group}").as_bytes(), None).await?;
        let mut out = Vec::new();
        // A bound on a reply that never ends (settings are about a hundred lines).
        for _ in 0..10_000 {
            let line = self.line().await?;
            if line == "END" {
                return Ok(out);
            }
            let stat = line
                .strip_prefix("STAT ")
                .ok_or_else(|| protocol(format!("unexpected line in stats: {line:.60}")))?;
            let (name, value) = stat.split_once(' ').unwrap_or((stat, ""));
            out.push((name.to_owned(), value.to_owned()));
        }
        Err(protocol("stats did not end"))
    }

    /// `mg <key> v c t`: the entry, or `None` (`EN`).
    pub(super) async fn get(&mut self, key: &str) -> io::Result<Option<Entry>> {
        self.send(format!("mg {key} v c t").as_bytes(), None)
            .await?;
        self.entry().await
    }

    /// `mg <key> v c t` for each key, pipelined (in batches of 100, one round trip each): the
    /// entries in the keys' order.
    pub(super) async fn get_many(&mut self, keys: &[String]) -> io::Result<Vec<Option<Entry>>> {
        let mut out = Vec::with_capacity(keys.len());
        for batch in keys.chunks(100) {
            for key in batch {
                self.io
                    .write_all(format!("mg {key} v c t\r\n").as_bytes())
                    .await?;
            }
            self.io.flush().await?;
            for _ in batch {
                out.push(self.entry().await?);
            }
        }
        Ok(out)
    }

    /// The reply to one `mg … v c t`.
    async fn entry(&mut self) -> io::Result<Option<Entry>> {
        let line = self.line().await?;
        if line == "EN" {
            return Ok(None);
        }
        let mut words = line.split(' ');
        if words.next() != Some("VA") {
            return Err(protocol(format!("unexpected reply to mg: {line:.60}")));
        }
        let len: usize = words
            .next()
            .and_then(|w| w.parse().ok())
            .filter(|n| *n <= MAX_VALUE)
            .ok_or_else(|| protocol("a bad value length"))?;
        let (mut cas, mut ttl) = (None, None);
        for flag in words {
            if let Some(c) = flag.strip_prefix('c') {
                cas = c.parse::<u64>().ok();
            } else if let Some(t) = flag.strip_prefix('t') {
                ttl = Some(t.parse::<i64>().map_err(|_| protocol("a bad ttl"))?);
            }
        }
        let mut value = vec![0; len + 2];
        self.io.read_exact(&mut value).await?;
        if !value.ends_with(b"\r\n") {
            return Err(protocol("a value without its line end"));
        }
        value.truncate(len);
        Ok(Some(Entry {
            value,
            cas: cas.ok_or_else(|| protocol("mg returned no CAS"))?,
            ttl: ttl.and_then(|t| u64::try_from(t).ok()),
        }))
    }

    /// `ms <key> <len> T<ttl> F0 ME`: stores `value` only if the key does not exist.
    pub(super) async fn add(&mut self, key: &str, value: &[u8], ttl: u64) -> io::Result<Stored> {
        let line = format!("ms {key} {} T{ttl} F0 ME", value.len());
        self.send(line.as_bytes(), Some(value)).await?;
        self.stored("ms").await
    }

    /// `ms <key> <len> T<ttl> F0 C<cas>`: replaces the entry only while its CAS is `cas`.
    pub(super) async fn replace_if(
        &mut self,
        key: &str,
        value: &[u8],
        ttl: u64,
        cas: u64,
    ) -> io::Result<Stored> {
        let line = format!("ms {key} {} T{ttl} F0 C{cas}", value.len());
        self.send(line.as_bytes(), Some(value)).await?;
        self.stored("ms").await
    }

    /// `md <key> C<cas>`: deletes the entry only while its CAS is `cas`.
    pub(super) async fn delete_if(&mut self, key: &str, cas: u64) -> io::Result<Stored> {
        self.send(format!("md {key} C{cas}").as_bytes(), None)
            .await?;
        self.stored("md").await
    }

    async fn stored(&mut self, what: &str) -> io::Result<Stored> {
        let line = self.line().await?;
        Ok(match line.split(' ').next() {
            Some("HD") => Stored::Done,
            Some("NS") => Stored::Exists,
            Some("EX") => Stored::Changed,
            Some("NF") => Stored::Missing,
            _ => return Err(protocol(format!("unexpected reply to {what}: {line:.60}"))),
        })
    }
}

/// Idle connections to one server.
pub(super) struct Pool {
    config: MemcachedConfig,
    idle: std::sync::Mutex<Vec<Conn>>,
    /// The server's version was checked (meta protocol present).
    checked: std::sync::atomic::AtomicBool,
}

impl Pool {
    pub(super) fn new(config: MemcachedConfig) -> Pool {
        Pool {
            config,
            idle: std::sync::Mutex::new(Vec::new()),
            checked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(super) fn timeout(&self) -> Duration {
        self.config.timeout
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        lock(&self.idle)
    }

    /// An idle connection (`reused` true) or a new one; the first new one checks the server's
    /// version. `fresh` asks for a new one.
    pub(super) async fn get(&self, fresh: bool) -> io::Result<(Conn, bool)> {
        if !fresh && let Some(conn) = self.idle().pop() {
            return Ok((conn, true));
        }
        let mut conn =
            tokio::time::timeout(self.config.connect_timeout, Conn::connect(&self.config))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no connection within {:?}", self.config.connect_timeout),
                    )
                })??;
        if !self.checked.load(std::sync::atomic::Ordering::Acquire) {
            let version = tokio::time::timeout(self.config.timeout, conn.version())
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to version"))??;
            check_version(&version)?;
            self.checked
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok((conn, false))
    }

    /// Gives a connection whose last request completed back for reuse.
    pub(super) fn put(&self, conn: Conn) {
        let mut idle = self.idle();
        if idle.len() < IDLE {
            idle.push(conn);
        }
    }

    /// Drops the idle connections (after one of them was found closed by the server, the
    /// others were too: a restart).
    pub(super) fn close(&self) {
        self.idle().clear();
    }
}

/// Refuses a server older than 1.6 (no meta protocol), naming its version.
fn check_version(version: &str) -> io::Result<()> {
    let mut parts = version.split(['.', '-', ' ']);
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if (major, minor) < (1, 6) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "memcached {version:.40} has no meta protocol; this store needs 1.6 or later \
                 (its release deletes a lock only if it is still the holder's)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_version;

    #[test]
    fn old_servers_are_refused_by_version() {
        assert!(check_version("1.6.18").is_ok());
        assert!(check_version("1.10.0").is_ok());
        assert!(check_version("2.0").is_ok());
        let err = check_version("1.5.22").unwrap_err().to_string();
        assert!(err.contains("1.5.22") && err.contains("1.6"), "{err}");
    }
}
