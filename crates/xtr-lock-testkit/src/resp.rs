//! A minimal RESP2 client for the testkit's own probes of the Redis servers it starts: one
//! request per connection, bounded by timeouts, so a paused or dead server makes a probe fail
//! at once instead of hanging the test (as `redis-cli` would, having no read timeout).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a probe waits to connect, and then for each read.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One reply, as RESP2 gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// A status, bulk string or integer as text; `Err` for an error reply or anything else.
    pub(crate) fn into_text(self) -> Result<String, String> {
        match self {
            Reply::Status(s) => Ok(s),
            Reply::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Reply::Int(i) => Ok(i.to_string()),
            Reply::Error(e) => Err(e),
            other => Err(format!("not a text reply: {other:?}")),
        }
    }

    /// The items of an array reply; `Err` for anything else.
    pub(crate) fn into_array(self) -> Result<Vec<Reply>, String> {
        match self {
            Reply::Array(Some(items)) => Ok(items),
            Reply::Error(e) => Err(e),
            other => Err(format!("not an array reply: {other:?}")),
        }
    }
}

/// Sends `args` as one command to 127.0.0.1:`port` and reads its reply. `Err` (saying which
/// port) when the server cannot be reached or does not answer in time; an error reply is
/// `Ok(Reply::Error)`.
pub(crate) fn call(port: u16, args: &[&[u8]]) -> Result<Reply, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let fail = |e: std::io::Error| format!("127.0.0.1:{port}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).map_err(fail)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT)).map_err(fail)?;
    stream
        .set_write_timeout(Some(PROBE_TIMEOUT))
        .map_err(fail)?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg);
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request).map_err(fail)?;
    read_reply(&mut BufReader::new(stream)).map_err(fail)
}

/// [`call`] with text arguments, the reply as text (see [`Reply::into_text`]); an error reply
/// is `Err` too, prefixed with the port.
pub(crate) fn text(port: u16, args: &[&str]) -> Result<String, String> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    call(port, &args)?
        .into_text()
        .map_err(|e| format!("127.0.0.1:{port}: {e}"))
}

/// A field of an `INFO` or `CLUSTER INFO` text (`name:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn read_reply(r: &mut BufReader<TcpStream>) -> std::io::Result<Reply> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(bad("connection closed before a reply"));
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line
        .split_at_checked(1)
        .ok_or_else(|| bad("an empty line"))?;
    let number = || rest.parse::<i64>().map_err(|_| bad("a bad length"));
    Ok(match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(number()?),
        "$" => match usize::try_from(number()?) {
            Err(_) => Reply::Bulk(None),
            Ok(len) => {
                let mut buf = vec![0; len + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(len);
                Reply::Bulk(Some(buf))
            }
        },
        "*" => match usize::try_from(number()?) {
            Err(_) => Reply::Array(None),
            Ok(len) => Reply::Array(Some(
                (0..len)
                    .map(|_| read_reply(r))
                    .collect::<std::io::Result<_>>()?,
            )),
        },
        _ => return Err(bad("an unknown reply type")),
    })
}
