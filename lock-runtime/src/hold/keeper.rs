//! The client's lease keeper: one task that wakes when a hold has lasted long enough
//! to need looking after (a third of a watchdog lease, or a fixed lease's end), and
//! only then gives that hold a task of its own, which renews it (with the watchdog)
//! and gives up the client's turn once it is lost. A hold released sooner, as most
//! are, costs an insert and a remove here, and wakes no thread.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::acquisition::Acquisition;
use crate::telemetry;

/// How long the keeper sleeps at most while holds are pending, so that a new hold
/// due later than that needs no wake-up.
const TICK: Duration = Duration::from_secs(1);

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// An entry in the schedule: when, and a tie-breaker.
pub(super) type Due = (Instant, u64);

/// Who looks after a hold's lease.
pub(super) enum Care {
    Scheduled(Due),
    Kept(JoinHandle<()>),
    Ended,
}

#[derive(Default)]
pub(super) struct Keeper {
    schedule: Mutex<BTreeMap<Due, Weak<Acquisition>>>,
    entries: AtomicU64,
    /// When the keeper task looks next, in nanoseconds since `EPOCH`; `u64::MAX`
    /// while it waits for work.
    looks_at: AtomicU64,
    wake: Arc<Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
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
        self.schedule().insert(due, Arc::downgrade(hold));
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        // A task on a runtime that has shut down is gone: start one where we are.
        if task.as_ref().is_none_or(JoinHandle::is_finished) {
            *task = Some(runtime.spawn(look_after(Arc::downgrade(self))));
        }
        drop(task);
        if nanos(at) < self.looks_at.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
        due
    }

    pub(super) fn forget(&self, due: Due) {
        self.schedule().remove(&due);
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, BTreeMap<Due, Weak<Acquisition>>> {
        self.schedule.lock().unwrap_or_else(|p| p.into_inner())
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

async fn look_after(keeper: Weak<Keeper>) {
    loop {
        let Some(this) = keeper.upgrade() else { return };
        let now = Instant::now();
        let mut ready = Vec::new();
        let next = {
            let mut schedule = this.schedule();
            while let Some(entry) = schedule.first_entry().filter(|entry| entry.key().0 <= now) {
                ready.push(entry.remove());
            }
            schedule.first_key_value().map(|(due, _)| due.0)
        };
        for hold in ready.iter().filter_map(Weak::upgrade) {
            keep(&hold);
        }
        let wake_at = next.map(|next| next.min(now + TICK));
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

/// Gives a hold that has lasted a task of its own, unless it ended meanwhile.
fn keep(hold: &Arc<Acquisition>) {
    let mut care = hold.care();
    if let Care::Scheduled(_) = &*care {
        let keeping = keep_until_lost(Arc::downgrade(hold));
        *care = Care::Kept(hold.runtime.spawn(keeping));
    }
}

/// With the watchdog, renews the lease every third of it; once the lease is over,
/// lets the client's next task in line go to Redis even if the guard lives on.
/// Aborted when the hold ends.
async fn keep_until_lost(hold: Weak<Acquisition>) {
    let Some(lease_over) = hold.upgrade().map(|hold| hold.lease.watch_end()) else {
        return;
    };
    let renewing = async {
        renew_while_held(&hold).await;
        std::future::pending().await
    };
    tokio::select! {
        () = renewing => {}
        () = lease_over => {}
    }
    if let Some(hold) = hold.upgrade() {
        hold.mark_lost();
    }
}

/// Renewal errors are retried until the lease has run out (counted as the failed
/// renewals may have left it); a refusal means the lock is gone.
async fn renew_while_held(hold: &Weak<Acquisition>) {
    let Some((lease, renew_until, mut next)) = hold.upgrade().and_then(|hold| {
        let lease = hold.watchdog_lease?;
        let renew_until = hold.max_hold.map(|max_hold| hold.acquired_at + max_hold);
        Some((lease, renew_until, hold.acquired_at + lease / 3))
    }) else {
        return;
    };
    let every = lease / 3;
    let retry_every = (every / 4).max(Duration::from_millis(5));
    loop {
        if renew_until.is_some_and(|until| next >= until) {
            return;
        }
        tokio::time::sleep_until(next).await;
        let Some(hold) = hold.upgrade() else { return };
        let sent_at = Instant::now();
        let renewal = hold.lease.renewal(sent_at, lease);
        let backend = &hold.holds.backend;
        match backend.renew(&hold.name, &hold.token, lease).await {
            Ok(renewed) => match renewal.answered(renewed) {
                true => next = sent_at + every,
                false => return hold.mark_lost(),
            },
            Err(error) => {
                drop(renewal);
                if !hold.lease.is_valid() {
                    return hold.mark_lost();
                }
                telemetry::renewal_failed(&hold.name.key, &error);
                next = Instant::now() + retry_every;
            }
        }
    }
}
