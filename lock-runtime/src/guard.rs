use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::Release;
use crate::keeper::Due;
use crate::key::LockName;
use crate::options::{MAX_LEASE, Plan};
use crate::waiting::Turn;
use crate::{LockClient, LockError};

/// A held lock. Release it with [`release`](Self::release); dropping it releases in
/// the background instead, on the runtime it was acquired on.
///
/// Guards of one task that re-entered a key share one hold: the lock is released
/// when the outermost guard goes.
pub struct LockGuard {
    hold: Arc<Hold>,
    released: bool,
}

/// One task's hold of one lock, shared by its nested guards.
pub(crate) struct Hold {
    client: LockClient,
    pub(crate) name: Arc<LockName>,
    pub(crate) owner: String,
    fence: Option<u64>,
    /// Guards alive on this hold; changed only under the client's holds table lock.
    holders: AtomicU32,
    /// The instant until which the lease is known valid by this process's clock.
    /// A loss sets it to the past, so "lost" and "expired" are one state.
    valid_until: watch::Sender<Instant>,
    acquired_at: Instant,
    watchdog_lease: Option<Duration>,
    max_hold: Option<Duration>,
    /// Who looks after the lease: the client's keeper until the hold has lasted long
    /// enough to need a task of its own, which renews it (with the watchdog) and
    /// gives up the turn once it is lost.
    care: Mutex<Care>,
    runtime: Option<Handle>,
    /// The client's next task in line for this key waits until this is dropped.
    turn: Mutex<Option<Turn>>,
}

enum Care {
    Scheduled(Due),
    Kept(JoinHandle<()>),
    Ended,
}

/// Redis measures a lease on its own clock; allow for the two clocks running at
/// slightly different rates, as Redlock does.
pub(crate) fn clock_drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

fn valid_until(sent_at: Instant, lease: Duration) -> Instant {
    sent_at + lease.saturating_sub(clock_drift(lease))
}

impl Hold {
    pub(crate) fn start(
        client: LockClient,
        name: Arc<LockName>,
        owner: String,
        plan: &Plan,
        fence: Option<u64>,
        sent_at: Instant,
        turn: Turn,
    ) -> Arc<Hold> {
        let runtime = Handle::try_current().ok();
        let watchdog_lease = plan.watchdog.then_some(plan.lease);
        let valid_until = valid_until(sent_at, plan.lease);
        let hold = Arc::new(Hold {
            client,
            name,
            owner,
            fence,
            holders: AtomicU32::new(1),
            valid_until: watch::Sender::new(valid_until),
            acquired_at: sent_at,
            watchdog_lease,
            max_hold: plan.max_hold,
            care: Mutex::new(Care::Ended),
            runtime,
            turn: Mutex::new(Some(turn)),
        });
        if let Some(runtime) = &hold.runtime {
            let due = match watchdog_lease {
                Some(lease) => sent_at + lease / 3,
                None => valid_until,
            };
            // Locked across scheduling, so a keeper that finds the hold due at once
            // waits to see it scheduled.
            let mut care = hold.care();
            *care = Care::Scheduled(hold.client.keeper().watch(&hold, due, runtime));
            drop(care);
        }
        hold
    }

    /// Called by the client's keeper once the hold needs looking after.
    pub(crate) fn keep(self: &Arc<Self>) {
        let mut care = self.care();
        if let (Care::Scheduled(_), Some(runtime)) = (&*care, &self.runtime) {
            let keeping = keep(
                Arc::downgrade(self),
                self.acquired_at,
                self.watchdog_lease,
                self.max_hold,
            );
            *care = Care::Kept(runtime.spawn(keeping));
        }
    }

    fn care(&self) -> std::sync::MutexGuard<'_, Care> {
        self.care.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_held(&self) -> bool {
        Instant::now() < *self.valid_until.borrow()
    }

    pub(crate) fn enter(&self) {
        self.holders.fetch_add(1, Ordering::Relaxed);
    }

    /// True when the last guard left.
    pub(crate) fn leave(&self) -> bool {
        self.holders.fetch_sub(1, Ordering::Relaxed) == 1
    }

    /// The lease is gone: the guard reports it, and the client's next task in line
    /// may go to Redis at once.
    fn mark_lost(&self) {
        // The turn first: whoever `lost()` wakes may take the lock again at once.
        self.give_up_turn();
        self.valid_until.send_replace(Instant::now());
    }

    fn stop_keeper(&self) {
        match std::mem::replace(&mut *self.care(), Care::Ended) {
            Care::Scheduled(due) => self.client.keeper().forget(due),
            Care::Kept(task) => task.abort(),
            Care::Ended => {}
        }
    }

    fn give_up_turn(&self) {
        drop(self.turn.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    async fn release(&self) -> Result<(), LockError> {
        self.stop_keeper();
        let released = self.client.backend().release(&self.name, &self.owner).await;
        self.give_up_turn();
        match released? {
            Release::Freed | Release::StillHeld => Ok(()),
            Release::NotHeld => Err(LockError::NotHeld {
                key: self.name.key.clone(),
            }),
        }
    }
}

/// Keeps a hold that has lasted: with the watchdog, renews the lease every third of
/// it; once the lease is lost, lets the client's next task in line go to Redis even
/// if this guard lives on. Aborted when the hold is released.
async fn keep(
    hold: Weak<Hold>,
    acquired_at: Instant,
    watchdog_lease: Option<Duration>,
    max_hold: Option<Duration>,
) {
    if let Some(lease) = watchdog_lease {
        renew_while_held(&hold, acquired_at, lease, max_hold).await;
    }
    let Some(hold) = hold.upgrade() else { return };
    until_lost(hold.valid_until.subscribe()).await;
    hold.give_up_turn();
}

/// Renewal errors are retried until the lease has run out; a refusal means the
/// lock is gone.
async fn renew_while_held(
    hold: &Weak<Hold>,
    acquired_at: Instant,
    lease: Duration,
    max_hold: Option<Duration>,
) {
    let every = lease / 3;
    let retry_every = (every / 4).max(Duration::from_millis(5));
    let renew_until = max_hold.map(|max_hold| acquired_at + max_hold);
    let mut next = acquired_at + every;
    loop {
        if renew_until.is_some_and(|until| next >= until) {
            return;
        }
        tokio::time::sleep_until(next).await;
        let Some(hold) = hold.upgrade() else { return };
        let sent_at = Instant::now();
        match hold
            .client
            .backend()
            .renew(&hold.name, &hold.owner, lease)
            .await
        {
            Ok(true) => {
                hold.valid_until.send_replace(valid_until(sent_at, lease));
                next = sent_at + every;
            }
            Ok(false) => return hold.mark_lost(),
            Err(_) if !hold.is_held() => return hold.mark_lost(),
            Err(_) => next = Instant::now() + retry_every,
        }
    }
}

/// Completes once the instant in `valid_until` has passed, following renewals.
async fn until_lost(mut valid_until: watch::Receiver<Instant>) {
    loop {
        let until = *valid_until.borrow_and_update();
        if Instant::now() >= until {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            _ = valid_until.changed() => {}
        }
    }
}

impl LockGuard {
    pub(crate) fn new(hold: Arc<Hold>) -> LockGuard {
        LockGuard {
            hold,
            released: false,
        }
    }

    /// The key, as the caller gave it.
    pub fn key(&self) -> &str {
        &self.hold.name.key
    }

    /// The fencing token of this acquisition, when `fencing(true)` was asked for.
    /// Tokens of one key only grow, so a store that remembers the largest token it
    /// has seen can refuse the writes of a holder that lost the lock.
    pub fn fencing_token(&self) -> Option<u64> {
        self.hold.fence
    }

    /// True while the lease is known valid: not lost, not run out by this process's
    /// clock (less an allowance for clock drift).
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Completes when the lease is known lost: a renewal was refused, or the lease
    /// ran out without being renewed. Never completes while the lock is held.
    pub async fn lost(&self) {
        until_lost(self.hold.valid_until.subscribe()).await;
    }

    /// Sets the lease to `lease` from now, if this owner still holds the lock.
    /// `NotHeld` when it does not; nothing is changed then.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        if lease < Duration::from_millis(1) || lease > MAX_LEASE {
            return Err(LockError::InvalidOptions {
                key: self.hold.name.key.clone(),
                reason: "the lease must be from 1 ms to 2^52 ms".to_owned(),
            });
        }
        let hold = &self.hold;
        let sent_at = Instant::now();
        if hold
            .client
            .backend()
            .renew(&hold.name, &hold.owner, lease)
            .await?
        {
            hold.valid_until.send_replace(valid_until(sent_at, lease));
            Ok(())
        } else {
            hold.mark_lost();
            Err(LockError::NotHeld {
                key: hold.name.key.clone(),
            })
        }
    }

    /// Releases the lock, or this guard's share of it when the task re-entered the key.
    /// `NotHeld` when the lease had run out or another owner had taken over: nothing
    /// was deleted then.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        if self.hold.client.leave(&self.hold) {
            self.hold.release().await
        } else {
            Ok(())
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released || !self.hold.client.leave(&self.hold) {
            return;
        }
        self.hold.stop_keeper();
        // Outside any runtime, nothing can run the release: the lease frees the lock.
        if let Some(runtime) = &self.hold.runtime {
            let hold = Arc::clone(&self.hold);
            runtime.spawn(async move {
                let _ = hold.release().await;
            });
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("fencing_token", &self.fencing_token())
            .field("is_held", &self.is_held())
            .finish()
    }
}
