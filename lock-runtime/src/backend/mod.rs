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
mod pipe;
mod redis;
mod redlock;
mod replication;
mod sentinels;
mod signals;

use std::sync::Arc;
use std::time::Duration;

use ::redis::ConnectionAddr;
use tokio::runtime::Handle;
use tokio::sync::{Mutex, watch};

pub(crate) use self::background::{Background, Finishing, Orphan};
pub(crate) use self::connection::{Connection, LuaScript, ScriptCall, Target, bounded};
pub(crate) use self::memory::MemoryStore;
pub(crate) use self::redis::RedisNode;
pub use self::redis::script_hashes;
pub(crate) use self::redlock::Redlock;
pub(crate) use self::replication::Shortfall;
pub(crate) use self::signals::Signals;
use crate::LockError;
use crate::key::LockName;
use crate::options::Kind;
use crate::telemetry::Meters;

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
    /// The lock is held as a kind the attempt's kind never shares it with: a lock
    /// and a semaphore, or semaphores of different sizes.
    Clash { held_as: Kind },
    /// The lock was granted, but fewer replicas than required had it in time, or
    /// the primary's disk did not, so it was given back.
    Unreplicated(Shortfall),
    /// The lock was granted, but given back before the attempt could count it held:
    /// the grant had lapsed, or was made on another server than the one that
    /// confirmed it, by the time the replicas were asked, or too few Redlock nodes
    /// granted it. Busy, as far as this attempt can tell; worth trying again in this
    /// long at the latest.
    GivenBack { retry_in: Option<Duration> },
}

/// A lease to renew: the lock, the token that should hold it, and the lease to give.
pub(crate) struct Renewing<'a> {
    pub(crate) name: &'a LockName,
    pub(crate) token: &'a Arc<str>,
    pub(crate) lease: Duration,
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The token did not hold the lock; nothing was changed.
    NotHeld,
    /// The lock is free, or passed to the first client waiting for it.
    Freed,
}

/// How an acquire attempt treats the acquisitions queued for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queue {
    /// A free lock goes to the first in the queue; the attempt does not join it.
    Respect,
    /// Takes a place at the back when the lock is busy, or keeps the place it has,
    /// for at least this long.
    Join(Duration),
    /// Only waiting writers are kept, in no order, and nobody is passed the lock
    /// (Redlock, where each master would pass it to another client, and memory): an
    /// exclusive attempt that finds the lock busy stays marked as waiting for at
    /// least this long, if given, and shared attempts wait while any writer does.
    Writers(Option<Duration>),
}

impl Queue {
    /// Whether the attempt may leave a place behind, to be withdrawn when unused.
    fn joins(self) -> bool {
        matches!(self, Queue::Join(_) | Queue::Writers(Some(_)))
    }
}

/// Who a release tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiters {
    /// The first client in the queue, which is passed the lock.
    Queue,
    /// Every waiting client, which all try again.
    Broadcast,
    /// Nobody.
    None,
}

/// How long a lock passed to a waiting client stays its own before the client claims
/// it for a lease. A client that died or gave up meanwhile costs no more than this.
pub(crate) const CLAIM_WINDOW: Duration = Duration::from_millis(100);

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
    meters: Meters,
}

/// Release signals of one lock, listened for until this is dropped.
pub(crate) struct Subscription {
    backend: Arc<Backend>,
    name: LockName,
    channel: Arc<str>,
    releases: watch::Receiver<u64>,
}

impl Backend {
    /// `signals` must be the ones the store's release notifications go to.
    pub(crate) fn new(store: Store, signals: Arc<Signals>) -> Arc<Backend> {
        let kind = match &store {
            Store::Redis(node) => node.kind(),
            Store::Memory(_) => "memory",
            Store::Redlock(_) => "redlock",
        };
        Arc::new(Backend {
            store,
            signals,
            changes: Mutex::new(()),
            background: Background::default(),
            meters: Meters::new(kind),
        })
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.meters.kind()
    }

    /// The client's metrics, labelled with this kind of store.
    pub(crate) fn meters(&self) -> &Meters {
        &self.meters
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

    /// Whether waiting clients queue in the store, each told in turn that the lock
    /// was passed to it, so that a release wakes one client. Not on Redlock, where
    /// each master would pass the lock to another client, nor in memory.
    pub(crate) fn queues(&self) -> bool {
        matches!(self.store, Store::Redis(_))
    }

    /// Whether a semaphore can be sound here. Not on Redlock: with 2 permits and
    /// masters A, B and C, holders granted by {A,B}, {A,C} and {B,C} make three.
    pub(crate) fn counts_permits(&self) -> bool {
        !matches!(self.store, Store::Redlock(_))
    }

    /// Tries to take `name` under `token`, a hold of `kind`; with `join`, a busy
    /// lock puts the token in the queue for it, for at least that long (where the
    /// store queues; on Redlock and in memory, only an exclusive waiter is kept,
    /// and only to keep new shared holders out). If the caller goes before the
    /// answer, or the answer is an error (the request may still have been applied),
    /// the token is withdrawn in the background.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        name: &LockName,
        token: &Arc<str>,
        kind: Kind,
        lease: Duration,
        fencing: bool,
        join: Option<Duration>,
    ) -> Result<Attempt, LockError> {
        let queue = match (&self.store, join) {
            (Store::Redis(_), Some(stay)) => Queue::Join(stay),
            (Store::Redis(_), None) => Queue::Respect,
            (_, join) => Queue::Writers(join),
        };
        if let Store::Memory(memory) = &self.store {
            return Ok(memory.acquire(name, token, kind, lease, fencing, queue));
        }
        let claim = Claim {
            backend: self.clone(),
            name: name.clone(),
            token: token.clone(),
            joined: queue.joins(),
            lease,
        };
        let request = {
            let claim = claim.clone();
            Box::pin(async move {
                let Claim {
                    backend,
                    name,
                    token,
                    ..
                } = &claim;
                backend
                    .acquire_now(name, token, kind, lease, fencing, queue)
                    .await
            })
        };
        let runtime = Handle::current();
        let reached = self.releases_at();
        let attempt = self
            .background
            .finishing(&runtime, request, claim.clone())
            .await;
        match &attempt {
            Err(_) => {
                self.background.spawn_on(&runtime, claim.withdraw());
            }
            // Given back on the server that made the grant: followed as a release is.
            Ok(Attempt::GivenBack { .. } | Attempt::Unreplicated(_)) => {
                self.check_release(name.clone(), token.clone(), lease, reached);
            }
            Ok(_) => {}
        }
        attempt
    }

    async fn acquire_now(
        &self,
        name: &LockName,
        token: &str,
        kind: Kind,
        lease: Duration,
        fencing: bool,
        queue: Queue,
    ) -> Result<Attempt, LockError> {
        match &self.store {
            Store::Redis(node) => node.acquire(name, token, kind, lease, fencing, queue).await,
            Store::Memory(memory) => Ok(memory.acquire(name, token, kind, lease, fencing, queue)),
            Store::Redlock(redlock) => {
                redlock
                    .acquire(name, token, kind, lease, fencing, queue)
                    .await
            }
        }
    }

    /// Takes `token`, which asked for `lease`, out of the queue for `name` in the
    /// background, releasing the lock if it was passed to it meanwhile: for a waiter
    /// that gives up.
    pub(crate) fn withdraw(self: &Arc<Self>, name: &LockName, token: &Arc<str>, lease: Duration) {
        if let Ok(runtime) = Handle::try_current() {
            let claim = Claim {
                backend: self.clone(),
                name: name.clone(),
                token: token.clone(),
                joined: true,
                lease,
            };
            self.background.spawn_on(&runtime, claim.withdraw());
        }
    }

    /// Frees `name` if `token` holds it, passing it to the first client in its queue
    /// or waking its waiters.
    pub(crate) async fn release(
        &self,
        name: &LockName,
        token: &str,
    ) -> Result<Released, LockError> {
        match &self.store {
            Store::Redis(node) => node.release(name, token, Waiters::Queue).await,
            Store::Memory(memory) => Ok(match memory.release(name, token) {
                true => Released::Freed,
                false => Released::NotHeld,
            }),
            Store::Redlock(redlock) => redlock.release(name, token).await,
        }
    }

    /// Takes `token` out of the queue for `name`, or frees the lock if it was passed
    /// to `token`: for an acquisition that gave up, in one request.
    async fn leave(&self, name: &LockName, token: &str) -> Result<Released, LockError> {
        match &self.store {
            Store::Redis(node) => node.leave(name, token, Waiters::Queue).await,
            Store::Memory(_) | Store::Redlock(_) => self.release(name, token).await,
        }
    }

    /// Frees `name` if `token` holds it, or with `keep`, leaves it held by nobody for
    /// that long; the request completes on `runtime` even if the caller goes, and
    /// then `after` sees what it did. Through Sentinel, a release is then checked
    /// with them in the background, for at most `lease`.
    pub(crate) fn release_finishing(
        self: &Arc<Self>,
        runtime: &Handle,
        name: LockName,
        token: Arc<str>,
        keep: Option<Duration>,
        lease: Duration,
        after: impl FnOnce(&Result<Released, LockError>) + Send + 'static,
    ) -> Finishing<Result<Released, LockError>, NothingMore> {
        let backend = self.clone();
        let request = Box::pin(async move {
            let reached = backend.releases_at();
            let released = match keep {
                Some(keep) => match Box::pin(backend.renew(&name, &token, keep)).await {
                    Ok(true) => Ok(Released::Freed),
                    Ok(false) => Ok(Released::NotHeld),
                    Err(error) => Err(error),
                },
                None => backend.release(&name, &token).await,
            };
            after(&released);
            if keep.is_none() && released.is_ok() {
                backend.check_release(name, token, lease, reached);
            }
            released
        });
        self.background.finishing(runtime, request, NothingMore)
    }

    /// Through Sentinel, where a release sent now goes. Read before it is sent: were
    /// the connection made anew meanwhile, the release went to the new server, and
    /// following it only sends it there again, which frees nothing more, since its
    /// token is used no more. Read after, a switch between the answer and the read
    /// would pass a release the old primary answered for one the new one did.
    fn releases_at(&self) -> Option<Option<ConnectionAddr>> {
        match &self.store {
            Store::Redis(node) => node.releases_at(),
            Store::Memory(_) | Store::Redlock(_) => None,
        }
    }

    /// Through Sentinel, has the release `token` just had on `name`, sent to
    /// `reached`, sent again until they vouch for the server that answered it
    /// (`RedisNode::release_where_named`).
    fn check_release(
        self: &Arc<Self>,
        name: LockName,
        token: Arc<str>,
        lease: Duration,
        reached: Option<Option<ConnectionAddr>>,
    ) {
        let (Some(reached), Ok(runtime)) = (reached, Handle::try_current()) else {
            return;
        };
        let backend = self.clone();
        self.background.spawn_on(&runtime, async move {
            if let Store::Redis(node) = &backend.store {
                node.release_where_named(&name, &token, reached, lease)
                    .await;
            }
        });
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

    /// Renews each of `renewals` if its token still holds the lock: where locks live
    /// in Redis, in one request per hash slot and lease for many locks; elsewhere
    /// one renewal each, all at once. What each found, in order.
    pub(crate) async fn renew_many(
        self: &Arc<Self>,
        renewals: &[Renewing<'_>],
    ) -> Vec<Result<bool, LockError>> {
        if let Store::Redis(node) = &self.store {
            return node.renew_many(renewals).await;
        }
        let mut renewing = tokio::task::JoinSet::new();
        for (index, &Renewing { name, token, lease }) in renewals.iter().enumerate() {
            let (backend, name, token) = (self.clone(), name.clone(), token.clone());
            renewing.spawn(async move { (index, backend.renew(&name, &token, lease).await) });
        }
        let mut answers: Vec<Option<Result<bool, LockError>>> = Vec::new();
        answers.resize_with(renewing.len(), || None);
        while let Some(Ok((index, answer))) = renewing.join_next().await {
            answers[index] = Some(answer);
        }
        renewal_answers(answers, renewals.iter().map(|renewing| renewing.name))
    }

    /// Whether `token` holds `name` with no other client waiting for it, where the
    /// store queues waiting clients; elsewhere it cannot tell, and answers no.
    pub(crate) async fn holds_alone(
        &self,
        name: &LockName,
        token: &str,
    ) -> Result<bool, LockError> {
        match &self.store {
            Store::Redis(node) => node.holds_alone(name, token).await,
            Store::Memory(_) | Store::Redlock(_) => Ok(false),
        }
    }

    /// How long the lock on `name` has left, whoever holds it; `None` when free.
    pub(crate) async fn lease_left(&self, name: &LockName) -> Result<Option<Duration>, LockError> {
        match &self.store {
            Store::Redis(node) => node.lease_left(name).await,
            Store::Memory(memory) => Ok(memory.lease_left(name)),
            Store::Redlock(redlock) => redlock.lease_left(name).await,
        }
    }

    /// Frees `name` whoever holds it, and tells its waiters as a release does.
    pub(crate) async fn force_unlock(&self, name: &LockName) -> Result<bool, LockError> {
        match &self.store {
            Store::Redis(node) => node.force_unlock(name, Waiters::Queue).await,
            Store::Memory(memory) => Ok(memory.force_unlock(name)),
            Store::Redlock(redlock) => redlock.force_unlock(name).await,
        }
    }

    /// Listens, until the subscription is dropped, for what concerns `client` while
    /// it waits for `name`: the lock passed to it where the store queues, else every
    /// release.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        name: &LockName,
        client: &str,
    ) -> Result<Subscription, LockError> {
        let channel: Arc<str> = match self.queues() {
            true => format!("{}{client}", name.grants()).into(),
            false => name.channel().into(),
        };
        let _changing = self.changes.lock().await;
        let (releases, first) = self.signals.join(&channel);
        // From here on, however this call ends, dropping the subscription stops it.
        let subscription = Subscription {
            backend: self.clone(),
            name: name.clone(),
            channel: channel.clone(),
            releases,
        };
        if first {
            match &self.store {
                Store::Redis(node) => node.listen(name, &channel).await?,
                Store::Memory(_) => {}
                Store::Redlock(redlock) => redlock.listen(name).await?,
            }
        }
        Ok(subscription)
    }

    async fn unsubscribe(&self, name: &LockName, channel: &str) {
        let _changing = self.changes.lock().await;
        if self.signals.leave(channel) {
            match &self.store {
                Store::Redis(node) => node.unlisten(name, channel).await,
                Store::Memory(_) => {}
                Store::Redlock(redlock) => redlock.unlisten(name).await,
            }
        }
    }
}

/// One token's request for a lock, for `lease`, withdrawn when nobody takes what it
/// may have been granted, or the place it may have taken in the queue: the caller
/// went, or the answer was an error and the request may have been applied anyway.
#[derive(Clone)]
struct Claim {
    backend: Arc<Backend>,
    name: LockName,
    token: Arc<str>,
    joined: bool,
    lease: Duration,
}

impl Claim {
    /// A grant given back is followed through Sentinel as a release is, for the
    /// lease it asked for: the token is used no more, so sending it again frees
    /// nothing but this grant.
    async fn withdraw(self) {
        let reached = self.backend.releases_at();
        let left = self.backend.leave(&self.name, &self.token).await;
        if let Ok(Released::Freed) = left {
            self.backend
                .check_release(self.name, self.token, self.lease, reached);
        }
    }
}

impl Orphan<Result<Attempt, LockError>> for Claim {
    async fn adopt(self, answer: Result<Attempt, LockError>) {
        if self.joined || !matches!(answer, Ok(Attempt::Busy { .. })) {
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
            let (backend, name, channel) = (
                self.backend.clone(),
                self.name.clone(),
                self.channel.clone(),
            );
            self.backend.background.spawn_on(&runtime, async move {
                backend.unsubscribe(&name, &channel).await
            });
        }
    }
}

/// Each renewal's answer, in order, for the locks `names`; one whose request never
/// finished (its task panicked) is an error, not a refusal: its lock may be held.
fn renewal_answers<'a>(
    answers: Vec<Option<Result<bool, LockError>>>,
    names: impl Iterator<Item = &'a LockName>,
) -> Vec<Result<bool, LockError>> {
    answers
        .into_iter()
        .zip(names)
        .map(|(answer, name)| {
            answer.unwrap_or_else(|| {
                let unfinished = (
                    ::redis::ErrorKind::Io,
                    "the renewal's request did not finish",
                );
                Err(LockError::backend(name.key(), unfinished.into()))
            })
        })
        .collect()
}

fn lease_ms(lease: Duration) -> u64 {
    lease.as_millis().try_into().unwrap_or(u64::MAX)
}
