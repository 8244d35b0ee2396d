//! The seam between the lock logic and where locks live. Every backend keeps the same
//! data model: one owner per lock with a hold count, a lease, and a fencing counter.

mod memory;
mod redis;
mod signals;

use std::time::Duration;

use tokio::sync::watch;

pub(crate) use self::memory::MemoryBackend;
pub(crate) use self::redis::RedisBackend;
use crate::LockError;
use crate::key::LockName;

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours; the fencing token when one was asked for.
    Granted { fence: Option<u64> },
    /// Another owner holds it, for at most this long (when known).
    Busy { expires_in: Option<Duration> },
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// The lock is free now.
    Freed,
    /// The owner still holds it: it had been taken more than once.
    StillHeld,
    /// The owner did not hold it; nothing was changed.
    NotHeld,
}

pub(crate) enum Backend {
    Redis(RedisBackend),
    Memory(MemoryBackend),
}

impl Backend {
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        fencing: bool,
    ) -> Result<Attempt, LockError> {
        match self {
            Backend::Redis(redis) => redis.acquire(name, owner, lease, fencing).await,
            Backend::Memory(memory) => Ok(memory.acquire(name, owner, lease, fencing)),
        }
    }

    pub(crate) async fn release(&self, name: &LockName, owner: &str) -> Result<Release, LockError> {
        match self {
            Backend::Redis(redis) => redis.release(name, owner).await,
            Backend::Memory(memory) => Ok(memory.release(name, owner)),
        }
    }

    /// Resets the lease to `lease` from now if `owner` still holds the lock.
    pub(crate) async fn renew(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Redis(redis) => redis.renew(name, owner, lease).await,
            Backend::Memory(memory) => Ok(memory.renew(name, owner, lease)),
        }
    }

    /// Listens for releases of `name`: the counter goes up with each one. Every
    /// subscription is ended with one `unsubscribe`.
    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
    ) -> Result<watch::Receiver<u64>, LockError> {
        match self {
            Backend::Redis(redis) => redis.subscribe(name).await,
            Backend::Memory(memory) => Ok(memory.subscribe(name)),
        }
    }

    pub(crate) fn unsubscribe(&self, name: &LockName) {
        match self {
            Backend::Redis(redis) => redis.unsubscribe(name),
            Backend::Memory(memory) => memory.unsubscribe(name),
        }
    }
}

fn lease_ms(lease: Duration) -> u64 {
    lease.as_millis().try_into().unwrap_or(u64::MAX)
}
