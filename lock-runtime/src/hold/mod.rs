//! A held lock: the hold of one acquisition's token, the guards that show it, its
//! lease and the watchdog that renews it, and the lexical scope in which code
//! re-enters it.

mod guard;
mod keeper;
mod lease;
mod scope;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

pub use self::guard::LockGuard;
use self::keeper::{Care, Keeper};
use self::lease::Lease;
pub(crate) use self::scope::Level;
use crate::LockError;
use crate::backend::{Backend, Finishing, Orphan};
use crate::key::LockName;
use crate::options::Plan;
use crate::queue::Turn;

/// What the holds of one client share: who the client is, where its locks live,
/// and the keeper that looks after their leases.
pub(crate) struct Holds {
    client: u64,
    backend: Arc<Backend>,
    keeper: Arc<Keeper>,
}

/// What Redis granted: the lock `name` under `token`, asked for at `sent_at`.
pub(crate) struct Grant {
    pub(crate) name: Arc<LockName>,
    pub(crate) token: Arc<str>,
    pub(crate) fence: Option<u64>,
    pub(crate) sent_at: Instant,
    /// The client's turn for the key, kept until the hold ends.
    pub(crate) turn: Turn,
}

/// One acquisition's hold of a lock. Its owner guard is the only one that releases,
/// renews or extends it; guards that re-entered it are views that end with it.
pub(crate) struct Hold {
    holds: Arc<Holds>,
    name: Arc<LockName>,
    token: Arc<str>,
    fence: Option<u64>,
    lease: Lease,
    acquired_at: Instant,
    watchdog_lease: Option<Duration>,
    max_hold: Option<Duration>,
    care: Mutex<Care>,
    runtime: Handle,
    turn: Mutex<Option<Turn>>,
}

impl Holds {
    pub(crate) fn new(client: u64, backend: Arc<Backend>) -> Arc<Holds> {
        Arc::new(Holds {
            client,
            backend,
            keeper: Arc::default(),
        })
    }

    /// Starts holding what `grant` gave, looked after as `plan` says.
    pub(crate) fn start(self: &Arc<Self>, grant: Grant, plan: &Plan) -> LockGuard {
        let watchdog_lease = plan.watchdog.then_some(plan.lease);
        let hold = Arc::new(Hold {
            holds: self.clone(),
            name: grant.name,
            token: grant.token,
            fence: grant.fence,
            lease: Lease::new(grant.sent_at, plan.lease),
            acquired_at: grant.sent_at,
            watchdog_lease,
            max_hold: plan.max_hold,
            care: Mutex::new(Care::Ended),
            runtime: Handle::current(),
            turn: Mutex::new(Some(grant.turn)),
        });
        let due = match watchdog_lease {
            Some(lease) => grant.sent_at + lease / 3,
            None => grant.sent_at + plan.lease,
        };
        // Locked across scheduling, so a keeper that finds the hold due at once waits
        // to see it scheduled.
        let mut care = hold.care();
        *care = Care::Scheduled(self.keeper.watch(&hold, due, &hold.runtime));
        drop(care);
        LockGuard::owner(hold)
    }

    /// Waits for the background releases and cleanups of this client's store.
    pub(crate) async fn settled(&self) {
        self.backend.background().idle().await
    }
}

impl Hold {
    pub(crate) fn client(&self) -> u64 {
        self.holds.client
    }

    pub(crate) fn name(&self) -> &LockName {
        &self.name
    }

    pub(crate) fn fence(&self) -> Option<u64> {
        self.fence
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lease.is_valid()
    }

    fn care(&self) -> std::sync::MutexGuard<'_, Care> {
        self.care.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease is gone for good: the client's next task in line may go to Redis.
    fn mark_lost(&self) {
        // The turn first: whoever the loss wakes may take the lock again at once.
        self.give_up_turn();
        self.lease.end();
    }

    fn give_up_turn(&self) {
        drop(self.turn.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    /// Sets the lease to `lease` from now, if the token still holds the lock.
    async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        let sent_at = Instant::now();
        let renewed = self
            .holds
            .backend
            .renew(&self.name, &self.token, lease)
            .await?;
        if renewed && self.lease.renewed(sent_at, lease) {
            return Ok(());
        }
        self.mark_lost();
        Err(LockError::NotHeld {
            key: self.name.key.clone(),
        })
    }

    /// Ends the hold: stops renewing, then frees the lock in Redis in the background
    /// and passes the turn on once it is freed. The delete is scoped to this token,
    /// so it is sent even after a loss, in case a renewal that timed out here was
    /// applied. Returns whether the hold was still valid, and the release, which
    /// resolves to whether it freed the lock and finishes even if dropped.
    fn end(&self) -> (bool, Finishing<Result<bool, LockError>, PassTurn>) {
        match std::mem::replace(&mut *self.care(), Care::Ended) {
            Care::Scheduled(due) => self.holds.keeper.forget(due),
            Care::Kept(task) => task.abort(),
            Care::Ended => {}
        }
        let was_held = self.lease.end();
        let turn = self.turn.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (name, token) = (self.name.clone(), self.token.clone());
        let releasing =
            self.holds
                .backend
                .release_finishing(&self.runtime, name, token, PassTurn(turn));
        (was_held, releasing)
    }
}

/// The client's turn for a key, passed on once the lock is freed in Redis, so that
/// the next task in line does not ask before then.
pub(crate) struct PassTurn(Option<Turn>);

impl Orphan<Result<bool, LockError>> for PassTurn {
    async fn adopt(self, _freed: Result<bool, LockError>) {
        drop(self.0);
    }
}
