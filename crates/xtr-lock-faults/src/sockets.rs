//! Which TCP connections a process has open, from `/proc`: how a fault finds the database
//! sessions of one holder.

use std::collections::HashSet;

/// The local ports of the TCP connections of process `pid` to `127.0.0.1:<server>`.
pub(crate) fn client_ports(pid: u32, server: u16) -> Vec<u16> {
    let inodes: HashSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| {
            let link = std::fs::read_link(fd.path()).ok()?;
            let link = link.to_str()?;
            link.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(inode)) =
                (fields.get(1), fields.get(2), fields.get(9))
            else {
                continue;
            };
            if inode.parse().is_ok_and(|i: u64| inodes.contains(&i))
                && port(remote) == Some(server)
                && let Some(p) = port(local)
            {
                ports.push(p);
            }
        }
    }
    ports
}

/// The port of `/proc/net/tcp`'s `ADDR:PORT` (hex).
fn port(addr: &str) -> Option<u16> {
    u16::from_str_radix(addr.rsplit_once(':')?.1, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_its_own_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", server)).unwrap();
        let mine = client.local_addr().unwrap().port();
        assert_eq!(client_ports(std::process::id(), server), [mine]);
    }
}
