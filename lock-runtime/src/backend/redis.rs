use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ErrorKind, ProtocolVersion, PushInfo, PushKind, RedisError, Script, Value};
use tokio::sync::{Mutex, OnceCell, watch};

use super::signals::Signals;
use super::{Attempt, Release, lease_ms};
use crate::key::LockName;
use crate::{ClientConfig, LockError};

const ACQUIRE_LUA: &str = include_str!("../scripts/acquire.lua");
const RELEASE_LUA: &str = include_str!("../scripts/release.lua");
const RENEW_LUA: &str = include_str!("../scripts/renew.lua");
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));

/// One Redis server over redis-rs' reconnecting connection manager. Every call is one
/// round trip (`EVALSHA`; the script is loaded again after a restart wipes it).
pub(crate) struct RedisBackend {
    client: Client,
    config: ClientConfig,
    connection: ConnectionManager,
    subscriber: OnceCell<Subscriber>,
}

/// The client's one pub/sub connection, made when a task first has to wait. A
/// channel is subscribed while some task of this client waits on it.
struct Subscriber {
    connection: ConnectionManager,
    signals: Arc<Signals>,
    /// Subscribing and unsubscribing run one at a time, each with its change to the
    /// watcher counts, so Redis always ends up subscribed to the watched channels.
    changes: Arc<Mutex<()>>,
}

impl RedisBackend {
    pub(crate) async fn connect(url: &str, config: &ClientConfig) -> Result<Self, LockError> {
        let unreachable = |source| LockError::Backend { key: None, source };
        let client = Client::open(url).map_err(unreachable)?;
        let connecting = ConnectionManager::new_with_config(client.clone(), manager_config(config));
        let mut connection = bounded(config.connect_timeout, connecting)
            .await
            .map_err(unreachable)?;
        // Loaded up front so that the first lock costs one round trip, not three.
        let mut load = redis::pipe();
        for script in [ACQUIRE_LUA, RELEASE_LUA, RENEW_LUA] {
            load.cmd("SCRIPT").arg("LOAD").arg(script);
        }
        let _hashes: Vec<String> =
            bounded(config.command_timeout, load.query_async(&mut connection))
                .await
                .map_err(unreachable)?;
        Ok(RedisBackend {
            client,
            config: config.clone(),
            connection,
            subscriber: OnceCell::new(),
        })
    }

    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
    ) -> Result<watch::Receiver<u64>, LockError> {
        let subscriber = self
            .subscriber
            .get_or_try_init(|| Subscriber::connect(&self.client, &self.config))
            .await
            .map_err(|source| LockError::backend(&name.key, source))?;
        let _changing = subscriber.changes.lock().await;
        let (releases, first) = subscriber.signals.join(&name.channel);
        if first {
            let mut connection = subscriber.connection.clone();
            let subscribed = self.run(name, connection.subscribe(&name.channel)).await;
            if let Err(error) = subscribed {
                subscriber.signals.leave(&name.channel);
                return Err(error);
            }
        }
        Ok(releases)
    }

    pub(crate) fn unsubscribe(&self, name: &LockName) {
        let Some(subscriber) = self.subscriber.get() else {
            return;
        };
        let (signals, changes) = (subscriber.signals.clone(), subscriber.changes.clone());
        let mut connection = subscriber.connection.clone();
        let (channel, limit) = (name.channel.clone(), self.config.command_timeout);
        // Outside a runtime the connection is going away with it, and the channel too.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let _changing = changes.lock().await;
            if signals.leave(&channel) {
                let _ = bounded(limit, connection.unsubscribe(&channel)).await;
            }
        });
    }

    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        fencing: bool,
    ) -> Result<Attempt, LockError> {
        let mut invocation = ACQUIRE.key(&name.hash);
        invocation
            .key(&name.fence)
            .arg(owner)
            .arg(lease_ms(lease))
            .arg(if fencing { "1" } else { "0" });
        let mut connection = self.connection.clone();
        let (granted, value): (i64, i64) = self
            .run(name, invocation.invoke_async(&mut connection))
            .await?;
        Ok(if granted == 1 {
            Attempt::Granted {
                fence: fencing.then_some(value as u64),
            }
        } else {
            Attempt::Busy {
                expires_in: u64::try_from(value).ok().map(Duration::from_millis),
            }
        })
    }

    pub(crate) async fn release(&self, name: &LockName, owner: &str) -> Result<Release, LockError> {
        let mut invocation = RELEASE.key(&name.hash);
        invocation.key(&name.channel).arg(owner).arg("PUBLISH");
        let mut connection = self.connection.clone();
        let left: i64 = self
            .run(name, invocation.invoke_async(&mut connection))
            .await?;
        Ok(match left {
            0 => Release::Freed,
            n if n > 0 => Release::StillHeld,
            _ => Release::NotHeld,
        })
    }

    pub(crate) async fn renew(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, LockError> {
        let mut invocation = RENEW.key(&name.hash);
        invocation.arg(owner).arg(lease_ms(lease));
        let mut connection = self.connection.clone();
        let renewed: i64 = self
            .run(name, invocation.invoke_async(&mut connection))
            .await?;
        Ok(renewed == 1)
    }

    async fn run<T>(
        &self,
        name: &LockName,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        bounded(self.config.command_timeout, call)
            .await
            .map_err(|source| LockError::backend(&name.key, source))
    }
}

impl Subscriber {
    async fn connect(client: &Client, config: &ClientConfig) -> redis::RedisResult<Subscriber> {
        let info = client.get_connection_info().clone();
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = Client::open(info.set_redis_settings(resp3))?;
        let signals = Arc::new(Signals::default());
        let pushes = signals.clone();
        let config = manager_config(config)
            .set_push_sender(move |push: PushInfo| {
                on_push(&pushes, push);
                Ok::<(), redis::aio::SendError>(())
            })
            .set_automatic_resubscription();
        let connection = bounded(
            config
                .connection_timeout()
                .unwrap_or(Duration::from_secs(2)),
            ConnectionManager::new_with_config(client, config),
        )
        .await?;
        Ok(Subscriber {
            connection,
            signals,
            changes: Arc::default(),
        })
    }
}

/// A release message wakes that lock's waiters. A dropped connection may have lost
/// messages, so it wakes them all to look again.
fn on_push(signals: &Signals, push: PushInfo) {
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            if let Some(Value::BulkString(channel)) = push.data.first() {
                if let Ok(channel) = std::str::from_utf8(channel) {
                    signals.notify(channel);
                }
            }
        }
        PushKind::Disconnection => signals.notify_all(),
        _ => {}
    }
}

fn manager_config(config: &ClientConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.command_timeout))
        .set_number_of_retries(1)
        .set_max_delay(config.command_timeout)
}

/// Redis calls may wait on a reconnect; this caps the whole call, not just one read.
async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(RedisError::from((
            ErrorKind::Io,
            "no answer from Redis in time",
            format!("gave up after {} ms", limit.as_millis()),
        ))),
    }
}
