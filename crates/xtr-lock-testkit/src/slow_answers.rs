//! A TCP proxy that makes some of the server's messages reach one connection late, as when
//! the client's reader resumes late on a busy machine: what the server sent is in the socket,
//! unread.
//!
//! It listens on a free port of 127.0.0.1 and forwards every connection to a target port.
//! Once a client sent a chunk that `picks` picks, every chunk the server sends that connection
//! and `delays` picks is forwarded `delay` after it arrived; the others go straight through,
//! unless one is still waiting ahead of them (a TCP stream stays in order). The proxy serves
//! until the test process ends.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::proxy;

/// Which chunks a rule picks.
pub type Pick = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// Starts the proxy to `127.0.0.1:target`; returns its port.
pub fn start(target: u16, picks: Pick, delays: Pick, delay: Duration) -> u16 {
    proxy::start(target, move |link| {
        let picked = Arc::new(AtomicBool::new(false));
        let (p, picks) = (picked.clone(), picks.clone());
        let (client_r, server_w) = (link.client_r, link.server_w);
        thread::spawn(move || requests(client_r, server_w, &picks, &p));
        let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
        let (delays, server_r) = (delays.clone(), link.server_r);
        thread::spawn(move || answers(server_r, &tx, &picked, &delays, delay));
        let client_w = link.client_w;
        thread::spawn(move || deliver(client_w, &rx));
    })
}

/// Forwards what the client sends; marks the connection once `picks` picks a chunk.
fn requests(mut client: TcpStream, mut server: TcpStream, picks: &Pick, picked: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => k,
        };
        if picks(&buf[..read]) {
            picked.store(true, Ordering::SeqCst);
        }
        if server.write_all(&buf[..read]).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Write);
}

/// Reads what the server sends and queues each chunk with the time it is due.
fn answers(
    mut server: TcpStream,
    queue: &mpsc::Sender<(Instant, Vec<u8>)>,
    picked: &AtomicBool,
    delays: &Pick,
    delay: Duration,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_due = Instant::now();
    loop {
        let read = match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => k,
        };
        let chunk = buf[..read].to_vec();
        let own = if picked.load(Ordering::SeqCst) && delays(&chunk) {
            delay
        } else {
            Duration::ZERO
        };
        last_due = last_due.max(Instant::now() + own);
        if queue.send((last_due, chunk)).is_err() {
            break;
        }
    }
}

/// Writes each queued chunk to the client when it is due, in order.
fn deliver(mut client: TcpStream, queue: &mpsc::Receiver<(Instant, Vec<u8>)>) {
    for (due, chunk) in queue {
        thread::sleep(due.saturating_duration_since(Instant::now()));
        if client.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Write);
}
