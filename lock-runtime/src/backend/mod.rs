//! The seam between the lock logic and where locks live. Every store keeps the same
//! data model: a lock is held under one acquisition's token with a lease, beside a
//! fencing counter; releases are signalled to the waiters of this process.
//!
//! Calls that take or free a lock finish even when their callers stop waiting: a
//! caller dropped at an await leaves no lock behind, since a grant that nobody waits
//! for any more is released when it arrives.

mod background;
mod connection;
mod memory;
mod redis;
mod redlock;
mod signals;

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{Mutex, watch};

pub(crate) use self::background::{Background, Finishing, Orphan};
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

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The token did not hold the lock; nothing was changed.
    NotHeld,
    /// The lock is free; `others_waiting` when waiters of other processes heard it.
    Freed { others_waiting: bool },
}

pub(crate) enum Store {
    Redis(Box<RedisNode>),
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

    /// Whether a lock may pass from task to task of one client without a round
    /// trip. Not on Redlock: there a grant is only as good as the majority that gave
    /// it, so every section asks the masters again.
    pub(crate) fn hands_off(&self) -> bool {
        !matches!(self.store, Store::Redlock(_))
    }

    pub(crate) fn background(&self) -> &Background {
        &self.background
    }

    /// Tries to take `name` under `token`. If the caller goes before the answer, or
    /// the answer is an error (the request may still have been applied), the token's
    /// lock is released in the background.
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
        let claim = Claim {
            backend: self.clone(),
            name: name.clone(),
            token: token.clone(),
        };
        let request = {
            let claim = claim.clone();
            async move {
                let Claim {
                    backend,
                    name,
                    token,
                } = &claim;
                backend.acquire_now(name, token, lease, fencing).await
            }
        };
        let runtime = Handle::current();
        let attempt = self
            .background
            .finishing(&runtime, request, claim.clone())
            .await;
        if attempt.is_err() {
            self.background.spawn_on(&runtime, claim.withdraw());
        }
        attempt
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

    /// Frees `name` if `token` holds it, and wakes its waiters.
    pub(crate) async fn release(
        &self,
        name: &LockName,
        token: &str,
    ) -> Result<Released, LockError> {
        let listeners = match &self.store {
            Store::Redis(node) => node.release(name, token, true).await?,
            Store::Memory(memory) => memory.release(name, token).then_some(0),
            Store::Redlock(redlock) => return redlock.release(name, token, true).await,
        };
        Ok(match listeners {
            None => Released::NotHeld,
            // This process's own subscriber is one of the listeners when it waits too.
            Some(listeners) => Released::Freed {
                others_waiting: listeners > 0
                    && listeners > u64::from(self.signals.watched(&name.channel)),
            },
        })
    }

    /// Frees `name` if `token` holds it; the request completes on `runtime` even if
    /// the caller goes, and then `after` sees what it did.
    pub(crate) fn release_finishing(
        self: &Arc<Self>,
        runtime: &Handle,
        name: Arc<LockName>,
        token: Arc<str>,
        after: impl FnOnce(&Result<Released, LockError>) + Send + 'static,
    ) -> Finishing<Result<Released, LockError>, NothingMore> {
        let backend = self.clone();
        let request = async move {
            let released = backend.release(&name, &token).await;
            after(&released);
            released
        };
        self.background.finishing(runtime, request, NothingMore)
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

/// One token's request for a lock, withdrawn when nobody takes what it may have
/// been granted: the caller went, or the answer was an error and the request may
/// have been applied anyway.
#[derive(Clone)]
struct Claim {
    backend: Arc<Backend>,
    name: Arc<LockName>,
    token: Arc<str>,
}

impl Claim {
    async fn withdraw(self) {
        let _ = self.backend.release(&self.name, &self.token).await;
    }
}

impl Orphan<Result<Attempt, LockError>> for Claim {
    async fn adopt(self, answer: Result<Attempt, LockError>) {
        if !matches!(answer, Ok(Attempt::Busy { .. })) {
            self.withdraw().await;
        }
    }
}

/// A request that has nothing more to do once it is done, caller or not.
pub(crate) struct NothingMore;

impl<T: Send + 'static> Orphan<T> for NothingMore {
    async fn adopt(self, _answer: T) {}
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
