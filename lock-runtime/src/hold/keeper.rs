//! The client's lease keeper: one task that wakes when holds have lasted long enough
//! to need looking after (a third of a watchdog lease, or a lease's end). It renews
//! the leases that fall due together in one request per hash slot and lease length,
//! of at most a few hundred locks: watchdog leases, and fixed leases still owed to a
//! task that took them over. It gives up the client's turn for a hold whose lease
//! ended. A hold released sooner, as most are, costs an insert and a remove here,
//! and wakes no thread.

use std::collections::BTreeMap;
use std::mem;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::acquisition::Acquisition;
use crate::backend::Renewing;
use crate::telemetry;

/// How long the keeper sleeps at most while holds are pending or new ones keep
/// coming, so that a new hold due later than that needs no wake-up.
///
/// The tick also keeps a timer armed while the client is in use: tokio wakes a
/// parked thread whenever a timer is armed earlier than every other one, and each
/// request on an application's `ConnectionManager` or a Cluster arms one (its
/// bound), so with no timer pending each such request would cost a thread wake-up.
const TICK: Duration = Duration::from_secs(1);

/// How much sooner than due the keeper renews a lease, at most, to renew it with
/// others that fall due then: a quarter of the time between renewals, and no more
/// than this.
pub(super) const EARLY_AT_MOST: Duration = Duration::from_millis(100);

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// An entry in the schedule: when, and a tie-breaker.
pub(super) type Due = (Instant, u64);

/// Whether the keeper looks after a hold's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Care {
    /// At this entry of the schedule, or, once it is taken from there, while its
    /// renewal is on its way.
    Scheduled(Due),
    Ended,
}

#[derive(Default)]
pub(super) struct Keeper {
    schedule: Mutex<BTreeMap<Due, Weak<Acquisition>>>,
    entries: AtomicU64,
    /// Whether a hold started since the keeper last looked.
    in_use: AtomicBool,
    /// When the keeper task looks next, in nanoseconds since `EPOCH`; `u64::MAX`
    /// while it waits for work.
    looks_at: AtomicU64,
    wake: Arc<Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// The number of the keeper task that runs now, 0 while none does: read by every
    /// hold, so that only the first hold after the task ended takes `task`'s lock.
    running: AtomicU64,
}

impl Keeper {
    /// Has `hold` looked after from `at` on, by the keeper task on `runtime`.
    pub(super) fn watch(
        self: &Arc<Self>,
        hold: &Arc<Acquisition>,
        at: Instant,
        runtime: &Handle,
    ) -> Due {
        let due = (at, self.entries.fetch_add(1, Ordering::Relaxed));
        // Read first: a flag already set is not written again by every hold.
        if !self.in_use.load(Ordering::Relaxed) {
            self.in_use.store(true, Ordering::Relaxed);
        }
        self.schedule().insert(due, Arc::downgrade(hold));
        if self.running.load(Ordering::Acquire) == 0 {
            self.start(runtime);
        }
        if nanos(at) < self.looks_at.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
        due
    }

    /// Starts the keeper task on `runtime`, unless another hold just did. A task on a
    /// runtime that has shut down is gone: the next one runs where we are.
    fn start(self: &Arc<Self>, runtime: &Handle) {
        static TASKS: AtomicU64 = AtomicU64::new(1);
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if self.running.load(Ordering::Acquire) != 0 {
            return;
        }
        let number = TASKS.fetch_add(1, Ordering::Relaxed);
        self.running.store(number, Ordering::Release);
        let running = Running {
            keeper: Arc::downgrade(self),
            number,
        };
        if let Some(ended) = task.replace(runtime.spawn(look_after(running))) {
            ended.abort();
        }
    }

    pub(super) fn forget(&self, due: Due) {
        self.schedule().remove(&due);
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, BTreeMap<Due, Weak<Acquisition>>> {
        self.schedule.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes from the schedule the holds due by `now`, and those due a little later
    /// that are worth renewing now with them.
    fn take_due(&self, now: Instant) -> Vec<(Due, Arc<Acquisition>)> {
        // Split off whole, not copied out entry by entry: tens of thousands of leases
        // may fall due together.
        let soon = {
            let mut schedule = self.schedule();
            let later = schedule.split_off(&(now + EARLY_AT_MOST, u64::MAX));
            mem::replace(&mut *schedule, later)
        };
        // Looked at outside the lock: the last reference to a hold, dropped here,
        // releases it, which takes its entry out of the schedule.
        let mut taken = Vec::with_capacity(soon.len());
        let mut not_yet = Vec::new();
        for (due, hold) in soon {
            match hold.upgrade() {
                Some(held) if due.0 <= now + held.renewable_early() => taken.push((due, held)),
                Some(_) => not_yet.push((due, hold)),
                None => {}
            }
        }
        if !not_yet.is_empty() {
            self.schedule().extend(not_yet);
        }
        taken
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// A keeper task's hold on its keeper: dropped when the task ends, however it ends
/// (its runtime shut down, say), it tells the keeper that no task runs.
struct Running {
    keeper: Weak<Keeper>,
    number: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(keeper) = self.keeper.upgrade() {
            let _ = keeper.running.compare_exchange(
                self.number,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }
}

async fn look_after(running: Running) {
    let keeper = &running.keeper;
    loop {
        let Some(this) = keeper.upgrade() else { return };
        let now = Instant::now();
        let mut renewing = Vec::new();
        for (due, hold) in this.take_due(now) {
            if let Some(lease) = hold.looked_at(due) {
                renewing.push((hold, lease));
            }
        }
        if !renewing.is_empty() {
            tokio::spawn(renew(renewing));
        }
        let next = this.schedule().first_key_value().map(|(due, _)| due.0);
        let in_use = this.in_use.swap(false, Ordering::Relaxed);
        let wake_at = match next {
            Some(next) => Some(next.min(now + TICK)),
            None => in_use.then_some(now + TICK),
        };
        this.looks_at
            .store(wake_at.map_or(u64::MAX, nanos), Ordering::Release);
        // An entry scheduled before we published when we look next did not wake us.
        let first = this.schedule().first_key_value().map(|(due, _)| due.0);
        if first.is_some_and(|first| wake_at.is_none_or(|wake_at| first < wake_at)) {
            continue;
        }
        let wake = this.wake.clone();
        let woken = wake.notified();
        // Not kept alive while asleep: a dropped client ends this task.
        drop(this);
        match wake_at {
            Some(wake_at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(wake_at) => {}
                    () = woken => {}
                }
            }
            None => woken.await,
        }
    }
}

fn nanos(at: Instant) -> u64 {
    at.saturating_duration_since(*EPOCH)
        .as_nanos()
        .try_into()
        .unwrap_or(u64::MAX - 1)
}

/// Renews `holds` together, each for its lease, and schedules each again: at its
/// next renewal, soon after an error, or never once its lock is gone.
async fn renew(holds: Vec<(Arc<Acquisition>, Duration)>) {
    let backend = holds[0].0.holds.backend.clone();
    let sent_at = Instant::now();
    let renewals: Vec<_> = holds
        .iter()
        .map(|(hold, lease)| Renewing {
            name: &hold.name,
            token: &hold.token,
            lease: *lease,
        })
        .collect();
    let pending: Vec<_> = holds
        .iter()
        .map(|(hold, lease)| hold.lease.renewal(sent_at, *lease))
        .collect();
    let answers = backend.renew_many(&renewals).await;
    // Whether a hold was released meanwhile is asked only where it matters: the
    // release ended its lease, so no renewal counts for it, and its care, so it is not
    // scheduled again. Asked of every hold, it cost a cache miss a lock.
    for (((hold, lease), renewal), answer) in holds.iter().zip(pending).zip(answers) {
        let every = *lease / 3;
        match answer {
            Ok(renewed) => match renewal.answered(renewed) {
                true => hold.look_again_at(sent_at + every),
                false if hold.is_released() => {}
                false => hold.lose(),
            },
            Err(_) if hold.is_released() => {}
            Err(error) => {
                // Counted as Redis may have applied it, or may still.
                drop(renewal);
                telemetry::renewal_failed(hold.name.key(), &error);
                let retry_every = (every / 4).max(Duration::from_millis(5));
                // Taken up to `renewable_early` sooner, as every entry is: without it
                // a short lease's refusal that comes back at once is asked again at once.
                hold.look_again_at(Instant::now() + retry_every + hold.renewable_early());
            }
        }
    }
}
