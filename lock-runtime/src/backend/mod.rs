//! The seam between the lock logic and where locks live. Every store keeps the same
//! data model: a lock is held under one acquisition's token with a lease, beside a
//! fencing counter; releases are signalled to the waiters of this process.
//!
//! Calls that take or free a lock run detached from their callers: a caller dropped
//! at an await leaves no lock behind, since a grant that nobody waits for any more is
//! released when it arrives.

mod background;
mod connection;
mod memory;
mod redis;
mod redlock;
mod signals;

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{Mutex, oneshot, watch};
use tokio::task::JoinHandle;

pub(crate) use self::background::Background;
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
    /// Another acquisition holds it; it is worth trying again in this long at the
    /// latest. With fencing, the last token issued for the key.
    Busy {
        retry_in: Option<Duration>,
        fence: Option<u64>,
    },
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
    background: Background,
}

/// Release signals of one lock, listened for until this is dropped.
pub(crate) struct Subscription {
    backend: Arc<Backend>,
    name: Arc<LockName>,
    releases: watch::Receiver<u64>,
}

impl Backend {
    /// `signals` must be the ones the store's release notifications go to.
    pub(crate) fn new(store: Store, signals: Arc<Signals>) -> Arc<Backend> {
        Arc::new(Backend {
            store,
            signals,
            changes: Mutex::new(()),
            background: Background::default(),
        })
    }

    pub(crate) fn kind(&self) -> &'static str {
        match &self.store {
            Store::Redis(node) => node.kind(),
            Store::Memory(_) => "memory",
            Store::Redlock(_) => "redlock",
        }
    }

    pub(crate) fn background(&self) -> &Background {
        &self.background
    }

    /// Tries to take `name` under `token`. The request runs detached: if the caller
    /// is gone when it is granted, or the answer is an error (the request may still
    /// have been applied), the token's lock is released.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        name: &Arc<LockName>,
        token: &Arc<str>,
        lease: Duration,
        fencing: bool,
    ) -> Result<Attempt, LockError> {
        if let Store::Memory(memory) = &self.store {
            return Ok(memory.acquire(name, token, lease, fencing));
        }
        let (answer, answered) = oneshot::channel();
        let (backend, detached_name, token) = (self.clone(), name.clone(), token.clone());
        self.background.spawn_on(&Handle::current(), async move {
            let name = detached_name;
            let attempt = backend.acquire_now(&name, &token, lease, fencing).await;
            let granted = matches!(attempt, Ok(Attempt::Granted { .. }));
            // An error may come after the request reached Redis: clean up after it too.
            let failed = attempt.is_err();
            let orphaned = answer.send(attempt).is_err();
            if failed || (granted && orphaned) {
                let _ = backend.release(&name, &token).await;
            }
        });
        answered.await.unwrap_or_else(|_| {
            let stopped =
                ::redis::RedisError::from((::redis::ErrorKind::Io, "the runtime is shutting down"));
            Err(LockError::backend(&name.key, stopped))
        })
    }

    async fn acquire_now(
        &self,
        name: &LockName,
        token: &str,
        lease: Duration,
        fencing: bool,
    ) -> Result<Attempt, LockError> {
        match &self.store {
            Store::Redis(node) => node.acquire(name, token, lease, fencing).await,
            Store::Memory(memory) => Ok(memory.acquire(name, token, lease, fencing)),
            Store::Redlock(redlock) => redlock.acquire(name, token, lease, fencing).await,
        }
    }

    /// Frees `name` if `token` holds it, and wakes its waiters: true when it did.
    pub(crate) async fn release(&self, name: &LockName, token: &str) -> Result<bool, LockError> {
        match &self.store {
            Store::Redis(node) => node.release(name, token, true).await,
            Store::Memory(memory) => Ok(memory.release(name, token)),
            Store::Redlock(redlock) => redlock.release(name, token, true).await,
        }
    }

    /// Runs `release` detached on `runtime`, so that it completes however its caller
    /// ends, then `after`.
    pub(crate) fn release_detached(
        self: &Arc<Self>,
        runtime: &Handle,
        name: Arc<LockName>,
        token: Arc<str>,
        after: impl FnOnce() + Send + 'static,
    ) -> JoinHandle<Result<bool, LockError>> {
        let backend = self.clone();
        self.background.spawn_on(runtime, async move {
            let released = backend.release(&name, &token).await;
            after();
            released
        })
    }

    /// Resets the lease to `lease` from now if `token` still holds the lock.
    pub(crate) async fn renew(
        &self,
        name: &LockName,
        token: &str,
        lease: Duration,
    ) -> Result<bool, LockError> {
        match &self.store {
            Store::Redis(node) => node.renew(name, token, lease).await,
            Store::Memory(memory) => Ok(memory.renew(name, token, lease)),
            Store::Redlock(redlock) => redlock.renew(name, token, lease).await,
        }
    }

    /// Listens for releases of `name` until the subscription is dropped.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        name: &Arc<LockName>,
    ) -> Result<Subscription, LockError> {
        let _changing = self.changes.lock().await;
        let (releases, first) = self.signals.join(&name.channel);
        // From here on, however this call ends, dropping the subscription stops it.
        let subscription = Subscription {
            backend: self.clone(),
            name: name.clone(),
            releases,
        };
        if first {
            match &self.store {
                Store::Redis(node) => node.listen(name).await?,
                Store::Memory(_) => {}
                Store::Redlock(redlock) => redlock.listen(name).await?,
            }
        }
        Ok(subscription)
    }

    async fn unsubscribe(&self, name: &LockName) {
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

impl Subscription {
    /// Goes up with each release.
    pub(crate) fn releases(&self) -> watch::Receiver<u64> {
        self.releases.clone()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Outside a runtime the client is going away, and its connections with it.
        if let Ok(runtime) = Handle::try_current() {
            let (backend, name) = (self.backend.clone(), self.name.clone());
            self.backend
                .background
                .spawn_on(&runtime, async move { backend.unsubscribe(&name).await });
        }
    }
}

fn lease_ms(lease: Duration) -> u64 {
    lease.as_millis().try_into().unwrap_or(u64::MAX)
}
