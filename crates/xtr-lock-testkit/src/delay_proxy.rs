//! A TCP proxy that delays every chunk of bytes, in both directions, by a random one-way delay:
//! network latency and jitter for benchmarks on one machine, where `tc netem` is not available.
//!
//! It listens on a free port of 127.0.0.1 and forwards every connection to a target port. Each
//! chunk read is written out no earlier than its arrival plus a delay drawn uniformly from
//! `[min, max]`, and never before the chunk ahead of it (a TCP stream stays in order, as on a
//! real network). Blocking threads and `std::thread::sleep` keep the delays at microsecond
//! precision (tokio's timer has millisecond granularity).
//!
//! [`serve_freezable`] adds a [`Freeze`] switch: a network partition without a reset. While
//! frozen, the proxy forwards nothing in either direction (it keeps reading and holds what it
//! read); thawed, it delivers what it held, in order, as TCP does once a partition heals.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use rand::Rng as _;

use crate::proxy;

/// Serves forever on `listener`, forwarding to `127.0.0.1:target` with one-way delays uniform
/// in `[min, max]`.
pub fn serve(listener: TcpListener, target: u16, min: Duration, max: Duration) -> ! {
    serve_freezable(listener, target, min, max, Freeze::default())
}

/// The switch of a freezable proxy; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Freeze(Arc<AtomicBool>);

impl Freeze {
    /// From now on nothing is forwarded, in either direction, on any connection (new ones
    /// included); connections stay open.
    pub fn freeze(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Forwards again, what was held first.
    pub fn thaw(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    fn wait_thawed(&self) {
        while self.0.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Like [`serve`], frozen and thawed by `freeze`.
pub fn serve_freezable(
    listener: TcpListener,
    target: u16,
    min: Duration,
    max: Duration,
    freeze: Freeze,
) -> ! {
    assert!(min <= max, "the shortest delay must not exceed the longest");
    proxy::serve(&listener, target, |link| {
        pump(link.client_r, link.server_w, min, max, freeze.clone());
        pump(link.server_r, link.client_w, min, max, freeze.clone());
    })
}

/// Forwards `from` to `to`, each chunk delayed: one thread reads, one writes on time.
fn pump(mut from: TcpStream, mut to: TcpStream, min: Duration, max: Duration, freeze: Freeze) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut rng = rand::rng();
        let mut last = Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let at = (Instant::now() + rng.random_range(min..=max)).max(last);
            last = at;
            if tx.send((at, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    thread::spawn(move || {
        for (at, chunk) in rx {
            let now = Instant::now();
            if at > now {
                thread::sleep(at - now);
            }
            freeze.wait_thawed();
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        freeze.wait_thawed();
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frozen proxy forwards nothing and keeps the connection; thawed, it delivers what it
    /// held.
    #[test]
    fn a_frozen_proxy_holds_and_a_thawed_one_delivers() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap().port();
        thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = s.read(&mut buf) {
                s.write_all(&buf[..n]).unwrap();
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let freeze = Freeze::default();
        let switch = freeze.clone();
        thread::spawn(move || {
            serve_freezable(listener, target, Duration::ZERO, Duration::ZERO, switch)
        });
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0u8; 5];
        client.write_all(b"hello").unwrap();
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        freeze.freeze();
        client.write_all(b"again").unwrap();
        assert!(
            client.read(&mut buf).is_err(),
            "nothing passes while frozen"
        );
        freeze.thaw();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"again");
    }
}
