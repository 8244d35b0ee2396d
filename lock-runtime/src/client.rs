use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::acquire::Acquirer;
use crate::backend::{Backend, MemoryStore, RedisNode, Redlock, Signals, Store, Target};
use crate::key::LockName;
use crate::options::HandOff;
use crate::{LockError, LockGuard, LockOptions};

/// How a client talks to Redis: the bounds on connecting and on each call.
///
/// Every Redis call, including waiting on a reconnect, gives up after
/// `command_timeout` with `LockError::Backend`, so an unreachable Redis is an error
/// within that bound, never a hang. A call on a connection gone silent is given up
/// on at most a quarter of the bound later: the connection is watched as a whole,
/// not each call with a timer of its own.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) hand_off: HandOff,
    /// Replicas that must have each grant and renewal; `None`: 1 where the primary
    /// has replicas at connect, else 0.
    pub(crate) replicas: Option<usize>,
    pub(crate) replica_timeout: Duration,
    pub(crate) fsync: bool,
    #[cfg(feature = "tls")]
    pub(crate) tls_certificates: Option<redis::TlsCertificates>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            hand_off: HandOff {
                most: DEFAULT_HAND_OFFS,
                within: DEFAULT_HAND_OFF_WINDOW,
            },
            replicas: None,
            replica_timeout: DEFAULT_REPLICA_TIMEOUT,
            fsync: false,
            #[cfg(feature = "tls")]
            tls_certificates: None,
        }
    }
}

/// Hand-offs in a row while another client waits, unless set.
pub const DEFAULT_HAND_OFFS: u16 = 32;
/// How long a lock may be handed on while another client waits, unless set.
pub const DEFAULT_HAND_OFF_WINDOW: Duration = Duration::from_millis(20);
/// How long a grant or renewal waits for its replicas, unless set.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_secs(1);

impl ClientConfig {
    /// The defaults: 2 s to connect, 2 s for each call, up to 32 hand-offs within
    /// 20 ms of each Redis acquisition, and each grant confirmed by a replica within
    /// 1 s wherever the primary has replicas.
    pub fn new() -> Self {
        Self::default()
    }

    /// How far a lock passes from task to task of this client without asking Redis:
    /// when a holder lets go while another task of the client waits for the key,
    /// the waiter takes the lock over with no round trip, at most `most` times in a
    /// row and within `within` of the Redis acquisition; then the lock is released to
    /// Redis, where other clients get their chance. Halfway through, the client asks
    /// Redis in the background whether another client has queued for the lock; if
    /// none has, the count and the clock start again from there. `most = 0` turns
    /// hand-off off. Never on Redlock.
    pub fn hand_off(mut self, most: u16, within: Duration) -> Self {
        self.hand_off = HandOff { most, within };
        self
    }

    /// How many replicas must have each grant and each renewal before the client
    /// counts it. A primary that grants a lock and dies before any replica has it
    /// would otherwise leave the promoted replica free to grant it again: two
    /// holders. Sentinel and Cluster promote the replica that is furthest along, so
    /// one is enough.
    ///
    /// The default is 1 wherever the primary has replicas (those the Sentinels
    /// list, those Cluster lists for the slot's primary, down ones included; those
    /// in sync with one server, as `ROLE` lists them, which leaves out one that is
    /// down), else 0, which costs nothing. The replicas are counted at connect and
    /// again every 10 s while the client is used, so a replica added later is
    /// waited for from then on. A count never drops: a replica that disconnects may
    /// still be the one promoted, so while it is away grants fail with
    /// [`LockError::Replication`] after [`replica_timeout`](Self::replica_timeout),
    /// and one removed for good is waited for until the client connects again.
    /// With the `tracing` feature, the count taken at connect, and each that changed
    /// since, is an INFO event with the `replicas` counted. `replicas(0)` chooses
    /// availability instead. Does not apply to Redlock, whose masters are
    /// independent.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// How long a grant or renewal waits for its replicas (1 s unless set). A grant
    /// not confirmed in time is given back and counts as a failed attempt; a renewal
    /// not confirmed does not extend what the holder counts on.
    pub fn replica_timeout(mut self, timeout: Duration) -> Self {
        self.replica_timeout = timeout;
        self
    }

    /// Whether each grant and renewal must also be written to the primary's
    /// append-only file on disk (`WAITAOF 1 0`), so that a restart without a
    /// failover cannot forget it. Needs Redis or Valkey 7.2 or newer with
    /// `appendonly yes`; elsewhere connecting fails and says so. Run the server with
    /// `appendfsync always` too: under the default `everysec`, each grant waits for
    /// the next second's fsync, and a busy server misses the
    /// [`replica_timeout`](Self::replica_timeout); under `no`, the server counts a
    /// write handed to the operating system as on disk, which outlives a crash of
    /// the server but not of its machine. The client cannot tell which the server
    /// runs without `CONFIG GET`, which also reads secrets. Off by default.
    pub fn fsync(mut self, fsync: bool) -> Self {
        self.fsync = fsync;
        self
    }

    /// The longest connecting to one server may take. Through Sentinel or to a
    /// Cluster, `connect` first asks where to connect (the Sentinels; the listed
    /// nodes, for the slot map), and a silent one makes it take a few times this:
    /// a Cluster connection waits for each node it is given, then for each node of
    /// the slot map, and grants confirmed by replicas need a second one.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The longest one Redis call may take, reconnecting included, and a quarter more
    /// on a connection gone silent.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// For `rediss://` URLs: the CA to trust instead of the system's roots (a private
    /// CA), and a client certificate when Redis asks for one. Every URL must then be
    /// `rediss://`. Taken by [`LockClient::connect_with`], `cluster_with`,
    /// `sentinel_with` and `redlock_with`. On Sentinel, every Sentinel is then reached
    /// with the user and password of the first URL.
    ///
    /// ```no_run
    /// use lock_runtime::{ClientConfig, LockClient, redis};
    ///
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// let private_ca = redis::TlsCertificates {
    ///     client_tls: None,
    ///     root_cert: Some(std::fs::read("ca.crt")?),
    /// };
    /// let config = ClientConfig::new().tls_certificates(private_ca);
    /// let locks = LockClient::connect_with("rediss://redis.internal:6380", config).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_certificates(mut self, certificates: redis::TlsCertificates) -> Self {
        self.tls_certificates = Some(certificates);
        self
    }

    /// The longest `connect` may take: connecting to the Sentinels or to a Cluster's
    /// listed nodes and asking them where to connect, then connecting there.
    pub(crate) fn connecting_bound(&self) -> Duration {
        self.connect_timeout * 2 + self.command_timeout
    }
}

/// A handle on where locks live: one Redis, a Sentinel-watched primary, a Cluster,
/// Redlock masters, or this process's memory.
///
/// Cloning is cheap, and clones are one client: they share its connections, its
/// identity and its local queue. [`peer`](Self::peer) makes another client on the
/// same store.
#[derive(Clone)]
pub struct LockClient {
    acquirer: Arc<Acquirer>,
}

static DEFAULT_CLIENT: RwLock<Option<LockClient>> = RwLock::new(None);

/// Sets the client that `#[distributed_lock]` uses when no `client = "..."` is given.
/// A later call replaces it.
pub fn set_default_client(client: LockClient) {
    *DEFAULT_CLIENT.write().unwrap_or_else(|p| p.into_inner()) = Some(client);
}

/// The client set by [`set_default_client`], or `NoDefaultClient`.
pub fn default_client() -> Result<LockClient, LockError> {
    DEFAULT_CLIENT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or(LockError::NoDefaultClient)
}

impl LockClient {
    /// Connects to one Redis at `url`, reconnecting when the connection drops.
    ///
    /// The URL is redis-rs' own: `redis://[user][:password]@host[:port][/db]` (an ACL
    /// user, a password, a database number), `redis+unix:///path/to.sock`, and, with
    /// this crate's `tls` feature, `rediss://` checked against the system's trusted
    /// roots ([`ClientConfig::tls_certificates`] names others). For other connection
    /// info (a `redis::ConnectionInfo`, say), build a [`redis::Client`] and pass it to
    /// [`from_client`](Self::from_client).
    pub async fn connect(url: &str) -> Result<LockClient, LockError> {
        Self::connect_with(url, ClientConfig::default()).await
    }

    /// Like [`connect`](Self::connect), with explicit time bounds.
    pub async fn connect_with(url: &str, config: ClientConfig) -> Result<LockClient, LockError> {
        let target = Target::server(url, &config)
            .map_err(|source| LockError::Backend { key: None, source })?;
        Self::connect_to(target, config).await
    }

    /// Connects to the Redis that the application's `client` names, with whatever it
    /// carries: credentials, database, TLS settings and certificates. Like
    /// [`connect`](Self::connect), this opens connections of its own and reconnects.
    ///
    /// ```no_run
    /// use lock_runtime::{LockClient, redis};
    ///
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = redis::Client::open("redis://locks:secret@10.0.0.7:6379/2")?;
    /// let locks = LockClient::from_client(redis).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_client(client: redis::Client) -> Result<LockClient, LockError> {
        Self::from_client_with(client, ClientConfig::default()).await
    }

    /// Like [`from_client`](Self::from_client), with explicit time bounds.
    pub async fn from_client_with(
        client: redis::Client,
        config: ClientConfig,
    ) -> Result<LockClient, LockError> {
        Self::connect_to(Target::client(client), config).await
    }

    /// Takes locks over the application's own `manager`: lock commands share its
    /// connection and its reconnection settings.
    ///
    /// Waiting stays push-based: release notifications arrive on a RESP3 connection
    /// of this client's own, opened on first wait from `client`, which must be the
    /// client the manager was made from. A `ConnectionManager` does not reveal its
    /// connection info, hence the second argument.
    ///
    /// ```no_run
    /// use lock_runtime::{LockClient, redis};
    ///
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let manager = redis::aio::ConnectionManager::new(redis.clone()).await?;
    /// let locks = LockClient::from_connection_manager(manager, redis).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_connection_manager(
        manager: redis::aio::ConnectionManager,
        client: redis::Client,
    ) -> Result<LockClient, LockError> {
        Self::from_connection_manager_with(manager, client, ClientConfig::default()).await
    }

    /// Like [`from_connection_manager`](Self::from_connection_manager), with explicit
    /// time bounds for each lock call and for the subscriber connection; the
    /// manager's own settings govern its reconnecting.
    pub async fn from_connection_manager_with(
        manager: redis::aio::ConnectionManager,
        client: redis::Client,
        config: ClientConfig,
    ) -> Result<LockClient, LockError> {
        Self::connect_to(Target::manager(manager, client), config).await
    }

    /// A Redis Cluster, from the URLs of some of its nodes. Each lock's keys share
    /// one hash slot; releases are published per shard (`SPUBLISH`, Redis 7 or
    /// later). Redirections during resharding are followed.
    ///
    /// The URLs carry the user and password (`redis://user:password@host:port`), the
    /// same on every URL; with the `tls` feature, `rediss://` URLs connect over TLS.
    pub async fn cluster<I>(urls: I) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::cluster_with(urls, ClientConfig::default()).await
    }

    /// Like [`cluster`](Self::cluster), with explicit time bounds.
    pub async fn cluster_with<I>(urls: I, config: ClientConfig) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::connect_to(Target::cluster(owned(urls)), config).await
    }

    /// The primary that the Sentinels at `sentinel_urls` name for `primary_name`,
    /// followed through failovers. A lock counts as taken once a replica has it
    /// (see [`ClientConfig::replicas`]), so the replica promoted after a failover
    /// never grants it a second time.
    ///
    /// Each Sentinel is reached with the credentials of its URL. The primary is
    /// reached with the user, password and database of the first URL, and over TLS
    /// when it is `rediss://` (with the `tls` feature).
    pub async fn sentinel<I>(sentinel_urls: I, primary_name: &str) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::sentinel_with(sentinel_urls, primary_name, ClientConfig::default()).await
    }

    /// Like [`sentinel`](Self::sentinel), with explicit time bounds.
    pub async fn sentinel_with<I>(
        sentinel_urls: I,
        primary_name: &str,
        config: ClientConfig,
    ) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let target = Target::sentinel(owned(sentinel_urls), primary_name, &config)
            .map_err(|source| LockError::Backend { key: None, source })?;
        Self::connect_to(target, config).await
    }

    async fn connect_to(target: Target, config: ClientConfig) -> Result<LockClient, LockError> {
        let signals = Arc::new(Signals::default());
        let node = RedisNode::connect(target, &config, signals.clone()).await?;
        let backend = Backend::new(Store::Redis(Box::new(node)), signals);
        Ok(Self::with_backend(backend, &config))
    }

    /// Locks kept in this process's memory, with the same semantics as Redis. For
    /// tests and single-process demos: other processes do not see these locks. Each
    /// call makes a store of its own; [`peer`](Self::peer) adds clients to it.
    pub fn memory() -> LockClient {
        let signals = Arc::new(Signals::default());
        let store = MemoryStore::new(signals.clone());
        Self::with_backend(
            Backend::new(Store::Memory(store), signals),
            &ClientConfig::default(),
        )
    }

    /// The Redlock algorithm over independent Redis masters (use an odd number, 3 or
    /// more): a lock is held when a majority of them grant it, so it survives the
    /// loss of a minority. Each node call gives up after 200 ms; a node unreachable
    /// at start-up is retried on use, but a majority must answer now.
    pub async fn redlock<I>(urls: I) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let config = ClientConfig::new()
            .command_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(500));
        Self::redlock_with(urls, config).await
    }

    /// Like [`redlock`](Self::redlock), with explicit time bounds for each node.
    pub async fn redlock_with<I>(urls: I, config: ClientConfig) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let signals = Arc::new(Signals::default());
        let redlock = Redlock::connect(owned(urls), &config, signals.clone()).await?;
        let backend = Backend::new(Store::Redlock(redlock), signals);
        Ok(Self::with_backend(backend, &config))
    }

    fn with_backend(backend: Arc<Backend>, config: &ClientConfig) -> LockClient {
        LockClient {
            acquirer: Arc::new(Acquirer::new(backend, config.hand_off)),
        }
    }

    /// Another client on the same store and connections, with an identity, a local
    /// queue and holds of its own: to the locks, it is another process. With
    /// [`memory`](Self::memory), this is how two clients share one store.
    ///
    /// ```
    /// use lock_runtime::{LockClient, LockOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let here = LockClient::memory();
    /// let there = here.peer();
    /// let guard = here.acquire("report", &LockOptions::new()).await?;
    /// assert!(there.try_acquire("report", &LockOptions::new()).await?.is_none());
    /// guard.release().await
    /// # }
    /// ```
    pub fn peer(&self) -> LockClient {
        LockClient {
            acquirer: Arc::new(self.acquirer.peer()),
        }
    }

    /// Takes the lock on `key`, waiting as `options` say.
    ///
    /// Inside a hold of `key` on this client (the body of `#[distributed_lock]`, or
    /// [`LockGuard::scope`]) this re-enters it with no round trip. Anywhere else,
    /// sibling futures of the holder included, it waits for the hold to end.
    ///
    /// Fails with `Busy` when `spin(false)` and the lock is held, `Timeout` when it
    /// stays held through every attempt or the time budget, `Backend` when Redis
    /// does not answer within the client's bound. Dropping the future at any await
    /// leaves no lock behind.
    pub async fn acquire(&self, key: &str, options: &LockOptions) -> Result<LockGuard, LockError> {
        let plan = options.plan(key)?;
        self.acquirer.acquire(key, &plan).await
    }

    /// Makes one attempt: `None` when another owner holds the lock. Any waiting in
    /// `options` is ignored.
    pub async fn try_acquire(
        &self,
        key: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let mut plan = options.plan(key)?;
        plan.spin = false;
        match self.acquirer.acquire(key, &plan).await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Busy { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Takes the locks on all of `keys`, or none, and returns one guard that holds
    /// them all: [`LockGuard::keys`] lists them, and releasing or dropping the guard
    /// lets go of every one. A key listed twice is one lock, taken once.
    ///
    /// Every client takes keys in one global order (that of the locks' Redis names,
    /// whatever order `keys` lists them in), one at a time, each as
    /// [`acquire`](Self::acquire) takes a key: the same local queue, waiting,
    /// hand-off, watchdog and fencing, and `options` apply to each key as they would
    /// there (the [`fencing_token`](LockGuard::fencing_token) shown is the first
    /// key's). So two callers that list the same keys in different orders never
    /// deadlock. All the waiting shares one time budget, counted from the call:
    /// `timeout`, or about `retries` x `retry_wait`. When a key cannot be taken, the
    /// keys already taken are freed (at once, inside a `hold_at_least` window too,
    /// since nothing ran under them) before its error (`Busy`, `Timeout`, ...) is
    /// returned. Dropping the future at any await leaves no lock behind.
    ///
    /// The cost: one acquire per distinct key, in sequence (one round trip each
    /// when the key is free), on every topology. On a Cluster the keys may lie in
    /// different hash slots: each is taken on its own slot's primary.
    ///
    /// Taking more locks while holding one breaks the global order, so inside a hold
    /// of this client (the body of `#[distributed_lock]`, or [`LockGuard::scope`]) this
    /// fails with `InvalidOptions`, whatever the keys; take them all in one call
    /// instead. A guard held outside its scope is not seen: hold it, and take more
    /// keys, at the risk of deadlock. An empty `keys` is `InvalidOptions` too.
    ///
    /// ```
    /// use lock_runtime::{LockClient, LockOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let locks = LockClient::memory();
    /// let options = LockOptions::new();
    /// let both = locks.acquire_all(["account:7", "account:3"], &options).await?;
    /// assert_eq!(both.keys().len(), 2);
    /// let other = locks.peer();
    /// assert!(other.try_acquire("account:3", &options).await?.is_none());
    /// both.release().await?;
    /// assert!(other.try_acquire("account:3", &options).await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_all<I>(
        &self,
        keys: I,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let keys = owned(keys);
        self.acquire_all_boxed(&keys, options).await
    }

    /// Boxed, and not generic: the futures of several keys' waiting loops nest deep
    /// enough to exhaust the compiler's query depth in callers' crates when laid out
    /// inline.
    fn acquire_all_boxed<'a>(
        &'a self,
        keys: &'a [String],
        options: &'a LockOptions,
    ) -> Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send + 'a>> {
        Box::pin(self.acquirer.acquire_all(keys, options))
    }

    /// Waits until the releases and cleanups running in the background are done:
    /// those of dropped guards and of cancelled acquires. Call it when shutting down
    /// gracefully, after the work that holds locks has ended, so that no key stays
    /// locked for a lease.
    pub async fn shutdown(&self) {
        self.acquirer.settled().await
    }

    /// Whether any owner holds the lock on `key` now. For operators and dashboards:
    /// the answer may be stale by the time it arrives, so never decide from it
    /// whether to enter a critical section; acquire instead.
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        Ok(self.lease_left(key).await?.is_some())
    }

    /// How long the lock on `key` has left before its lease runs out, whoever holds
    /// it (the watchdog may renew it again); `None` when it is free. On Redlock, the
    /// lease a majority of masters still hold. Like [`is_locked`](Self::is_locked),
    /// for looking, not for deciding.
    pub async fn lease_left(&self, key: &str) -> Result<Option<Duration>, LockError> {
        let name = LockName::new(key)?;
        self.acquirer.backend().lease_left(&name).await
    }

    /// Frees the lock on `key` whoever holds it, and passes it on to the waiters as a
    /// release would. Returns whether it was held. For operators clearing a lock
    /// stuck behind a holder that will never let go. This is outside the ownership
    /// rules: the holder is not asked, and if it is still working, its next renewal
    /// is refused and it learns that it lost the lock only then, while another holder
    /// may already have it. Fencing tokens still order the two.
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let name = LockName::new(key)?;
        self.acquirer.backend().force_unlock(&name).await
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.acquirer.backend().kind())
            .finish()
    }
}

fn owned<I>(urls: I) -> Vec<String>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    urls.into_iter()
        .map(|url| url.as_ref().to_owned())
        .collect()
}
