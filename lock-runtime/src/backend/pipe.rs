//! Our own pipelined connection to one server, over TCP or a Unix socket, for the
//! lock's requests. redis-rs' multiplexed connection hands every request to a task
//! of its own through a channel, in a buffer of its own, and parses every answer
//! with a general parser: that was half the client's work on the everyday acquire
//! and release. Here a request is written in place into the connection's buffer,
//! and onto the socket at once by its caller when no answer is due; one task reads
//! the answers, which come in the order sent, and writes what queued behind them:
//! woken by the first request to queue, it writes all that queued by the time it
//! runs in one write. The tasks that answers woke send theirs a few to a write, and
//! it sends the rest once they have run. So Redis has the next requests before it
//! is done with these, and reads many at a time when busy.
//!
//! It speaks RESP2 and carries no pushes: TLS and subscribers stay on redis-rs'.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use redis::io::tcp::TcpSettings;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, tcp};
#[cfg(unix)]
use tokio::net::{UnixStream, unix};
use tokio::sync::oneshot;

/// The most requests of tasks woken by one read that wait for each other, to go out
/// in one write.
const BATCH: usize = 4;

/// A handle on the connection; the connection closes with its last handle.
#[derive(Clone)]
pub(crate) struct Pipe {
    handle: Arc<Handle>,
    db: i64,
}

struct Handle(Arc<Shared>);

struct Shared {
    state: Mutex<State>,
}

struct State {
    /// The socket's sending side: callers write on it, the driver reads the other.
    writer: Writer,
    /// Requests not yet on the socket, in the order they were made.
    unsent: Vec<u8>,
    /// Who waits for the next answers, in the order their requests were sent.
    waiting: VecDeque<Waiter>,
    /// Why the connection can no longer be used, once it cannot.
    broken: Option<(io::ErrorKind, String)>,
    /// The task that reads and writes what queued up, to wake when a caller leaves
    /// some of its request unsent.
    driver: Option<Waker>,
    /// How many requests the driver lets the tasks its answers woke queue before
    /// they go out together; none while it does not.
    settling: usize,
    /// How many requests `unsent` holds, whole or in part.
    unsent_requests: usize,
}

enum Waiter {
    One(oneshot::Sender<RedisResult<Value>>),
    /// A pipeline's answers: the first `skip` are dropped, and `left` more are due.
    Many {
        skip: usize,
        left: usize,
        answers: Vec<Value>,
        reply: oneshot::Sender<RedisResult<Vec<Value>>>,
    },
}

enum Writer {
    Tcp(tcp::OwnedWriteHalf),
    #[cfg(unix)]
    Unix(unix::OwnedWriteHalf),
}

enum Reader {
    Tcp(tcp::OwnedReadHalf),
    #[cfg(unix)]
    Unix(unix::OwnedReadHalf),
}

impl Pipe {
    /// Whether `info` is a connection this one can make: not TLS.
    pub(crate) fn reaches(info: &ConnectionInfo) -> bool {
        !matches!(info.addr(), ConnectionAddr::TcpTls { .. })
    }

    /// Connects, then authenticates and selects the database as redis-rs would.
    pub(crate) async fn connect(info: &ConnectionInfo, timeout: Duration) -> RedisResult<Pipe> {
        let (reader, writer) = tokio::time::timeout(timeout, connect(info))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("could not connect in {} ms", timeout.as_millis()),
                )
            })??;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(writer)),
        });
        tokio::spawn(drive(shared.clone(), reader));
        let pipe = Pipe {
            handle: Arc::new(Handle(shared)),
            db: info.redis_settings().db(),
        };
        pipe.set_up(info).await?;
        Ok(pipe)
    }

    async fn set_up(&self, info: &ConnectionInfo) -> RedisResult<()> {
        let settings = info.redis_settings();
        let mut setup = redis::pipe();
        if let Some(password) = settings.password() {
            setup.cmd("AUTH");
            if let Some(user) = settings.username() {
                setup.arg(user);
            }
            setup.arg(password);
        }
        if settings.db() != 0 {
            setup.cmd("SELECT").arg(settings.db());
        }
        let checked = setup.len();
        // Their answers are not looked at: servers before 7.2 do not know them.
        if !settings.skip_set_lib_name() {
            let name = settings.lib_name().unwrap_or(env!("CARGO_PKG_NAME"));
            let version = settings.lib_ver().unwrap_or(env!("CARGO_PKG_VERSION"));
            setup.cmd("CLIENT").arg("SETINFO").arg("LIB-NAME").arg(name);
            setup
                .cmd("CLIENT")
                .arg("SETINFO")
                .arg("LIB-VER")
                .arg(version);
        }
        let answers = self.send_many(&setup, 0, setup.len()).await?;
        for answer in answers.into_iter().take(checked) {
            answer.extract_error()?;
        }
        Ok(())
    }

    /// `cmd`'s answer; a refusal by the server is an answer (`Value::ServerError`),
    /// as on redis-rs' connection.
    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        self.shared().queue(
            |unsent| cmd.write_packed_command(unsent),
            Waiter::One(reply),
        )?;
        answer.await.unwrap_or_else(|_| Err(closed()))
    }

    /// The answers to `pipeline`'s commands from `offset` on, `count` of them.
    pub(crate) async fn send_many(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        // No answer would come to end the wait.
        if offset + count == 0 {
            return Ok(Vec::new());
        }
        let (reply, answers) = oneshot::channel();
        let waiter = Waiter::Many {
            skip: offset,
            left: offset + count,
            answers: Vec::with_capacity(count),
            reply,
        };
        self.shared().queue(
            |unsent| unsent.extend_from_slice(&pipeline.get_packed_pipeline()),
            waiter,
        )?;
        answers.await.unwrap_or_else(|_| Err(closed()))
    }

    pub(crate) fn db(&self) -> i64 {
        self.db
    }

    fn shared(&self) -> &Shared {
        &self.handle.0
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        self.0.break_with(
            &mut state,
            io::ErrorKind::NotConnected,
            "the connection was closed",
        );
    }
}

impl State {
    fn new(writer: Writer) -> State {
        State {
            writer,
            unsent: Vec::new(),
            waiting: VecDeque::new(),
            broken: None,
            driver: None,
            settling: 0,
            unsent_requests: 0,
        }
    }

    /// Writes what the socket takes now: a caller's write, which must not take the
    /// driver's place as the one woken when the socket takes more.
    fn write_some(&mut self) -> io::Result<()> {
        while !self.unsent.is_empty() {
            match self.writer.try_write(&self.unsent) {
                Ok(written) => self.sent(written),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Writes all that is queued, or registers to be woken when the socket takes more.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        while !self.unsent.is_empty() {
            match self.writer.poll_write(cx, &self.unsent) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(written)) => self.sent(written),
                Poll::Ready(Err(error)) => return Err(error),
                Poll::Pending => break,
            }
        }
        Ok(())
    }

    fn sent(&mut self, written: usize) {
        self.unsent.drain(..written);
        if self.unsent.is_empty() {
            self.unsent.shrink_to(BUFFER_SIZE);
            self.unsent_requests = 0;
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a request that `write` writes, answered to `waiter`. On an idle
    /// connection its caller puts it onto the socket now. Behind answers due, it wakes
    /// the driver, which sends it with every other request queued by the time it runs
    /// in one write, so that Redis reads them in one batch too.
    ///
    /// Right after a read, the tasks its answers woke run first: the caller that
    /// brings their queued requests to `settling` sends them, and the driver sends
    /// fewer once those tasks have run. A task woken on the driver's thread runs next,
    /// so waking the driver for each request sent one write per request: 16% of the
    /// client's CPU at 64 tasks. One write for all of them left Redis idle between
    /// batches, as did waiting for the next answers: 0.63× raw careful's pairs.
    fn queue(&self, write: impl FnOnce(&mut Vec<u8>), waiter: Waiter) -> RedisResult<()> {
        let mut state = self.lock();
        if let Some((kind, why)) = &state.broken {
            return Err(io::Error::new(*kind, why.clone()).into());
        }
        let nothing_unsent = state.unsent.is_empty();
        let idle = nothing_unsent && state.waiting.is_empty();
        write(&mut state.unsent);
        state.unsent_requests += 1;
        state.waiting.push_back(waiter);
        let send_now = match state.settling {
            0 => idle,
            batch => state.unsent_requests >= batch,
        };
        if send_now && let Err(error) = state.write_some() {
            self.break_with(&mut state, error.kind(), &error.to_string());
        }
        // Whoever leaves the first unsent bytes wakes the driver, and those queued
        // after them go in the same write; while it settles, whoever the socket did
        // not take all of.
        let wake = match state.settling {
            0 => nothing_unsent,
            _ => send_now,
        };
        if wake
            && !state.unsent.is_empty()
            && let Some(driver) = state.driver.take()
        {
            driver.wake();
        }
        Ok(())
    }

    /// Hands each complete answer at the front of `input` to its waiter, and lets
    /// the tasks woken queue their next requests before they go out.
    fn answer(&self, input: &mut Input) -> io::Result<()> {
        let mut state = self.lock();
        let mut answered = 0;
        while let Some((answer, used)) = parse(input.unparsed())? {
            input.parsed(used);
            let Some(waiter) = state.waiting.front_mut() else {
                continue;
            };
            match waiter {
                Waiter::One(_) => {
                    if let Some(Waiter::One(reply)) = state.waiting.pop_front() {
                        let _ = reply.send(Ok(answer));
                        answered += 1;
                    }
                }
                Waiter::Many {
                    skip,
                    left,
                    answers,
                    ..
                } => {
                    if *skip > 0 {
                        *skip -= 1;
                    } else {
                        answers.push(answer);
                    }
                    *left -= 1;
                    if *left == 0
                        && let Some(Waiter::Many { answers, reply, .. }) = state.waiting.pop_front()
                    {
                        let _ = reply.send(Ok(answers));
                        answered += 1;
                    }
                }
            }
        }
        state.settling = answered.min(BATCH);
        Ok(())
    }

    /// Ends the connection: every request waiting, and every one made later, fails.
    fn break_with(&self, state: &mut State, kind: io::ErrorKind, why: &str) {
        if state.broken.is_some() {
            return;
        }
        state.broken = Some((kind, why.to_owned()));
        state.unsent.clear();
        for waiter in state.waiting.drain(..) {
            let error = || io::Error::new(kind, why.to_owned()).into();
            match waiter {
                Waiter::One(reply) => drop(reply.send(Err(error()))),
                Waiter::Many { reply, .. } => drop(reply.send(Err(error()))),
            }
        }
        if let Some(driver) = state.driver.take() {
            driver.wake();
        }
    }

    /// Writes what queued up, then reads once: `Continue` after the read, with every
    /// whole answer in it handed out; `Break` once the connection ended.
    fn poll_drive(
        &self,
        cx: &mut Context<'_>,
        reader: &mut Reader,
        input: &mut Input,
    ) -> Poll<ControlFlow<()>> {
        {
            let mut state = self.lock();
            if state.broken.is_some() {
                return Poll::Ready(ControlFlow::Break(()));
            }
            if let Err(error) = state.poll_write(cx) {
                self.break_with(&mut state, error.kind(), &error.to_string());
                return Poll::Ready(ControlFlow::Break(()));
            }
            if !state
                .driver
                .as_ref()
                .is_some_and(|driver| driver.will_wake(cx.waker()))
            {
                state.driver = Some(cx.waker().clone());
            }
        }
        // A read that leaves room proves the socket drained, and the next poll
        // waits for more without asking the socket again.
        let outcome = match ready!(reader.poll_read(cx, input)) {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "Redis closed the connection",
            )),
            Ok(_) => self.answer(input),
            Err(error) => Err(error),
        };
        if let Err(error) = outcome {
            let mut state = self.lock();
            self.break_with(&mut state, error.kind(), &error.to_string());
            return Poll::Ready(ControlFlow::Break(()));
        }
        Poll::Ready(ControlFlow::Continue(()))
    }
}

/// Writes what queues up behind a busy connection, and reads every answer; ends when
/// the connection breaks or its last handle goes. After handing out answers it lets
/// the tasks they woke run first, so that the requests those make go out together,
/// while Redis still works on the ones sent before; then it settles no more.
async fn drive(shared: Arc<Shared>, mut reader: Reader) {
    let driver = Driver(shared);
    let mut input = Input::default();
    while poll_fn(|cx| driver.0.poll_drive(cx, &mut reader, &mut input))
        .await
        .is_continue()
    {
        tokio::task::yield_now().await;
        driver.0.lock().settling = 0;
    }
}

/// The driver's hold on the connection. A runtime that shuts down drops it, and the
/// connection with it: nothing would read its answers, so its callers connect again.
struct Driver(Arc<Shared>);

impl Drop for Driver {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        let why = "the runtime that read its answers shut down";
        self.0
            .break_with(&mut state, io::ErrorKind::NotConnected, why);
    }
}

/// What was read and not yet parsed: `bytes[start..end]`.
#[derive(Default)]
struct Input {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
}

/// The room a read is given, and what a buffer shrinks back to once empty: a backlog
/// of requests or a long answer grows one, and a connection kept for hours would
/// otherwise hold on to the most it ever needed.
const BUFFER_SIZE: usize = 16 * 1024;

impl Input {
    fn unparsed(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    /// Room to read into, after what is unparsed: a long answer grows it.
    fn room(&mut self) -> &mut [u8] {
        if self.end == self.bytes.len() {
            if self.start > 0 {
                self.bytes.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                let size = (self.bytes.len() * 2).max(BUFFER_SIZE);
                self.bytes.resize(size, 0);
            }
        }
        &mut self.bytes[self.end..]
    }

    fn parsed(&mut self, used: usize) {
        self.start += used;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            self.bytes.truncate(BUFFER_SIZE);
            self.bytes.shrink_to(BUFFER_SIZE);
        }
    }
}

/// The TCP settings of the connection info, as redis-rs applies them to its own
/// connections (all but the linger time, which it does not let us read).
fn apply(settings: &TcpSettings, stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(settings.nodelay())?;
    let socket = socket2::SockRef::from(stream);
    if let Some(keepalive) = settings.keepalive() {
        socket.set_tcp_keepalive(keepalive)?;
    }
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    if let Some(timeout) = settings.user_timeout() {
        socket.set_tcp_user_timeout(Some(timeout))?;
    }
    Ok(())
}

/// The two sides of a new connection to `info`'s address.
async fn connect(info: &ConnectionInfo) -> io::Result<(Reader, Writer)> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            let stream = TcpStream::connect((host.as_str(), *port)).await?;
            apply(info.tcp_settings(), &stream)?;
            let (reader, writer) = stream.into_split();
            Ok((Reader::Tcp(reader), Writer::Tcp(writer)))
        }
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => {
            let (reader, writer) = UnixStream::connect(path).await?.into_split();
            Ok((Reader::Unix(reader), Writer::Unix(writer)))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "TLS goes through redis-rs' connection",
        )),
    }
}

// Writes are `writev`s, as redis-rs' connection writes: `/proc/<pid>/io` counts
// those, and no `send`, so the writes of both show there alike.
impl Writer {
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        let bytes = [io::IoSlice::new(bytes)];
        match self {
            Writer::Tcp(writer) => writer.try_write_vectored(&bytes),
            #[cfg(unix)]
            Writer::Unix(writer) => writer.try_write_vectored(&bytes),
        }
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        let bytes = [io::IoSlice::new(bytes)];
        match self {
            Writer::Tcp(writer) => Pin::new(writer).poll_write_vectored(cx, &bytes),
            #[cfg(unix)]
            Writer::Unix(writer) => Pin::new(writer).poll_write_vectored(cx, &bytes),
        }
    }
}

impl Reader {
    /// Reads what came into `input`: how many bytes, 0 once the server closed.
    fn poll_read(&mut self, cx: &mut Context<'_>, input: &mut Input) -> Poll<io::Result<usize>> {
        let mut room = ReadBuf::new(input.room());
        ready!(match self {
            Reader::Tcp(reader) => Pin::new(reader).poll_read(cx, &mut room),
            #[cfg(unix)]
            Reader::Unix(reader) => Pin::new(reader).poll_read(cx, &mut room),
        })?;
        let read = room.filled().len();
        input.end += read;
        Poll::Ready(Ok(read))
    }
}

fn closed() -> RedisError {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the connection to Redis closed",
    )
    .into()
}

/// The answer at the front of `bytes` and how many bytes it takes, or `None` while
/// it has not all come. RESP2, and RESP3's null.
fn parse(bytes: &[u8]) -> io::Result<Option<(Value, usize)>> {
    let Some(first) = bytes.first() else {
        return Ok(None);
    };
    let Some(end) = bytes.windows(2).position(|pair| pair == b"\r\n") else {
        return Ok(None);
    };
    let line = &bytes[1..end];
    let next = end + 2;
    let answer = match first {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(text(line)?.to_owned()),
        b'-' => redis::parse_redis_value(&bytes[..next]).map_err(invalid)?,
        b':' => Value::Int(number(line)?),
        b'_' => Value::Nil,
        b'$' => {
            let Ok(length) = usize::try_from(number(line)?) else {
                return Ok(Some((Value::Nil, next)));
            };
            let after = next.saturating_add(length).saturating_add(2);
            let Some(body) = bytes.get(next..after) else {
                return Ok(None);
            };
            return Ok(Some((Value::BulkString(body[..length].to_vec()), after)));
        }
        b'*' => {
            let Ok(length) = usize::try_from(number(line)?) else {
                return Ok(Some((Value::Nil, next)));
            };
            let mut items = Vec::with_capacity(length.min(1024));
            let mut at = next;
            for _ in 0..length {
                let Some((item, used)) = parse(&bytes[at..])? else {
                    return Ok(None);
                };
                items.push(item);
                at += used;
            }
            return Ok(Some((Value::Array(items), at)));
        }
        other => {
            return Err(invalid(format!(
                "an answer starting with {:?}",
                *other as char
            )));
        }
    };
    Ok(Some((answer, next)))
}

fn text(line: &[u8]) -> io::Result<&str> {
    std::str::from_utf8(line).map_err(invalid)
}

fn number(line: &[u8]) -> io::Result<i64> {
    text(line)?.parse().map_err(invalid)
}

fn invalid(why: impl ToString) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("Redis sent what is not RESP: {}", why.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Value {
        let (value, used) = parse(bytes).unwrap().expect("a whole answer");
        assert_eq!(used, bytes.len(), "{bytes:?}");
        value
    }

    #[test]
    fn answers_parse_as_redis_rs_parses_them() {
        for bytes in [
            &b"+OK\r\n"[..],
            b"+QUEUED\r\n",
            b":-42\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n$1\r\nx\r\n*2\r\n+a\r\n$-1\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
        ] {
            assert_eq!(
                whole(bytes),
                redis::parse_redis_value(bytes).unwrap(),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn a_partial_answer_waits_for_the_rest() {
        let bytes = b"*2\r\n$3\r\nabc\r\n:7\r\n";
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(
            parse(bytes).unwrap(),
            Some((
                Value::Array(vec![Value::BulkString(b"abc".to_vec()), Value::Int(7)]),
                bytes.len()
            ))
        );
    }

    #[test]
    fn a_long_answer_read_in_pieces_arrives_whole_after_a_short_one() {
        let long = vec![b'x'; 40_000];
        let mut sent = b":1\r\n".to_vec();
        sent.extend_from_slice(format!("${}\r\n", long.len()).as_bytes());
        sent.extend_from_slice(&long);
        sent.extend_from_slice(b"\r\n");
        let mut input = Input::default();
        let mut answers = Vec::new();
        let mut unread = &sent[..];
        while !unread.is_empty() {
            // As a read does: at most a piece, and no more than there is room for.
            let room = input.room();
            let read = room.len().min(1_000).min(unread.len());
            room[..read].copy_from_slice(&unread[..read]);
            unread = &unread[read..];
            input.end += read;
            while let Some((answer, used)) = parse(input.unparsed()).unwrap() {
                input.parsed(used);
                answers.push(answer);
            }
        }
        assert_eq!(answers, vec![Value::Int(1), Value::BulkString(long)]);
        assert_eq!((input.start, input.end), (0, 0));
        assert!(input.bytes.capacity() <= BUFFER_SIZE);
    }

    #[tokio::test]
    async fn a_backlog_once_sent_leaves_no_large_buffer_behind() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (ours, theirs) = tokio::join!(TcpStream::connect(address), listener.accept());
        let (_reader, writer) = ours.unwrap().into_split();
        let (theirs, _) = theirs.unwrap();
        let backlog = 200_000;
        let reading = tokio::spawn(async move {
            let (mut received, mut piece) = (Vec::new(), vec![0; BUFFER_SIZE]);
            while received.len() < backlog {
                theirs.readable().await?;
                match theirs.try_read(&mut piece) {
                    Ok(0) => break,
                    Ok(read) => received.extend_from_slice(&piece[..read]),
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                    Err(error) => return Err(error),
                }
            }
            io::Result::Ok(received)
        });
        let mut state = State::new(Writer::Tcp(writer));
        state.unsent = vec![b'x'; backlog];
        poll_fn(|cx| match state.poll_write(cx) {
            Ok(()) if state.unsent.is_empty() => Poll::Ready(()),
            Ok(()) => Poll::Pending,
            Err(error) => panic!("{error}"),
        })
        .await;
        assert_eq!(reading.await.unwrap().unwrap(), vec![b'x'; backlog]);
        assert!(state.unsent.capacity() <= BUFFER_SIZE);
    }

    /// A server that answers by hand: reads requests as they arrive.
    struct ByHand {
        socket: TcpStream,
        received: Vec<u8>,
    }

    impl ByHand {
        /// What one read brings: the whole requests in it, and any before it left over.
        async fn read_once(&mut self) -> Vec<Value> {
            let mut piece = vec![0; BUFFER_SIZE];
            let read = loop {
                self.socket.readable().await.unwrap();
                match self.socket.try_read(&mut piece) {
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                    read => break read.unwrap(),
                }
            };
            self.received.extend_from_slice(&piece[..read]);
            let mut requests = Vec::new();
            while let Some((request, used)) = parse(&self.received).unwrap() {
                self.received.drain(..used);
                requests.push(request);
            }
            requests
        }

        async fn read(&mut self, count: usize) -> Vec<Value> {
            let mut requests = Vec::new();
            while requests.len() < count {
                requests.extend(self.read_once().await);
            }
            requests
        }

        async fn answer(&mut self, answers: &[u8]) {
            self.socket.writable().await.unwrap();
            assert_eq!(self.socket.try_write(answers).unwrap(), answers.len());
        }
    }

    fn get(key: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(b"GET".to_vec()),
            Value::BulkString(key.as_bytes().to_vec()),
        ])
    }

    /// `GET key` on `pipe`, for its answer.
    fn ask_get(pipe: &Pipe, key: &str) -> impl Future<Output = Value> + use<> {
        let (pipe, mut cmd) = (pipe.clone(), redis::cmd("GET"));
        cmd.arg(key);
        async move { pipe.send(&cmd).await.unwrap() }
    }

    /// A pipe connected to a server answering by hand, past the connection's set-up.
    async fn pipe_to_a_server_by_hand() -> (Pipe, ByHand) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let info = redis::IntoConnectionInfo::into_connection_info(format!(
            "redis://{}",
            listener.local_addr().unwrap()
        ))
        .unwrap();
        let serving = async {
            let (socket, _) = listener.accept().await.unwrap();
            let mut server = ByHand {
                socket,
                received: Vec::new(),
            };
            // CLIENT SETINFO, twice.
            server.read(2).await;
            server.answer(b"+OK\r\n+OK\r\n").await;
            server
        };
        let (pipe, server) = tokio::join!(Pipe::connect(&info, Duration::from_secs(5)), serving);
        (pipe.unwrap(), server)
    }

    #[tokio::test]
    async fn requests_made_while_an_answer_is_due_go_out_together_before_it_arrives() {
        let (pipe, mut server) = pipe_to_a_server_by_hand().await;
        let send = |key: &str| tokio::spawn(ask_get(&pipe, key));

        let first = send("a");
        assert_eq!(server.read(1).await, vec![get("a")]);
        let behind = [send("b"), send("c"), send("d")];
        let sent = tokio::time::timeout(Duration::from_secs(2), server.read_once()).await;
        assert_eq!(
            sent.expect("b, c and d waited for a's answer"),
            vec![get("b"), get("c"), get("d")],
            "all three in one write"
        );

        server.answer(b":1\r\n:2\r\n:3\r\n:4\r\n").await;
        assert_eq!(first.await.unwrap(), Value::Int(1));
        for (task, answer) in behind.into_iter().zip(2..) {
            assert_eq!(task.await.unwrap(), Value::Int(answer));
        }
    }

    #[tokio::test]
    async fn requests_of_tasks_an_answer_woke_go_out_before_the_next_answer_arrives() {
        let (pipe, mut server) = pipe_to_a_server_by_hand().await;
        let (a, d) = (ask_get(&pipe, "a"), ask_get(&pipe, "d"));
        let first = tokio::spawn(async move { (a.await, d.await) });
        assert_eq!(server.read(1).await, vec![get("a")]);
        let behind = tokio::spawn(ask_get(&pipe, "b"));
        assert_eq!(server.read(1).await, vec![get("b")]);

        server.answer(b":1\r\n").await;
        // a's answer lets its task ask for d while b's answer is still due.
        let sent = tokio::time::timeout(Duration::from_secs(2), server.read(1)).await;
        assert_eq!(sent.expect("d waited for b's answer"), vec![get("d")]);
        server.answer(b":2\r\n:3\r\n").await;
        assert_eq!(first.await.unwrap(), (Value::Int(1), Value::Int(3)));
        assert_eq!(behind.await.unwrap(), Value::Int(2));
    }

    // On one worker, as in a busy runtime: a task woken there runs next, before the
    // tasks woken before it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn requests_of_tasks_one_read_woke_go_out_in_one_write() {
        let (pipe, mut server) = pipe_to_a_server_by_hand().await;
        let twice = |first: &str, then: &str| {
            let (first, then) = (ask_get(&pipe, first), ask_get(&pipe, then));
            tokio::spawn(async move { (first.await, then.await) })
        };
        let tasks = [
            twice("a", "e"),
            twice("b", "f"),
            twice("c", "g"),
            twice("d", "h"),
        ];
        let first = server.read(4).await;
        server.answer(&echo(&first)).await;

        let sent = tokio::time::timeout(Duration::from_secs(2), server.read_once()).await;
        let sent = sent.expect("the woken tasks' requests went out");
        let mut keys = sent.clone();
        keys.sort_by_key(|request| format!("{request:?}"));
        let expected = vec![get("e"), get("f"), get("g"), get("h")];
        assert_eq!(keys, expected, "all four in one write");
        server.answer(&echo(&sent)).await;
        for (task, [first, then]) in
            tasks
                .into_iter()
                .zip([["a", "e"], ["b", "f"], ["c", "g"], ["d", "h"]])
        {
            let bulk = |key: &str| Value::BulkString(key.as_bytes().to_vec());
            assert_eq!(task.await.unwrap(), (bulk(first), bulk(then)));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_woken_task_that_alone_asks_again_is_not_kept_waiting() {
        let (pipe, mut server) = pipe_to_a_server_by_hand().await;
        let (a, d) = (ask_get(&pipe, "a"), ask_get(&pipe, "d"));
        let again = tokio::spawn(async move { (a.await, d.await) });
        let once = [
            tokio::spawn(ask_get(&pipe, "b")),
            tokio::spawn(ask_get(&pipe, "c")),
        ];
        let first = server.read(3).await;
        server.answer(&echo(&first)).await;

        let sent = tokio::time::timeout(Duration::from_secs(2), server.read(1)).await;
        assert_eq!(sent.expect("d went out"), vec![get("d")]);
        server.answer(&echo(&[get("d")])).await;
        let bulk = |key: &str| Value::BulkString(key.as_bytes().to_vec());
        assert_eq!(again.await.unwrap(), (bulk("a"), bulk("d")));
        for (task, key) in once.into_iter().zip(["b", "c"]) {
            assert_eq!(task.await.unwrap(), bulk(key));
        }
    }

    /// Answers each `GET` in `requests` with its key.
    fn echo(requests: &[Value]) -> Vec<u8> {
        let mut answers = Vec::new();
        for request in requests {
            let Value::Array(parts) = request else {
                panic!("{request:?}")
            };
            let Value::BulkString(key) = &parts[1] else {
                panic!("{request:?}")
            };
            answers.extend_from_slice(format!("${}\r\n", key.len()).as_bytes());
            answers.extend_from_slice(key);
            answers.extend_from_slice(b"\r\n");
        }
        answers
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [&b"?what\r\n"[..], b":nan\r\n", b"$x\r\n", b"*2\r\n!\r\n"] {
            let error = parse(bytes).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{bytes:?}");
        }
    }
}
