use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ErrorKind, RedisError, Script};
use std::sync::LazyLock;

use super::{Attempt, Release, lease_ms};
use crate::key::LockName;
use crate::{ClientConfig, LockError};

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/renew.lua")));

/// One Redis server over redis-rs' reconnecting connection manager. Every call is one
/// round trip (`EVALSHA`; the script is loaded again after a restart wipes it).
pub(crate) struct RedisBackend {
    connection: ConnectionManager,
    command_timeout: Duration,
}

impl RedisBackend {
    pub(crate) async fn connect(url: &str, config: &ClientConfig) -> Result<Self, LockError> {
        let unreachable = |source| LockError::Backend { key: None, source };
        let client = Client::open(url).map_err(unreachable)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.command_timeout))
            .set_number_of_retries(1)
            .set_max_delay(config.command_timeout);
        let connecting = ConnectionManager::new_with_config(client, manager_config);
        let connection = bounded(config.connect_timeout, connecting)
            .await
            .map_err(unreachable)?;
        Ok(RedisBackend {
            connection,
            command_timeout: config.command_timeout,
        })
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
        bounded(self.command_timeout, call)
            .await
            .map_err(|source| LockError::backend(&name.key, source))
    }
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
