use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use super::keeper::{Care, Due, EARLY_AT_MOST};
use super::lease::Lease;
use super::{ClientTurn, Grant, Holds};
use crate::LockError;
use crate::backend::{Finishing, NothingMore, Released};
use crate::key::LockName;
use crate::options::{HandOff, Kind, Plan, clock_drift};
use crate::telemetry;

/// One acquisition that reached Redis: its token, its lease, and the client's turn
/// for the key. It is held by one guard at a time, the one it was granted to and then
/// each one it is handed to, and the keeper renews it while any of them holds it.
pub(crate) struct Acquisition {
    pub(super) holds: Arc<Holds>,
    pub(super) name: LockName,
    pub(super) token: Arc<str>,
    /// The fencing counter Redis issued with it.
    pub(super) counter: Option<u64>,
    pub(super) kind: Kind,
    pub(super) lease: Lease,
    pub(super) acquired_at: Instant,
    /// The lease it was granted with.
    lease_length: Duration,
    /// Whether the watchdog renews it, to `lease_length` each time.
    watchdog: bool,
    pub(super) max_hold: Option<Duration>,
    /// A release before this leaves the lock in Redis until then (`hold_at_least`).
    pub(super) hold_until: Option<Instant>,
    pub(super) care: Mutex<Care>,
    /// Where a task took a fixed lease over: the end of the lease it asked for, to
    /// which the keeper renews the lock if it still holds it when a third of the
    /// lease it was handed is left.
    promised: Mutex<Option<Instant>>,
    pub(super) runtime: Handle,
    turn: Mutex<Option<ClientTurn>>,
    /// How many times it was handed on.
    handed_on: AtomicU32,
    window: Mutex<Window>,
    released: AtomicBool,
    lost: AtomicBool,
    /// Set when nothing ran under the lock, so a release frees it inside a
    /// `hold_at_least` window too.
    window_waived: AtomicBool,
}

/// The stretch of hand-offs that the client's bounds count: from the Redis
/// acquisition, or from the last check that found no other client waiting for the
/// lock, since such a check gives them the chance a release to Redis would.
#[derive(Clone, Copy)]
struct Window {
    /// Hand-offs before it began.
    from: u32,
    since: Instant,
    /// Whether it asked Redis already: it asks once, and starts again if no other
    /// client waited.
    asked: bool,
}

/// How a hold ended.
pub(super) enum Ending {
    /// The acquisition went on to the next task in line, with no round trip.
    HandedOn,
    /// It was released to Redis; resolves to what the release did.
    Releasing(Finishing<Result<Released, LockError>, NothingMore>),
}

impl Acquisition {
    pub(super) fn new(holds: Arc<Holds>, grant: Grant, plan: &Plan) -> Acquisition {
        Acquisition {
            holds,
            name: grant.name,
            token: grant.token,
            counter: grant.counter,
            kind: plan.kind,
            lease: Lease::new(grant.sent_at, plan.lease),
            acquired_at: grant.sent_at,
            lease_length: plan.lease,
            watchdog: plan.watchdog,
            max_hold: plan.max_hold,
            hold_until: plan.hold_at_least.map(|window| Instant::now() + window),
            care: Mutex::new(Care::Ended),
            promised: Mutex::new(None),
            runtime: Handle::current(),
            turn: Mutex::new(Some(grant.turn)),
            handed_on: AtomicU32::new(0),
            window: Mutex::new(Window {
                from: 0,
                since: grant.sent_at,
                asked: false,
            }),
            released: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            window_waived: AtomicBool::new(false),
        }
    }

    pub(super) fn care(&self) -> std::sync::MutexGuard<'_, Care> {
        self.care.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn turn(&self) -> std::sync::MutexGuard<'_, Option<ClientTurn>> {
        self.turn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease the watchdog renews it with, if it does.
    pub(super) fn watchdog_lease(&self) -> Option<Duration> {
        self.watchdog.then_some(self.lease_length)
    }

    fn promised(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.promised.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fencing token of the hold it is granted or handed to now: the Redis
    /// counter times 2^16 plus the number of hand-offs before it, so tokens keep
    /// growing along a chain of hand-offs and across acquisitions.
    fn fence(&self, handed_on: u32) -> Option<u64> {
        self.counter
            .map(|counter| (counter << HAND_OFF_BITS) | u64::from(handed_on))
    }

    /// The token of the first hold.
    pub(super) fn first_fence(&self) -> Option<u64> {
        self.fence(0)
    }

    /// Whether the hold before can be taken over by a task that asks for `plan`: it
    /// asks for nothing the hold cannot give. The same lease, watchdog or fixed; no
    /// cap, and a fencing counter if a token is asked for.
    pub(super) fn fits(&self, plan: &Plan) -> bool {
        self.lease.is_valid()
            && self.kind == plan.kind
            && plan.watchdog == self.watchdog
            && plan.lease == self.lease_length
            && plan.max_hold.is_none()
            && self.max_hold.is_none()
            && plan.hold_at_least.is_none()
            && self.hold_until.is_none()
            && (!plan.fencing || self.counter.is_some())
    }

    /// Takes it over from the hold before, during `turn`; returns the new hold's token.
    ///
    /// A fixed lease is owed to the taker in full, from now. It is not renewed now,
    /// which would cost every section a round trip: the keeper renews it, as the
    /// watchdog would, once only a third of the lease it was handed is left, so a
    /// section shorter than that costs Redis nothing, and one that finds the lock
    /// gone is lost as a watchdog hold would be.
    pub(super) fn take_over(self: &Arc<Self>, turn: ClientTurn, plan: &Plan) -> Option<u64> {
        *self.turn() = Some(turn);
        if !self.watchdog {
            let now = Instant::now();
            *self.promised() = Some(now + plan.lease);
            let renew_at = self.lease.valid_until().checked_sub(plan.lease / 3);
            self.looked_after_by(renew_at.map_or(now, |at| at.max(now)));
        }
        let handed_on = self.handed_on.load(Ordering::Relaxed);
        self.fence(handed_on)
    }

    /// What is left of the lease promised to the task that took a fixed lease over,
    /// when the lease as it stands ends sooner.
    fn lease_owed(&self) -> Option<Duration> {
        let promised = (*self.promised())?;
        let ends = self.lease.valid_until() + clock_drift(self.lease_length);
        (promised > ends).then(|| promised.saturating_duration_since(Instant::now()))
    }

    /// The lease is gone for good: the client's next task in line may go to Redis.
    pub(super) fn mark_lost(&self) {
        let taken = self.lease.is_valid();
        // The turn first: whoever the loss wakes may take the lock again at once.
        drop(self.turn().take());
        self.lease.end(Instant::now());
        if !self.lost.swap(true, Ordering::Relaxed) {
            telemetry::lost(self.name.key(), taken, self.holds.backend.meters());
        }
    }

    /// Sets the lease to `lease` from now, if the token still holds the lock. With
    /// no answer, the lease is counted as Redis may have set it.
    pub(super) async fn extend(self: &Arc<Self>, lease: Duration) -> Result<(), LockError> {
        // What the holder asks for now replaces what a take-over was promised.
        self.promised().take();
        let sent_at = Instant::now();
        // A shorter lease may end before the keeper would first look at the hold.
        self.looked_after_by(sent_at + lease);
        let renewal = self.lease.renewal(sent_at, lease);
        let backend = &self.holds.backend;
        let renewed = backend.renew(&self.name, &self.token, lease).await?;
        if renewal.answered(renewed) {
            return Ok(());
        }
        self.mark_lost();
        Err(LockError::NotHeld {
            key: self.name.key().to_owned(),
        })
    }

    /// How much sooner than due the keeper may renew it, to renew it with others.
    pub(super) fn renewable_early(&self) -> Duration {
        self.watchdog_lease()
            .map_or(Duration::ZERO, |lease| (lease / 12).min(EARLY_AT_MOST))
    }

    /// The keeper's look at it, from the schedule's entry `due`: the lease to renew
    /// it with now, if the watchdog renews it or a take-over is owed more; otherwise
    /// it is looked at again when its lease ends, or lost if it has. Nothing when it
    /// was released, or scheduled again, since the entry was made.
    pub(super) fn looked_at(self: &Arc<Self>, due: Due) -> Option<Duration> {
        let mut care = self.care();
        if *care != Care::Scheduled(due) {
            return None;
        }
        if !self.lease.is_valid() {
            *care = Care::Ended;
            drop(care);
            self.mark_lost();
            return None;
        }
        let renew_until = self.max_hold.map(|max_hold| self.acquired_at + max_hold);
        match self.watchdog_lease() {
            Some(lease) if renew_until.is_none_or(|until| due.0 < until) => Some(lease),
            None if let Some(owed) = self.lease_owed() => Some(owed),
            _ => {
                let ends = self.lease.valid_until();
                *care = Care::Scheduled(self.holds.keeper.watch(self, ends, &self.runtime));
                None
            }
        }
    }

    /// After a renewal: has the keeper look at it again at `at`, or when its lease
    /// ends if sooner, unless it was released meanwhile.
    pub(super) fn look_again_at(self: &Arc<Self>, at: Instant) {
        let mut care = self.care();
        if let Care::Scheduled(due) = *care {
            self.holds.keeper.forget(due);
            let at = at.min(self.lease.valid_until());
            *care = Care::Scheduled(self.holds.keeper.watch(self, at, &self.runtime));
        }
    }

    /// Whether its holds let go of it, to Redis.
    pub(super) fn is_released(&self) -> bool {
        self.released.load(Ordering::Relaxed)
    }

    /// A renewal was refused: the lock is gone.
    pub(super) fn lose(&self) {
        self.stop_care();
        self.mark_lost();
    }

    /// The keeper looks after it no more.
    fn stop_care(&self) {
        let stopped = std::mem::replace(&mut *self.care(), Care::Ended);
        if let Care::Scheduled(due) = stopped {
            self.holds.keeper.forget(due);
        }
    }

    /// Has the keeper look after it by `at` at the latest, if it was to look later.
    fn looked_after_by(self: &Arc<Self>, at: Instant) {
        let mut care = self.care();
        if let Care::Scheduled(due) = *care
            && due.0 > at
        {
            self.holds.keeper.forget(due);
            *care = Care::Scheduled(self.holds.keeper.watch(self, at, &self.runtime));
        }
    }

    /// Hands it to the next task of the client waiting for the key, within the
    /// client's bounds on hand-offs, or else releases it to Redis. `now` is when its
    /// hold let go.
    pub(super) fn hand_on_or_release(self: &Arc<Self>, now: Instant) -> Ending {
        let mut turn = self.turn().take();
        if let Some(current) = turn.take() {
            let handed_on = self.handed_on.load(Ordering::Relaxed);
            if self.may_be_handed_on(handed_on, now) {
                self.handed_on.store(handed_on + 1, Ordering::Relaxed);
                match current.hand_on(self.clone()) {
                    Ok(()) => {
                        self.check_if_halfway(handed_on + 1, now);
                        return Ending::HandedOn;
                    }
                    Err((current, _)) => {
                        self.handed_on.store(handed_on, Ordering::Relaxed);
                        turn = Some(current);
                    }
                }
            } else {
                turn = Some(current);
            }
        }
        Ending::Releasing(self.release(turn, now))
    }

    /// Halfway through its window, by hand-offs or by time, asks Redis in the
    /// background whether any other client waits for the lock; if none does, the
    /// window starts again from here, and the lock stays with this client's tasks
    /// with no round trip on their way. Where the store keeps no queue, the window
    /// only ends.
    fn check_if_halfway(self: &Arc<Self>, handed_on: u32, now: Instant) {
        let HandOff { most, within } = self.holds.hand_off;
        let backend = &self.holds.backend;
        if !backend.queues() || self.kind != Kind::Exclusive {
            return;
        }
        let mut window = self.window();
        // Saturating: the task handed the lock may hand it on, and have the window
        // start again past `handed_on`, before this call takes the window.
        let halfway = handed_on.saturating_sub(window.from) >= u32::from(most) / 2
            || now.saturating_duration_since(window.since) >= within / 2;
        if window.asked || !halfway {
            return;
        }
        window.asked = true;
        drop(window);
        let (acquisition, background) = (Arc::downgrade(self), backend.background());
        let (backend, name, token) = (backend.clone(), self.name.clone(), self.token.clone());
        let checking = async move {
            let alone = backend.holds_alone(&name, &token).await;
            if let Some(acquisition) = acquisition.upgrade()
                && alone.unwrap_or(false)
            {
                *acquisition.window() = Window {
                    from: handed_on,
                    since: now,
                    asked: false,
                };
            }
        };
        background.spawn_on(&self.runtime, checking);
    }

    /// Stops renewing, then frees the lock in Redis (or, within a `hold_at_least`
    /// window, leaves it to expire when the window ends), finishing even if the
    /// caller goes, and passes `turn` on to the next task of this client once the
    /// lock is freed or passed to another client's waiter. The delete is
    /// scoped to the token, so it is sent even after a loss, in case a renewal that
    /// timed out here was applied. `now` is when its hold let go.
    pub(super) fn release(
        &self,
        turn: Option<ClientTurn>,
        now: Instant,
    ) -> Finishing<Result<Released, LockError>, NothingMore> {
        self.released.store(true, Ordering::Relaxed);
        self.stop_care();
        self.lease.end(now);
        let keep = self
            .hold_until
            .filter(|_| !self.window_waived.load(Ordering::Relaxed))
            .and_then(|until| until.checked_duration_since(now))
            // Redis counts whole milliseconds, and the window is a least.
            .map(|keep| Duration::from_millis(keep.as_micros().div_ceil(1000) as u64))
            .filter(|keep| !keep.is_zero());
        let (name, token) = (self.name.clone(), self.token.clone());
        let key = name.clone();
        let pass_turn = move |released: &Result<Released, LockError>| {
            if let Err(error) = released {
                telemetry::release_failed(key.key(), error);
            }
            drop(turn)
        };
        let backend = &self.holds.backend;
        backend.release_finishing(
            &self.runtime,
            name,
            token,
            keep,
            self.lease_length,
            pass_turn,
        )
    }

    /// Lets a release inside the `hold_at_least` window free the lock at once: for a
    /// lock taken for work that will not run.
    pub(super) fn waive_window(&self) {
        self.window_waived.store(true, Ordering::Relaxed);
    }

    /// Within the client's bounds, on a store where hand-off is sound, and with a
    /// renewed lease that is still valid. Never a shared hold: the tasks of a client
    /// that wait behind shared holders wait for the key exclusive, which a shared hold
    /// cannot give them.
    fn may_be_handed_on(&self, handed_on: u32, now: Instant) -> bool {
        let HandOff { most, within } = self.holds.hand_off;
        let window = *self.window();
        self.holds.backend.hands_off()
            && self.kind != Kind::Shared
            && handed_on - window.from < u32::from(most)
            && now.saturating_duration_since(window.since) < within
            && handed_on < MOST_HAND_OFFS
            && self.hold_until.is_none()
            && self.lease.is_valid_at(now)
    }
}

/// Bits of a fencing token that number the hand-offs of one acquisition.
pub(super) const HAND_OFF_BITS: u32 = 16;
/// Hand-offs of one acquisition, at most, for its fencing tokens to keep growing.
const MOST_HAND_OFFS: u32 = (1 << HAND_OFF_BITS) - 1;

impl Drop for Acquisition {
    /// Left in the line with nobody to take it: released in the background.
    fn drop(&mut self) {
        if !self.released.load(Ordering::Relaxed) {
            drop(self.release(None, Instant::now()));
        }
    }
}
