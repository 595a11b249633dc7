//! A TCP proxy that hands every chunk a client sends to a hook before it forwards it: to act
//! between two requests (change what the server holds), or to hold one request back while the
//! client gives up on it, so that it lands late.
//!
//! It listens on a free port of 127.0.0.1 and forwards every connection to a target port. The
//! hook runs on the connection's own thread: sleeping in it delays that chunk and everything
//! the client sends after it on that connection (a TCP stream stays in order), never another
//! connection. Replies go straight through. The proxy serves until the test process ends.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::proxy::{self, Link};

/// Starts a proxy to `127.0.0.1:target` that calls `hook(n, chunk)` before it forwards each
/// chunk a client sends on its `n`th connection (from 0); returns the proxy's port.
pub fn start<H>(target: u16, hook: H) -> u16
where
    H: Fn(usize, &[u8]) + Send + Sync + 'static,
{
    let hook = Arc::new(hook);
    proxy::start(target, move |link| {
        let Link {
            n,
            mut client_r,
            mut client_w,
            mut server_r,
            mut server_w,
        } = link;
        thread::spawn(move || {
            let _ = std::io::copy(&mut server_r, &mut client_w);
            let _ = client_w.shutdown(Shutdown::Write);
        });
        let hook = hook.clone();
        thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let read = match client_r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => k,
                };
                hook(n, &buf[..read]);
                if server_w.write_all(&buf[..read]).is_err() {
                    break;
                }
            }
            let _ = server_w.shutdown(Shutdown::Write);
        });
    })
}

/// One request held back: the first chunk `matches(n, chunk)` picks (`n`: the connection's
/// number, from 0) is forwarded `delay` after it arrived; every other chunk goes straight through (those after it on the same connection
/// wait behind it). Tells when the held chunk arrived and when it was forwarded.
#[derive(Debug, Clone)]
pub struct HeldRequest {
    armed: Arc<AtomicBool>,
    times: Arc<Mutex<(Option<Instant>, Option<Instant>)>>,
}

impl HeldRequest {
    /// Starts a proxy to `127.0.0.1:target` holding back the first chunk for which
    /// `matches(n, chunk)` is true by `delay`; returns the proxy's port and the handle.
    pub fn start(
        target: u16,
        delay: Duration,
        matches: impl Fn(usize, &[u8]) -> bool + Send + Sync + 'static,
    ) -> (u16, HeldRequest) {
        let held = HeldRequest {
            armed: Arc::new(AtomicBool::new(true)),
            times: Arc::new(Mutex::new((None, None))),
        };
        let h = held.clone();
        let port = start(target, move |n, chunk| {
            if !h.armed.load(Ordering::SeqCst) || !matches(n, chunk) {
                return;
            }
            if h.armed.swap(false, Ordering::SeqCst) {
                h.times.lock().unwrap().0 = Some(Instant::now());
                thread::sleep(delay);
                h.times.lock().unwrap().1 = Some(Instant::now());
            }
        });
        (port, held)
    }

    /// When the held chunk reached the proxy, if it did.
    pub fn arrived(&self) -> Option<Instant> {
        self.times.lock().unwrap().0
    }

    /// When the held chunk was forwarded to the server, if it was.
    pub fn landed(&self) -> Option<Instant> {
        self.times.lock().unwrap().1
    }

    /// Waits (blocking the thread, up to `limit`) until the held chunk was forwarded; panics
    /// if it never was.
    pub fn wait_landed(&self, limit: Duration) -> Instant {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(at) = self.landed() {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "the held request was not forwarded within {limit:?} (arrived: {:?})",
                self.arrived()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A partition between the proxy's clients and the server: while frozen, nothing a client
/// sends reaches the server, on any connection (new ones included: they are accepted, and
/// then hang); what the server already sent still arrives. No RST, no FIN: the clients see a
/// peer that has gone silent, as behind a dead link.
#[derive(Debug, Clone)]
pub struct Freezer {
    frozen: Arc<AtomicBool>,
}

impl Freezer {
    /// Starts a proxy to `127.0.0.1:target`, not frozen; returns its port and the switch.
    pub fn start(target: u16) -> (u16, Freezer) {
        let freezer = Freezer {
            frozen: Arc::new(AtomicBool::new(false)),
        };
        let frozen = freezer.frozen.clone();
        let port = start(target, move |_, _| {
            while frozen.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(5));
            }
        });
        (port, freezer)
    }

    /// Cuts the clients off.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Lets what waited through, and everything after it.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

/// A request that lands and whose answer is lost: the first chunk a client sends for which
/// `matches(n, chunk)` is true is forwarded to the server, and then that connection is cut
/// (both ways, with a FIN) before anything more the server sends reaches the client; every
/// other chunk and connection goes straight through. As a connection broken between a
/// statement's commit and its reply: the client cannot tell whether the request was done.
#[derive(Debug, Clone)]
pub struct LostAnswer {
    cut: Arc<Mutex<Option<Instant>>>,
}

impl LostAnswer {
    /// Starts a proxy to `127.0.0.1:target` that loses the answer to the first chunk that
    /// `matches`; returns the proxy's port and the handle.
    pub fn start(
        target: u16,
        matches: impl Fn(usize, &[u8]) -> bool + Send + Sync + 'static,
    ) -> (u16, LostAnswer) {
        let lost = LostAnswer {
            cut: Arc::new(Mutex::new(None)),
        };
        let (armed, matches, handle) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(matches),
            lost.clone(),
        );
        let port = proxy::start(target, move |link| {
            // Set before the chunk goes out: the answer to it is never forwarded.
            let cutting = Arc::new(AtomicBool::new(false));
            let c = cutting.clone();
            let (server_r, client_w) = (link.server_r, link.client_w);
            thread::spawn(move || answers(server_r, client_w, &c));
            let (armed, matches, handle) = (armed.clone(), matches.clone(), handle.clone());
            let (n, client_r, server_w) = (link.n, link.client_r, link.server_w);
            thread::spawn(move || {
                requests(n, client_r, server_w, &cutting, |n, chunk| {
                    let picked = matches(n, chunk) && armed.swap(false, Ordering::SeqCst);
                    if picked {
                        *handle.cut.lock().unwrap() = Some(Instant::now());
                    }
                    picked
                });
            });
        });
        (port, lost)
    }

    /// When the request whose answer is lost went to the server, if one did (its connection is
    /// cut 300 ms later).
    pub fn cut_at(&self) -> Option<Instant> {
        *self.cut.lock().unwrap()
    }
}

/// Forwards a client's chunks until `pick` picks one: that one is forwarded, and once the server
/// had time to act on it, both sides of the connection are shut down.
fn requests(
    n: usize,
    mut client: TcpStream,
    mut server: TcpStream,
    cutting: &AtomicBool,
    pick: impl Fn(usize, &[u8]) -> bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => k,
        };
        let picked = pick(n, &buf[..read]);
        if picked {
            cutting.store(true, Ordering::SeqCst);
        }
        if server.write_all(&buf[..read]).is_err() {
            break;
        }
        if picked {
            thread::sleep(Duration::from_millis(300));
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = server.shutdown(Shutdown::Write);
}

/// Forwards the server's answers to the client until the connection is being cut.
fn answers(mut server: TcpStream, mut client: TcpStream, cutting: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => k,
        };
        if cutting.load(Ordering::SeqCst) || client.write_all(&buf[..read]).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Write);
}
