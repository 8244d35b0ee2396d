use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A loopback TCP proxy in front of a server, to stall, slow or cut the connections
/// of the clients that go through it.
pub struct TcpProxy {
    port: u16,
    state: watch::Sender<Flow>,
    accepting: JoinHandle<()>,
    accepted: Arc<AtomicU64>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Flow {
    /// Bytes are held back, in both directions, until the proxy resumes.
    stalled: bool,
    /// Bytes from the server are held back until the proxy resumes.
    answers_stalled: bool,
    /// Answers are stalled as soon as a request holding these bytes goes through.
    stall_answers_after: Option<&'static [u8]>,
    /// How long each read from the server is held back before it is passed on.
    answer_delay: Duration,
    /// How many times every open connection was cut; a connection made after the
    /// n-th cut survives until the next.
    cuts: u64,
    /// How many times every open connection went silent, as `cuts` counts.
    silences: u64,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:<target_port>`.
    pub async fn start(target_port: u16) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (state, _) = watch::channel(Flow::default());
        let flows = state.clone();
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        let accepting = relay(listener, target_port, move |to_server, to_client| {
            counted.fetch_add(1, Ordering::Relaxed);
            let requests = flows.clone();
            let seen = move |request: &[u8]| {
                requests.send_if_modified(|flow| {
                    let Some(part) = flow.stall_answers_after else {
                        return false;
                    };
                    let found = request.windows(part.len()).any(|window| window == part);
                    if found {
                        (flow.answers_stalled, flow.stall_answers_after) = (true, None);
                    }
                    found
                });
            };
            tokio::spawn(pipe(
                to_server,
                flows.subscribe(),
                seen,
                |flow| flow.stalled,
                |_| Duration::ZERO,
            ));
            tokio::spawn(pipe(
                to_client,
                flows.subscribe(),
                |_| {},
                |flow| flow.stalled || flow.answers_stalled,
                |flow| flow.answer_delay,
            ));
        });
        TcpProxy {
            port,
            state,
            accepting,
            accepted,
        }
    }

    /// How many connections clients made through the proxy so far.
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Holds back every byte until [`resume`](Self::resume): the connection stays
    /// open but nothing gets through, as in a network partition.
    pub fn stall(&self) {
        self.state.send_modify(|flow| flow.stalled = true);
    }

    /// Holds back every answer until [`resume`](Self::resume): requests reach the
    /// server and run, and their answers wait.
    pub fn stall_answers(&self) {
        self.state.send_modify(|flow| flow.answers_stalled = true);
    }

    /// Lets requests through until one holds `request_part`, then holds back every
    /// answer, that request's first, as [`stall_answers`](Self::stall_answers) does.
    pub fn stall_answers_after(&self, request_part: &'static str) {
        self.state
            .send_modify(|flow| flow.stall_answers_after = Some(request_part.as_bytes()));
    }

    /// Passes every answer on `delay` after it came, as over a slow link, until
    /// [`resume`](Self::resume).
    pub fn delay_answers(&self, delay: Duration) {
        self.state.send_modify(|flow| flow.answer_delay = delay);
    }

    /// Ends every stall and delay; cut and silenced connections stay so.
    pub fn resume(&self) {
        self.state.send_modify(|flow| {
            *flow = Flow {
                cuts: flow.cuts,
                silences: flow.silences,
                ..Flow::default()
            }
        });
    }

    /// Closes every connection made so far.
    pub fn cut(&self) {
        self.state.send_modify(|flow| flow.cuts += 1);
    }

    /// Lets nothing more through, either way, on any connection made so far, and
    /// leaves them open: as a firewall that dropped the flows, or a peer gone without
    /// a word. Connections made after it work.
    pub fn silence(&self) {
        self.state.send_modify(|flow| flow.silences += 1);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accepting.abort();
        self.cut();
    }
}

/// One direction of a proxied connection: what to read, and where to write it.
pub(crate) type Direction = (OwnedReadHalf, OwnedWriteHalf);

/// Accepts connections on `listener`, connects each to `127.0.0.1:<target_port>`, and
/// hands `forward` the client-to-server and server-to-client directions.
pub(crate) fn relay(
    listener: TcpListener,
    target_port: u16,
    mut forward: impl FnMut(Direction, Direction) + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)).await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            forward((client_read, server_write), (server_read, client_write));
        }
    })
}

/// Forwards what `from` reads to `to`, showing each read to `seen` first, and
/// passing it on `delay` after it came.
async fn pipe(
    (mut from, mut to): Direction,
    mut flow: watch::Receiver<Flow>,
    seen: impl Fn(&[u8]),
    held_back: impl Fn(Flow) -> bool,
    delay: impl Fn(Flow) -> Duration,
) {
    let born = *flow.borrow_and_update();
    let is_cut = |state: Flow| state.cuts > born.cuts;
    let is_silenced = |state: Flow| state.silences > born.silences;
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = flow.changed() => {
                if is_cut(*flow.borrow()) {
                    return;
                }
                continue;
            }
        };
        let Ok(n @ 1..) = read else { return };
        let due = Instant::now() + delay(*flow.borrow());
        seen(&buffer[..n]);
        loop {
            let state = *flow.borrow_and_update();
            if is_cut(state) {
                return;
            }
            if !held_back(state) && !is_silenced(state) {
                break;
            }
            if flow.changed().await.is_err() {
                return;
            }
        }
        tokio::time::sleep_until(due).await;
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
