//! The implementations compared, behind one interface so that every scenario runs
//! the same code for each.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockGuard, LockOptions};
use redis::AsyncConnectionConfig;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{Client, Script};
use rslock::LockManager;

/// The lease every implementation takes, so none expires during a run.
pub(crate) const LEASE: Duration = Duration::from_secs(30);
/// The fixed lease of the pair the everyday path is measured by (issue 19): ours with
/// no watchdog against the careful raw protocol.
const FIXED_LEASE: Duration = Duration::from_secs(10);
/// The longest any acquire may wait before the bench counts it as failed.
pub(crate) const ACQUIRE_CAP: Duration = Duration::from_secs(120);
/// rslock's attempts per `lock` call: high enough never to run out within the cap.
pub(crate) const RSLOCK_RETRIES: u32 = 100_000;
/// rslock's own default, as documented in its source.
pub(crate) const RSLOCK_DEFAULT_DELAY: Duration = Duration::from_millis(200);
pub(crate) const RSLOCK_FAST_DELAY: Duration = Duration::from_millis(10);
/// The same time bounds as `lock_runtime::ClientConfig`'s defaults.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

static COMPARE_AND_DELETE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(COMPARE_AND_DELETE));

/// The SHA1 of lock-runtime's script called `name`.
fn library_script(name: &str) -> &'static str {
    lock_runtime::__script_hashes()
        .into_iter()
        .find(|(script, _)| *script == name)
        .map(|(_, sha1)| sha1)
        .expect("lock-runtime has the script")
}

/// The SHA1 of lock-runtime's first request of every release on Redis 7: its
/// compare-and-delete, followed by its release script only when others wait.
pub(crate) fn library_release_sha1() -> &'static str {
    library_script("release_alone")
}

/// What a script the bench knows does, by its SHA1: lock-runtime's acquire and
/// releases, and the raw protocol's compare-and-delete.
pub(crate) fn script_name(sha1: &str) -> Option<&'static str> {
    [
        (library_script("acquire"), "acquire script"),
        (library_script("release_alone"), "release-alone script"),
        (library_script("release"), "release script"),
        (COMPARE_AND_DELETE_SCRIPT.get_hash(), "compare-and-delete"),
    ]
    .into_iter()
    .find(|(hash, _)| hash.eq_ignore_ascii_case(sha1))
    .map(|(_, name)| name)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerKind {
    Library,
    /// Ours with a fixed lease and no watchdog.
    LibraryFixed,
    Raw,
    /// What a careful user writes by hand: one multiplexed connection with no
    /// response timeout, a uuid v4 token, `SET NX PX` and `EVALSHA` of the
    /// compare-and-delete.
    RawCareful,
    RslockDefault,
    RslockFast,
    /// No lock at all: the hot-key section run back to back by one task, the
    /// ceiling any lock can reach.
    SerialLimit,
}

impl PeerKind {
    pub(crate) const ALL: [PeerKind; 7] = [
        PeerKind::Library,
        PeerKind::LibraryFixed,
        PeerKind::Raw,
        PeerKind::RawCareful,
        PeerKind::RslockDefault,
        PeerKind::RslockFast,
        PeerKind::SerialLimit,
    ];

    /// The name on the command line of a worker process.
    pub(crate) fn id(self) -> &'static str {
        match self {
            PeerKind::Library => "library",
            PeerKind::LibraryFixed => "library-fixed",
            PeerKind::Raw => "raw",
            PeerKind::RawCareful => "raw-careful",
            PeerKind::RslockDefault => "rslock",
            PeerKind::RslockFast => "rslock-fast",
            PeerKind::SerialLimit => "serial",
        }
    }

    pub(crate) fn from_id(id: &str) -> Option<PeerKind> {
        PeerKind::ALL.into_iter().find(|kind| kind.id() == id)
    }

    pub(crate) fn label(self, raw_retry: Duration) -> String {
        match self {
            PeerKind::Library => "lock-runtime".to_owned(),
            PeerKind::LibraryFixed => format!(
                "lock-runtime, fixed {} s lease, no watchdog",
                FIXED_LEASE.as_secs()
            ),
            PeerKind::Raw => format!("raw SET NX + script, {} ms sleep", raw_retry.as_millis()),
            PeerKind::RawCareful => format!(
                "raw, careful: one connection, no timeout, {} ms sleep",
                raw_retry.as_millis()
            ),
            PeerKind::RslockDefault => format!(
                "rslock, default {} ms delay",
                RSLOCK_DEFAULT_DELAY.as_millis()
            ),
            PeerKind::RslockFast => {
                format!("rslock, {} ms delay", RSLOCK_FAST_DELAY.as_millis())
            }
            PeerKind::SerialLimit => "no lock, 1 task: the serial limit".to_owned(),
        }
    }
}

/// One connected implementation, shared by every task of a process.
pub(crate) enum Peer {
    Library {
        client: LockClient,
        options: LockOptions,
    },
    Raw {
        connection: ConnectionManager,
        retry: Duration,
    },
    RawCareful {
        connection: MultiplexedConnection,
        retry: Duration,
    },
    Rslock {
        manager: LockManager,
    },
    Unlocked,
}

/// A held lock, whoever took it.
pub(crate) enum Held {
    Library(LockGuard),
    Raw { key: String, token: String },
    Rslock(rslock::Lock),
    Nothing,
}

impl Peer {
    pub(crate) async fn connect(
        kind: PeerKind,
        url: &str,
        raw_retry: Duration,
    ) -> Result<Peer, String> {
        match kind {
            PeerKind::Library => {
                let client = LockClient::connect(url).await.map_err(|e| e.to_string())?;
                // Generous so that nothing times out; retries are then unbounded and
                // `retry_wait` stays at its 50 ms default.
                let options = LockOptions::new().timeout(ACQUIRE_CAP);
                Ok(Peer::Library { client, options })
            }
            PeerKind::LibraryFixed => {
                let client = LockClient::connect(url).await.map_err(|e| e.to_string())?;
                Ok(Peer::library_fixed(client))
            }
            PeerKind::RawCareful => {
                let client = Client::open(url).map_err(|e| e.to_string())?;
                Peer::raw_careful(&client, raw_retry).await
            }
            PeerKind::Raw => {
                let client = Client::open(url).map_err(|e| e.to_string())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CALL_TIMEOUT))
                    .set_response_timeout(Some(CALL_TIMEOUT));
                let connection = ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Peer::Raw {
                    connection,
                    retry: raw_retry,
                })
            }
            PeerKind::RslockDefault | PeerKind::RslockFast => {
                let client = Client::open(url).map_err(|e| e.to_string())?;
                let mut manager = LockManager::from_clients(vec![client]);
                let delay = if kind == PeerKind::RslockDefault {
                    RSLOCK_DEFAULT_DELAY
                } else {
                    RSLOCK_FAST_DELAY
                };
                manager.set_retry(RSLOCK_RETRIES, delay);
                Ok(Peer::Rslock { manager })
            }
            PeerKind::SerialLimit => Ok(Peer::Unlocked),
        }
    }

    /// Ours through the Sentinels at `sentinels`, which name the primary `name`, as
    /// [`PeerKind::Library`] is otherwise.
    pub(crate) async fn library_through_sentinel(
        sentinels: &[String],
        name: &str,
    ) -> Result<Peer, String> {
        let client = (LockClient::sentinel(sentinels, name).await).map_err(|e| e.to_string())?;
        let options = LockOptions::new().timeout(ACQUIRE_CAP);
        Ok(Peer::Library { client, options })
    }

    /// Ours with a fixed lease and no watchdog, on `client`.
    pub(crate) fn library_fixed(client: LockClient) -> Peer {
        let options = LockOptions::new().lease(FIXED_LEASE).timeout(ACQUIRE_CAP);
        Peer::Library { client, options }
    }

    /// The careful raw protocol on a connection of its own to `client`'s server.
    pub(crate) async fn raw_careful(client: &Client, retry: Duration) -> Result<Peer, String> {
        // redis-rs bounds every response by 500 ms unless told not to, which arms a
        // timer per request: the careful raw protocol has none.
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| e.to_string())?;
        COMPARE_AND_DELETE_SCRIPT
            .load_async(&mut connection)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Peer::RawCareful { connection, retry })
    }

    /// Waits until the lock on `key` is held, for at most [`ACQUIRE_CAP`].
    pub(crate) async fn acquire(&self, key: &str) -> Result<Held, String> {
        match self {
            Peer::Library { client, options } => client
                .acquire(key, options)
                .await
                .map(Held::Library)
                .map_err(|e| e.to_string()),
            Peer::Raw { connection, retry } => {
                let token = new_token();
                raw_acquire(connection, key, &token, LEASE, *retry).await?;
                Ok(Held::Raw {
                    key: key.to_owned(),
                    token,
                })
            }
            Peer::RawCareful { connection, retry } => {
                let token = uuid::Uuid::new_v4().to_string();
                raw_acquire(connection, key, &token, FIXED_LEASE, *retry).await?;
                Ok(Held::Raw {
                    key: key.to_owned(),
                    token,
                })
            }
            Peer::Rslock { manager } => {
                let lock = capped(async {
                    manager
                        .lock(key.as_bytes(), LEASE)
                        .await
                        .map_err(|e| e.to_string())
                })
                .await?;
                Ok(Held::Rslock(lock))
            }
            Peer::Unlocked => Ok(Held::Nothing),
        }
    }

    pub(crate) async fn release(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Peer::Library { .. }, Held::Library(guard)) => {
                guard.release().await.map_err(|e| e.to_string())
            }
            (Peer::Raw { connection, .. }, Held::Raw { key, token }) => {
                raw_release(connection, &key, &token).await
            }
            (Peer::RawCareful { connection, .. }, Held::Raw { key, token }) => {
                raw_release(connection, &key, &token).await
            }
            // Best effort by design: rslock reports nothing.
            (Peer::Rslock { manager }, Held::Rslock(lock)) => {
                manager.unlock(&lock).await;
                Ok(())
            }
            (Peer::Unlocked, Held::Nothing) => Ok(()),
            _ => Err("a lock released through another implementation".to_owned()),
        }
    }
}

/// The raw protocol's acquire: `SET NX PX` until it is granted, sleeping `retry`
/// between tries, for at most [`ACQUIRE_CAP`]. The cap is read between tries rather
/// than armed as a timer, so that a lock granted at once costs no timer: a request
/// that never returns is bounded by the connection's response timeout, where it has
/// one.
async fn raw_acquire(
    connection: &(impl ConnectionLike + Clone + Send + Sync),
    key: &str,
    token: &str,
    lease: Duration,
    retry: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + ACQUIRE_CAP;
    loop {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(lease.as_millis() as u64)
            .query_async(&mut connection.clone())
            .await
            .map_err(|e| e.to_string())?;
        if set.is_some() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(no_lock_in_time());
        }
        tokio::time::sleep(retry).await;
    }
}

/// The raw protocol's release: the compare-and-delete, by `EVALSHA`.
async fn raw_release(
    connection: &(impl ConnectionLike + Clone + Send + Sync),
    key: &str,
    token: &str,
) -> Result<(), String> {
    let deleted: i64 = COMPARE_AND_DELETE_SCRIPT
        .key(key)
        .arg(token)
        .invoke_async(&mut connection.clone())
        .await
        .map_err(|e| e.to_string())?;
    match deleted {
        1 => Ok(()),
        _ => Err(format!("{key} was no longer held at release")),
    }
}

async fn capped<T>(acquiring: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    match tokio::time::timeout(ACQUIRE_CAP, acquiring).await {
        Ok(result) => result,
        Err(_) => Err(no_lock_in_time()),
    }
}

fn no_lock_in_time() -> String {
    format!("no lock within {} s", ACQUIRE_CAP.as_secs())
}

/// Unique across the processes of a run: the process id and a counter.
fn new_token() -> String {
    static PROCESS: LazyLock<u32> = LazyLock::new(std::process::id);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}:{}", *PROCESS, NEXT.fetch_add(1, Ordering::Relaxed))
}
