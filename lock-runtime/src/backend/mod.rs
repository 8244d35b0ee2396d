//! The seam between the lock logic and where locks live. Every store keeps the same
//! data model: one owner per lock with a hold count, a lease, and a fencing counter;
//! releases are signalled to the waiters of this client.

mod connection;
mod memory;
mod redis;
mod redlock;
mod signals;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, watch};

pub(crate) use self::connection::Target;
pub(crate) use self::memory::MemoryStore;
pub(crate) use self::redis::RedisNode;
pub(crate) use self::redlock::Redlock;
pub(crate) use self::signals::Signals;
use crate::LockError;
use crate::key::LockName;

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours; the fencing token when one was asked for.
    Granted { fence: Option<u64> },
    /// Another owner holds it; it is worth trying again in this long at the latest.
    /// With fencing, the last token issued for the key.
    Busy {
        retry_in: Option<Duration>,
        fence: Option<u64>,
    },
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

pub(crate) enum Store {
    Redis(RedisNode),
    Memory(MemoryStore),
    Redlock(Redlock),
}

pub(crate) struct Backend {
    store: Store,
    signals: Arc<Signals>,
    /// Listening and unlistening run one at a time, each with its change to the
    /// watcher counts, so the store ends up listening to exactly the watched channels.
    changes: Mutex<()>,
}

impl Backend {
    /// `signals` must be the ones the store's release notifications go to.
    pub(crate) fn new(store: Store, signals: Arc<Signals>) -> Backend {
        Backend {
            store,
            signals,
            changes: Mutex::new(()),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match &self.store {
            Store::Redis(node) => node.kind(),
            Store::Memory(_) => "memory",
            Store::Redlock(_) => "redlock",
        }
    }

    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        fencing: bool,
    ) -> Result<Attempt, LockError> {
        match &self.store {
            Store::Redis(node) => node.acquire(name, owner, lease, fencing).await,
            Store::Memory(memory) => Ok(memory.acquire(name, owner, lease, fencing)),
            Store::Redlock(redlock) => redlock.acquire(name, owner, lease, fencing).await,
        }
    }

    pub(crate) async fn release(&self, name: &LockName, owner: &str) -> Result<Release, LockError> {
        match &self.store {
            Store::Redis(node) => node.release(name, owner, true).await,
            Store::Memory(memory) => Ok(memory.release(name, owner)),
            Store::Redlock(redlock) => redlock.release(name, owner, true).await,
        }
    }

    /// Resets the lease to `lease` from now if `owner` still holds the lock.
    pub(crate) async fn renew(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, LockError> {
        match &self.store {
            Store::Redis(node) => node.renew(name, owner, lease).await,
            Store::Memory(memory) => Ok(memory.renew(name, owner, lease)),
            Store::Redlock(redlock) => redlock.renew(name, owner, lease).await,
        }
    }

    /// Listens for releases of `name`: the counter goes up with each one. Every
    /// subscription is ended with one `unsubscribe`.
    pub(crate) async fn subscribe(
        &self,
        name: &LockName,
    ) -> Result<watch::Receiver<u64>, LockError> {
        let _changing = self.changes.lock().await;
        let (releases, first) = self.signals.join(&name.channel);
        if first {
            let listening = match &self.store {
                Store::Redis(node) => node.listen(name).await,
                Store::Memory(_) => Ok(()),
                Store::Redlock(redlock) => redlock.listen(name).await,
            };
            if let Err(error) = listening {
                self.signals.leave(&name.channel);
                return Err(error);
            }
        }
        Ok(releases)
    }

    pub(crate) async fn unsubscribe(&self, name: &LockName) {
        let _changing = self.changes.lock().await;
        if self.signals.leave(&name.channel) {
            match &self.store {
                Store::Redis(node) => node.unlisten(name).await,
                Store::Memory(_) => {}
                Store::Redlock(redlock) => redlock.unlisten(name).await,
            }
        }
    }
}

fn lease_ms(lease: Duration) -> u64 {
    lease.as_millis().try_into().unwrap_or(u64::MAX)
}
