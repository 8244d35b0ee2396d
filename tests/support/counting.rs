use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::task::JoinHandle;

use crate::proxy::relay;

/// A loopback TCP proxy in front of a Redis server that counts the top-level
/// commands clients send through it, by name. Commands run inside scripts never
/// cross the wire, so unlike `INFO commandstats` they are not counted.
pub struct CountingProxy {
    port: u16,
    counts: Arc<Mutex<CommandCounts>>,
    accepting: JoinHandle<()>,
}

/// Top-level commands by upper-case name; container commands carry their
/// subcommand (`CLIENT SETINFO`, `SCRIPT LOAD`). `EVALSHA` calls are also counted
/// by the script they run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandCounts {
    by_name: BTreeMap<String, u64>,
    /// `EVALSHA` and `EVALSHA_RO` calls by the script's SHA1, in lower case.
    by_script: BTreeMap<String, u64>,
}

impl CommandCounts {
    pub fn total(&self) -> u64 {
        self.by_name.values().sum()
    }

    /// The total less the commands named in `excluded` (as in [`get`](Self::get)).
    pub fn total_excluding(&self, excluded: &[&str]) -> u64 {
        self.by_name
            .iter()
            .filter(|(name, _)| !excluded.contains(&name.as_str()))
            .map(|(_, count)| count)
            .sum()
    }

    pub fn get(&self, name: &str) -> u64 {
        self.by_name.get(name).copied().unwrap_or(0)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.by_name
            .iter()
            .map(|(name, count)| (name.as_str(), *count))
    }

    /// The server's own compare-and-deletes: `DELIFEQ` (Valkey 9) and `DELEX` (Redis
    /// 8.4).
    pub fn native_compare_and_deletes(&self) -> u64 {
        self.get("DELIFEQ") + self.get("DELEX")
    }

    /// `EVALSHA` (and `EVALSHA_RO`) calls of the script whose SHA1 is `sha1`, as
    /// `redis::Script::get_hash` gives it.
    pub fn script(&self, sha1: &str) -> u64 {
        self.by_script
            .get(&sha1.to_ascii_lowercase())
            .copied()
            .unwrap_or(0)
    }

    /// `EVALSHA` calls by the script's SHA1.
    pub fn scripts(&self) -> impl Iterator<Item = (&str, u64)> {
        self.by_script
            .iter()
            .map(|(sha1, count)| (sha1.as_str(), *count))
    }

    pub fn add(&mut self, other: &CommandCounts) {
        for (name, count) in other.iter() {
            *self.by_name.entry(name.to_owned()).or_default() += count;
        }
        for (sha1, count) in other.scripts() {
            *self.by_script.entry(sha1.to_owned()).or_default() += count;
        }
    }

    fn record(&mut self, request: Request) {
        *self.by_name.entry(request.name).or_default() += 1;
        if let Some(sha1) = request.script {
            *self.by_script.entry(sha1).or_default() += 1;
        }
    }
}

impl CountingProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:<target_port>`.
    pub async fn start(target_port: u16) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the counting proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let counts = Arc::new(Mutex::new(CommandCounts::default()));
        let counting = counts.clone();
        let mut connections: Vec<JoinHandle<()>> = Vec::new();
        let accepting = relay(listener, target_port, move |to_server, to_client| {
            connections.retain(|task| !task.is_finished());
            connections.push(tokio::spawn(count_requests(
                to_server.0,
                to_server.1,
                counting.clone(),
            )));
            connections.push(tokio::spawn(forward(to_client.0, to_client.1)));
        });
        CountingProxy {
            port,
            counts,
            accepting,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The commands counted since the last call, and starts counting from zero.
    pub fn take(&self) -> CommandCounts {
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let Ok(n @ 1..) = from.read(&mut buffer).await else {
            return;
        };
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Counts the client's requests, then passes them on: a request is counted by the
/// time its answer can come back, so counts taken right after an operation hold all
/// of its requests.
async fn count_requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    counts: Arc<Mutex<CommandCounts>>,
) {
    let mut buffer = vec![0; 16 * 1024];
    let mut parser = RequestParser::default();
    loop {
        let Ok(n @ 1..) = from.read(&mut buffer).await else {
            return;
        };
        let requests = parser.feed(&buffer[..n]);
        if !requests.is_empty() {
            let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
            for request in requests {
                counts.record(request);
            }
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Commands whose second word names what they do.
const CONTAINERS: &[&str] = &[
    "CLIENT", "SCRIPT", "CONFIG", "PUBSUB", "FUNCTION", "OBJECT", "MEMORY", "CLUSTER", "COMMAND",
];

/// Splits the client's byte stream into requests: RESP arrays of bulk strings
/// (`*N\r\n` then N times `$len\r\n<bytes>\r\n`) or inline commands (a line of
/// words). Bytes may arrive split anywhere, so unparsed bytes wait for more.
#[derive(Default)]
pub(crate) struct RequestParser {
    pending: Vec<u8>,
    /// Set once the stream stops looking like requests; nothing more is counted.
    lost: bool,
}

/// One request: its name as [`CommandCounts`] counts it, and for `EVALSHA` the
/// script's SHA1.
#[derive(Debug)]
pub(crate) struct Request {
    name: String,
    script: Option<String>,
}

enum Parsed {
    Request {
        request: Option<Request>,
        used: usize,
    },
    Incomplete,
    Garbled,
}

impl RequestParser {
    /// The requests completed by `bytes`, in order.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<Request> {
        if self.lost {
            return Vec::new();
        }
        self.pending.extend_from_slice(bytes);
        let mut requests = Vec::new();
        let mut start = 0;
        loop {
            match parse_request(&self.pending[start..]) {
                Parsed::Request { request, used } => {
                    requests.extend(request);
                    start += used;
                }
                Parsed::Incomplete => break,
                Parsed::Garbled => {
                    self.lost = true;
                    self.pending.clear();
                    return requests;
                }
            }
        }
        self.pending.drain(..start);
        requests
    }
}

fn parse_request(bytes: &[u8]) -> Parsed {
    match bytes.first() {
        None => Parsed::Incomplete,
        Some(b'*') => parse_array(bytes),
        Some(_) => parse_inline(bytes),
    }
}

fn parse_array(bytes: &[u8]) -> Parsed {
    let Some((count, mut at)) = number_line(bytes, 1) else {
        return incomplete_or_garbled(bytes);
    };
    let Ok(count) = usize::try_from(count) else {
        // `*-1`: a null array, nothing to run.
        return Parsed::Request {
            request: None,
            used: at,
        };
    };
    let mut words: Vec<&[u8]> = Vec::with_capacity(count.min(2));
    for _ in 0..count {
        match bytes.get(at) {
            None => return Parsed::Incomplete,
            Some(b'$') => {}
            Some(_) => return Parsed::Garbled,
        }
        let Some((len, body)) = number_line(bytes, at + 1) else {
            return incomplete_or_garbled(&bytes[at..]);
        };
        let Ok(len) = usize::try_from(len) else {
            return Parsed::Garbled;
        };
        let end = body + len;
        if bytes.len() < end + 2 {
            return Parsed::Incomplete;
        }
        if &bytes[end..end + 2] != b"\r\n" {
            return Parsed::Garbled;
        }
        if words.len() < 2 {
            words.push(&bytes[body..end]);
        }
        at = end + 2;
    }
    Parsed::Request {
        request: request(&words),
        used: at,
    }
}

fn parse_inline(bytes: &[u8]) -> Parsed {
    let Some(newline) = bytes.iter().position(|&b| b == b'\n') else {
        return Parsed::Incomplete;
    };
    let line = &bytes[..newline];
    let words: Vec<&[u8]> = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|word| !word.is_empty())
        .take(2)
        .collect();
    Parsed::Request {
        request: request(&words),
        used: newline + 1,
    }
}

/// The number on the line starting at `from`, and where the next line starts.
fn number_line(bytes: &[u8], from: usize) -> Option<(i64, usize)> {
    let rest = bytes.get(from..)?;
    let end = rest.windows(2).position(|pair| pair == b"\r\n")?;
    let number = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some((number, from + end + 2))
}

/// A header line still arriving is incomplete; a full one that is not a number is
/// garbage.
fn incomplete_or_garbled(bytes: &[u8]) -> Parsed {
    if bytes.windows(2).any(|pair| pair == b"\r\n") {
        Parsed::Garbled
    } else {
        Parsed::Incomplete
    }
}

/// From a request's first two words.
fn request(words: &[&[u8]]) -> Option<Request> {
    let first = String::from_utf8_lossy(words.first()?).to_ascii_uppercase();
    let second = words.get(1).map(|word| String::from_utf8_lossy(word));
    Some(match second {
        Some(second) if CONTAINERS.contains(&first.as_str()) => Request {
            name: format!("{first} {}", second.to_ascii_uppercase()),
            script: None,
        },
        Some(sha1) if first == "EVALSHA" || first == "EVALSHA_RO" => Request {
            name: first,
            script: Some(sha1.to_ascii_lowercase()),
        },
        _ => Request {
            name: first,
            script: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::{CommandCounts, RequestParser};

    #[test]
    fn counts_arrays_split_anywhere_and_inline_commands() {
        let stream: &[u8] = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n\
            *2\r\n$6\r\nclient\r\n$7\r\nsetinfo\r\nPING\r\n\r\n*1\r\n$4\r\nEXEC\r\n";
        for split in 0..stream.len() {
            let mut parser = RequestParser::default();
            let mut requests = parser.feed(&stream[..split]);
            requests.extend(parser.feed(&stream[split..]));
            let names: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
            assert_eq!(
                names,
                ["SET", "CLIENT SETINFO", "PING", "EXEC"],
                "split at {split}"
            );
        }
    }

    #[test]
    fn counts_evalsha_by_script() {
        let mut parser = RequestParser::default();
        let mut counts = CommandCounts::default();
        let stream: &[u8] = b"*3\r\n$7\r\nevalsha\r\n$3\r\nABC\r\n$1\r\n0\r\n\
            EVALSHA abc 0\r\n*3\r\n$7\r\nEVALSHA\r\n$3\r\ndef\r\n$1\r\n0\r\n\
            *3\r\n$4\r\nEVAL\r\n$3\r\nabc\r\n$1\r\n0\r\n";
        for request in parser.feed(stream) {
            counts.record(request);
        }
        assert_eq!((counts.get("EVALSHA"), counts.get("EVAL")), (3, 1));
        assert_eq!((counts.script("abc"), counts.script("ABC")), (2, 2));
        assert_eq!((counts.script("def"), counts.script("0")), (1, 0));
    }

    #[test]
    fn stops_counting_on_garbage() {
        let mut parser = RequestParser::default();
        assert!(parser.feed(b"*x\r\n*1\r\n$4\r\nPING\r\n").is_empty());
        assert!(parser.feed(b"*1\r\n$4\r\nPING\r\n").is_empty());
    }
}
