use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ErrorKind, FromRedisValue, ProtocolVersion, PushInfo, PushKind, RedisError, Script,
    ScriptInvocation, Value,
};
use tokio::sync::OnceCell;

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
static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/raise_fence.lua")));

/// One Redis server over redis-rs' reconnecting connection manager. Every call is one
/// round trip (`EVALSHA`; the script is loaded again after a restart wipes it).
pub(crate) struct RedisNode {
    client: Client,
    config: ClientConfig,
    connection: ConnectionManager,
    /// The pub/sub connection, made when a task first has to wait.
    subscriber: OnceCell<ConnectionManager>,
    signals: Arc<Signals>,
}

impl RedisNode {
    /// Connects now, failing within the connect timeout when Redis is unreachable.
    pub(crate) async fn connect(
        url: &str,
        config: &ClientConfig,
        signals: Arc<Signals>,
    ) -> Result<Self, LockError> {
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
        Ok(Self::with_connection(client, connection, config, signals))
    }

    /// Connects on first use: for a Redlock node that may be down at start-up.
    pub(crate) fn lazy(
        url: &str,
        config: &ClientConfig,
        signals: Arc<Signals>,
    ) -> Result<Self, LockError> {
        let unreachable = |source| LockError::Backend { key: None, source };
        let client = Client::open(url).map_err(unreachable)?;
        let connection =
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(config))
                .map_err(unreachable)?;
        Ok(Self::with_connection(client, connection, config, signals))
    }

    fn with_connection(
        client: Client,
        connection: ConnectionManager,
        config: &ClientConfig,
        signals: Arc<Signals>,
    ) -> Self {
        RedisNode {
            client,
            config: config.clone(),
            connection,
            subscriber: OnceCell::new(),
            signals,
        }
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
        let reply: Vec<i64> = self
            .run(name, invocation.invoke_async(&mut connection))
            .await?;
        Ok(match reply[..] {
            [1, token, ..] => Attempt::Granted {
                fence: fencing.then_some(token as u64),
            },
            [_, pttl, counter, ..] => Attempt::Busy {
                retry_in: u64::try_from(pttl).ok().map(Duration::from_millis),
                fence: fencing.then_some(counter as u64),
            },
            _ => {
                let detail = format!("{reply:?}");
                let error = RedisError::from((
                    ErrorKind::Parse,
                    "unexpected reply from the acquire script",
                    detail,
                ));
                return Err(LockError::backend(&name.key, error));
            }
        })
    }

    /// `notify` publishes the release to waiters when it frees the lock.
    pub(crate) async fn release(
        &self,
        name: &LockName,
        owner: &str,
        notify: bool,
    ) -> Result<Release, LockError> {
        let mut invocation = RELEASE.key(&name.hash);
        invocation
            .key(&name.channel)
            .arg(owner)
            .arg(if notify { "PUBLISH" } else { "" });
        let left: i64 = self.invoke_idempotent(name, &invocation).await?;
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
        let renewed: i64 = self.invoke_idempotent(name, &invocation).await?;
        Ok(renewed == 1)
    }

    /// Raises the lock's fencing counter to at least `floor`.
    pub(crate) async fn raise_fence(&self, name: &LockName, floor: u64) -> Result<(), LockError> {
        let mut invocation = RAISE_FENCE.key(&name.fence);
        invocation.arg(floor);
        let _raised: i64 = self.invoke_idempotent(name, &invocation).await?;
        Ok(())
    }

    pub(crate) async fn listen(&self, name: &LockName) -> Result<(), LockError> {
        let subscriber = self
            .subscriber
            .get_or_try_init(|| {
                subscribe_connection(&self.client, &self.config, self.signals.clone())
            })
            .await
            .map_err(|source| LockError::backend(&name.key, source))?;
        let mut subscriber = subscriber.clone();
        self.run(name, subscriber.subscribe(&name.channel)).await
    }

    pub(crate) async fn unlisten(&self, name: &LockName) {
        if let Some(subscriber) = self.subscriber.get() {
            let mut subscriber = subscriber.clone();
            let _ = self.run(name, subscriber.unsubscribe(&name.channel)).await;
        }
    }

    /// For scripts that may safely run twice: a connection found dropped (Redis
    /// restarted, say) is retried once on the reconnected one.
    async fn invoke_idempotent<T: FromRedisValue>(
        &self,
        name: &LockName,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        let limit = self.config.command_timeout;
        let mut connection = self.connection.clone();
        match bounded(limit, invocation.invoke_async(&mut connection)).await {
            Err(error) if error.is_connection_dropped() => {
                let mut connection = self.connection.clone();
                bounded(limit, invocation.invoke_async(&mut connection)).await
            }
            answer => answer,
        }
        .map_err(|source| LockError::backend(&name.key, source))
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

/// The node's one pub/sub connection (RESP3, so pushes arrive beside replies),
/// resubscribing after a reconnect.
async fn subscribe_connection(
    client: &Client,
    config: &ClientConfig,
    signals: Arc<Signals>,
) -> redis::RedisResult<ConnectionManager> {
    let info = client.get_connection_info().clone();
    let resp3 = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let client = Client::open(info.set_redis_settings(resp3))?;
    let manager_config = manager_config(config)
        .set_push_sender(move |push: PushInfo| {
            on_push(&signals, push);
            Ok::<(), redis::aio::SendError>(())
        })
        .set_automatic_resubscription();
    bounded(
        config.connect_timeout,
        ConnectionManager::new_with_config(client, manager_config),
    )
    .await
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
