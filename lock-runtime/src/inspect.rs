//! What an operator sees of the locks in Redis: which keys are held, how and by
//! whom, for how long, who waits, and the fencing counter. Reads only.

use std::collections::BTreeSet;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError,
    RedisResult, Value,
};

use crate::backend::{Connection, LuaScript, ScriptCall, Target, bounded};
use crate::key::LockName;
use crate::options::Kind;
use crate::{ClientConfig, LockError};

/// One read of a lock and its companions, on the server that holds them, against
/// that server's clock.
static READ_LOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        include_str!("backend/scripts/holders.lua"),
        r"
local lock, queue, fence = KEYS[1], KEYS[2], KEYS[3]
local time = redis.call('TIME')
local kind = redis.call('TYPE', lock)['ok']
local holders = {}
if kind == 'string' then
  holders = {holder_of(redis.call('GET', lock))}
elseif kind == 'zset' then
  holders = redis.call('ZRANGE', lock, 0, -1, 'WITHSCORES')
end
return {time[1], time[2], kind, redis.call('PTTL', lock), holders,
  redis.call('ZRANGE', queue, 0, -1, 'WITHSCORES'), redis.call('GET', fence) or ''}
"
    ))
});

/// Looks at the locks in Redis whoever holds them: for operators, dashboards and
/// the `locks` command line, never to decide whether to enter a section (acquire
/// instead). It connects as [`LockClient`](crate::LockClient) does, and
/// [`LockClient::force_unlock`](crate::LockClient::force_unlock) frees a lock it
/// shows stuck.
///
/// ```no_run
/// use lock_runtime::{LockError, LockInspector};
///
/// # async fn stuck() -> Result<(), LockError> {
/// let inspector = LockInspector::connect("redis://127.0.0.1:6379").await?;
/// for lock in inspector.locks("order:").await? {
///     println!(
///         "{} held as {:?} for {:?} more, {} waiting",
///         lock.key,
///         lock.kind,
///         lock.lease_left,
///         lock.queue.len()
///     );
/// }
/// if let Some(lock) = inspector.lock("order:42").await? {
///     for holder in &lock.holders {
///         println!("held by client {} under {}", holder.client, holder.token);
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct LockInspector {
    connection: Connection,
    /// A Cluster's URLs: `SCAN` runs on each primary, reached with the first URL's
    /// credentials and TLS.
    cluster: Option<Vec<String>>,
    config: ClientConfig,
}

/// A held lock, as one read on its server found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The key as the caller gave it (`order:42`), decoded from its Redis name.
    pub key: String,
    /// How it is held.
    pub kind: LockKind,
    /// Until the lock's Redis key expires: the longest lease of its holders.
    /// `None` for a key with no expiry, which this crate never writes.
    pub lease_left: Option<Duration>,
    /// Its holders: one for a lock, each shared holder or permit holder otherwise,
    /// none for a lock left by an older version.
    pub holders: Vec<Holder>,
    /// The acquisitions queued for it, first served first.
    pub queue: Vec<Waiter>,
    /// The key's fencing counter: the number of fenced acquisitions Redis granted,
    /// `None` when none ever was. A guard's token is this counter times 2^16 plus
    /// the hand-offs within its client since.
    pub fence: Option<u64>,
}

/// How a lock is held, or what a waiter asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockKind {
    /// A lock, or the exclusive side of a read-write lock: one holder.
    Exclusive,
    /// The shared side of a read-write lock ([`LockOptions::shared`](crate::LockOptions::shared)).
    Shared,
    /// A semaphore of this many permits ([`LockOptions::permits`](crate::LockOptions::permits)).
    Semaphore {
        /// The most holders at once.
        permits: u32,
    },
    /// A lock left by an older version of this crate (a Redis hash), held until it
    /// expires.
    Legacy,
}

/// One holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The acquisition's token, as Redis keeps it.
    pub token: String,
    /// The id of the [`LockClient`](crate::LockClient) that holds it: one per
    /// client, shared by its clones.
    pub client: String,
    /// Until this holder's lease ends, unless renewed.
    pub lease_left: Option<Duration>,
}

/// One place in a lock's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// The waiting acquisition's token.
    pub token: String,
    /// The id of the client that waits.
    pub client: String,
    /// What it waits for.
    pub kind: LockKind,
    /// How long ago it took its place, by the server's clock.
    pub waited: Duration,
}

impl LockInspector {
    /// Connects to one Redis at `url` (redis-rs' URLs, as
    /// [`LockClient::connect`](crate::LockClient::connect) takes them).
    pub async fn connect(url: &str) -> Result<LockInspector, LockError> {
        Self::connect_with(url, ClientConfig::default()).await
    }

    /// Like [`connect`](Self::connect), with explicit time bounds and certificates.
    pub async fn connect_with(url: &str, config: ClientConfig) -> Result<LockInspector, LockError> {
        let target = Target::server(url, &config).map_err(unreachable)?;
        Self::connect_to(target, None, config).await
    }

    /// A Redis Cluster, from the URLs of some of its nodes, as
    /// [`LockClient::cluster`](crate::LockClient::cluster) takes them. Listing
    /// scans every primary.
    pub async fn cluster<I>(urls: I) -> Result<LockInspector, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::cluster_with(urls, ClientConfig::default()).await
    }

    /// Like [`cluster`](Self::cluster), with explicit time bounds and certificates.
    pub async fn cluster_with<I>(urls: I, config: ClientConfig) -> Result<LockInspector, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let urls: Vec<String> = urls
            .into_iter()
            .map(|url| url.as_ref().to_owned())
            .collect();
        Self::connect_to(Target::cluster(urls.clone()), Some(urls), config).await
    }

    /// The primary that the Sentinels at `sentinel_urls` name for `primary_name`, as
    /// [`LockClient::sentinel`](crate::LockClient::sentinel) reaches it.
    pub async fn sentinel<I>(
        sentinel_urls: I,
        primary_name: &str,
    ) -> Result<LockInspector, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::sentinel_with(sentinel_urls, primary_name, ClientConfig::default()).await
    }

    /// Like [`sentinel`](Self::sentinel), with explicit time bounds and certificates.
    pub async fn sentinel_with<I>(
        sentinel_urls: I,
        primary_name: &str,
        config: ClientConfig,
    ) -> Result<LockInspector, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let urls = sentinel_urls
            .into_iter()
            .map(|url| url.as_ref().to_owned())
            .collect();
        let target = Target::sentinel(urls, primary_name, &config).map_err(unreachable)?;
        Self::connect_to(target, None, config).await
    }

    async fn connect_to(
        target: Target,
        cluster: Option<Vec<String>>,
        config: ClientConfig,
    ) -> Result<LockInspector, LockError> {
        let connection = bounded(config.connecting_bound(), target.connect(&config))
            .await
            .map_err(unreachable)?;
        Ok(LockInspector {
            connection,
            cluster,
            config,
        })
    }

    /// The held locks whose keys start with `prefix` (`""` for all), by key. Finds
    /// them with `SCAN` (on a Cluster, on every primary), which never blocks Redis
    /// as `KEYS` would; a lock taken or freed meanwhile may be missed or shown.
    pub async fn locks(&self, prefix: &str) -> Result<Vec<LockState>, LockError> {
        let pattern = scan_pattern(prefix)?;
        let limit = self.config.command_timeout;
        let mut names = BTreeSet::new();
        match &self.cluster {
            None => scan(&mut self.connection.clone(), &pattern, limit, &mut names).await,
            Some(urls) => {
                let mut primaries = self.primaries(urls).await?;
                for primary in &mut primaries {
                    scan(primary, &pattern, limit, &mut names).await?;
                }
                Ok(())
            }
        }
        .map_err(unreachable)?;
        let mut locks = Vec::new();
        for key in names.iter().filter_map(|name| key_of(name)) {
            if key.starts_with(prefix)
                && let Some(lock) = self.lock(&key).await?
            {
                locks.push(lock);
            }
        }
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(locks)
    }

    /// The lock on `key` as it stands, with its holders and queue; `None` when
    /// nobody holds it.
    pub async fn lock(&self, key: &str) -> Result<Option<LockState>, LockError> {
        let name = LockName::new(key)?;
        let mut connection = self.connection.clone();
        let (queue, fence) = (name.queue(), name.fence());
        let invocation = ScriptCall::new(&READ_LOCK, &[name.hash(), &queue, &fence]);
        let read = bounded(
            self.config.command_timeout,
            invocation.invoke::<Read>(&mut connection),
        )
        .await
        .map_err(|source| LockError::Backend {
            key: Some(key.to_owned()),
            source,
        })?;
        Ok(read.state(key))
    }

    /// A connection to each primary of the Cluster, with the first URL's
    /// credentials and TLS.
    async fn primaries(&self, urls: &[String]) -> RedisResult<Vec<MultiplexedConnection>> {
        let mut connection = self.connection.clone();
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let slots = bounded(
            self.config.command_timeout,
            connection.query::<Vec<Vec<Value>>>(&slots),
        )
        .await?;
        let template = urls
            .first()
            .map(String::as_str)
            .unwrap_or_default()
            .into_connection_info()?;
        let mut addresses = BTreeSet::new();
        for range in slots {
            if let Some(Value::Array(primary)) = range.get(2)
                && let [host, Value::Int(port), ..] = primary.as_slice()
            {
                let host: String = redis::from_redis_value_ref(host)?;
                addresses.insert((host, *port as u16));
            }
        }
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.config.connect_timeout))
            .set_response_timeout(Some(self.config.command_timeout));
        let mut primaries = Vec::new();
        for (host, port) in addresses {
            let client = open(at(&template, host, port), &self.config)?;
            primaries.push(
                client
                    .get_multiplexed_async_connection_with_config(&connection_config)
                    .await?,
            );
        }
        Ok(primaries)
    }
}

impl std::fmt::Debug for LockInspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockInspector")
            .field("cluster", &self.cluster.is_some())
            .finish_non_exhaustive()
    }
}

/// What [`READ_LOCK`] answers.
struct Read {
    now_us: u64,
    kind: String,
    pttl: i64,
    holders: Vec<String>,
    queue: Vec<String>,
    fence: String,
}

impl redis::FromRedisValue for Read {
    fn from_redis_value(value: Value) -> Result<Self, redis::ParsingError> {
        let (seconds, micros, kind, pttl, holders, queue, fence): (
            u64,
            u64,
            String,
            i64,
            Vec<String>,
            Vec<String>,
            String,
        ) = redis::from_redis_value(value)?;
        Ok(Read {
            now_us: seconds * 1_000_000 + micros,
            kind,
            pttl,
            holders,
            queue,
            fence,
        })
    }
}

impl Read {
    fn state(self, key: &str) -> Option<LockState> {
        let now_ms = self.now_us / 1000;
        let (kind, holders) = match self.kind.as_str() {
            "string" => {
                let token = self.holders.into_iter().next()?;
                let lease_left = millis(self.pttl);
                (kind_of(&token), vec![holder(token, lease_left)])
            }
            "zset" => {
                // Holders whose lease ended stay in the set until a script drops them.
                let holders: Vec<Holder> = pairs(self.holders)
                    .filter(|(_, ends)| *ends > now_ms)
                    .map(|(token, ends)| holder(token, Some(Duration::from_millis(ends - now_ms))))
                    .collect();
                (kind_of(&holders.first()?.token), holders)
            }
            "hash" => (LockKind::Legacy, Vec::new()),
            _ => return None,
        };
        let queue = pairs(self.queue)
            .map(|(token, since_us)| Waiter {
                client: client_of(&token),
                kind: kind_of(&token),
                waited: Duration::from_micros(self.now_us.saturating_sub(since_us)),
                token,
            })
            .collect();
        Some(LockState {
            key: key.to_owned(),
            kind,
            lease_left: millis(self.pttl),
            holders,
            queue,
            fence: self.fence.parse().ok(),
        })
    }
}

fn holder(token: String, lease_left: Option<Duration>) -> Holder {
    Holder {
        client: client_of(&token),
        token,
        lease_left,
    }
}

/// A sorted set read `WITHSCORES`, as (member, score) with whole scores.
fn pairs(flat: Vec<String>) -> impl Iterator<Item = (String, u64)> {
    let mut flat = flat.into_iter();
    std::iter::from_fn(move || {
        let member = flat.next()?;
        let score = flat.next()?;
        Some((member, score.parse::<f64>().map_or(0, |score| score as u64)))
    })
}

fn millis(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

fn kind_of(token: &str) -> LockKind {
    match Kind::of_token(token) {
        Kind::Exclusive => LockKind::Exclusive,
        Kind::Shared => LockKind::Shared,
        Kind::Permit(permits) => LockKind::Semaphore { permits },
    }
}

fn client_of(token: &str) -> String {
    token.split(':').next().unwrap_or_default().to_owned()
}

/// The `SCAN` pattern of the lock keys (not their companions) whose keys start with
/// `prefix`: the prefix encoded as in a lock's name, then glob-escaped.
fn scan_pattern(prefix: &str) -> Result<String, LockError> {
    let encoded = match prefix {
        "" => "lock:{".to_owned(),
        prefix => {
            let name = LockName::new(prefix)?;
            name.hash()[..name.hash().len() - 1].to_owned()
        }
    };
    let mut pattern = String::with_capacity(encoded.len() + 8);
    for c in encoded.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    // A lock key ends at its tag's `}`; its companions go on after it.
    pattern.push_str("*}");
    Ok(pattern)
}

/// The key whose lock key is `name`; `None` for a companion (`lock:{...}:fence`)
/// or any other name.
fn key_of(name: &str) -> Option<String> {
    let tag = name.strip_prefix("lock:{")?.strip_suffix('}')?;
    if tag.contains('}') {
        return None;
    }
    let mut key = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(at) = rest.find('%') {
        key.push_str(&rest[..at]);
        key.push(match rest.get(at..at + 3)? {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    key.push_str(rest);
    (!key.is_empty()).then_some(key)
}

async fn scan(
    connection: &mut (impl ConnectionLike + Send),
    pattern: &str,
    limit: Duration,
    names: &mut BTreeSet<String>,
) -> RedisResult<()> {
    let mut cursor = 0_u64;
    loop {
        let mut call = redis::cmd("SCAN");
        call.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, batch): (u64, Vec<Vec<u8>>) =
            bounded(limit, call.query_async(connection)).await?;
        names.extend(
            batch
                .into_iter()
                .filter_map(|name| String::from_utf8(name).ok()),
        );
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// `template`'s credentials, database and TLS, at `host:port`.
fn at(template: &ConnectionInfo, host: String, port: u16) -> ConnectionInfo {
    let addr = match template.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: None,
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    template.clone().set_addr(addr)
}

fn open(info: ConnectionInfo, config: &ClientConfig) -> RedisResult<Client> {
    #[cfg(feature = "tls")]
    if let Some(certificates) = &config.tls_certificates {
        return Client::build_with_tls(info, certificates.clone());
    }
    #[cfg(not(feature = "tls"))]
    let _ = config;
    Client::open(info)
}

fn unreachable(source: RedisError) -> LockError {
    LockError::Backend { key: None, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_name_decodes_to_its_key() {
        for key in ["order:42", r"transfer:a\:b:c", "x}y{z%", "%7D", "锁:🔒"] {
            let name = LockName::new(key).unwrap();
            assert_eq!(key_of(name.hash()).as_deref(), Some(key));
            for companion in [
                name.fence(),
                name.queue(),
                format!("{}:synced", name.hash()),
            ] {
                assert_eq!(key_of(&companion), None, "{companion}");
            }
        }
        assert_eq!(key_of("lock:{}"), None);
        assert_eq!(key_of("lock:{a%41}"), None);
        assert_eq!(key_of("orders:{a}"), None);
    }

    #[test]
    fn the_scan_pattern_escapes_globs_and_matches_lock_keys_only() {
        assert_eq!(scan_pattern("").unwrap(), "lock:{*}");
        assert_eq!(scan_pattern("order:").unwrap(), "lock:{order:*}");
        assert_eq!(scan_pattern("a*b?[c]{").unwrap(), r"lock:{a\*b\?\[c\]%7B*}");
    }

    #[test]
    fn tokens_say_what_they_ask_for() {
        assert_eq!(kind_of("c1:7"), LockKind::Exclusive);
        assert_eq!(kind_of("c1:7:shared"), LockKind::Shared);
        assert_eq!(
            kind_of("c1:7:permits=5"),
            LockKind::Semaphore { permits: 5 }
        );
        assert_eq!(client_of("c1:7:permits=5"), "c1");
    }
}
