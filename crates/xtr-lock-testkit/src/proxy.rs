//! What every test proxy shares: listen on a free port of 127.0.0.1, and for each client
//! connect to the target port and hand both streams to the proxy's own forwarding.

use std::net::{TcpListener, TcpStream};
use std::thread;

/// One proxied connection, each side twice (one stream to read, one to write: forwarding runs
/// a thread per direction).
#[derive(Debug)]
pub struct Link {
    /// Its number, from 0, in the order clients came.
    pub n: usize,
    /// The client's side, to read what it sends.
    pub client_r: TcpStream,
    /// The client's side, to write what the server answers.
    pub client_w: TcpStream,
    /// The server's side, to read its answers.
    pub server_r: TcpStream,
    /// The server's side, to write what the client sends.
    pub server_w: TcpStream,
}

/// Binds a free port of 127.0.0.1 and serves it on a thread of its own with [`serve`] until
/// the test process ends; returns the port.
pub fn start(target: u16, link: impl FnMut(Link) + Send + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("a bound port").port();
    thread::spawn(move || serve(&listener, target, link));
    port
}

/// Accepts clients on `listener` for ever: each is connected to `127.0.0.1:target` (Nagle off
/// on both sides) and handed to `link`, which must not block (it starts the threads that
/// forward). A client whose server connection fails is dropped.
pub fn serve(listener: &TcpListener, target: u16, mut link: impl FnMut(Link)) -> ! {
    let mut n = 0;
    loop {
        let Ok((client, _)) = listener.accept() else {
            continue;
        };
        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(client_r), Ok(server_r)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        link(Link {
            n,
            client_r,
            client_w: client,
            server_r,
            server_w: server,
        });
        n += 1;
    }
}
