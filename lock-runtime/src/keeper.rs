//! The client's lease keeper: one task that wakes when a hold has lasted long enough
//! to need looking after (a third of a watchdog lease, or a fixed lease's end), and
//! only then gives that hold a task of its own. A hold released sooner, as most are,
//! costs an insert and a remove here, and wakes no thread.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::guard::Hold;

/// How long the keeper sleeps at most while holds are pending, so that a new hold
/// due later than that needs no wake-up.
const TICK: Duration = Duration::from_secs(1);

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// An entry in the schedule: when, and a tie-breaker.
pub(crate) type Due = (Instant, u64);

#[derive(Default)]
pub(crate) struct Keeper {
    schedule: Mutex<BTreeMap<Due, Weak<Hold>>>,
    entries: AtomicU64,
    /// When the keeper task looks next, in nanoseconds since `EPOCH`; `u64::MAX`
    /// while it waits for work.
    looks_at: AtomicU64,
    wake: Arc<Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Keeper {
    /// Has `hold` looked after from `at` on, by the keeper task on `runtime`.
    pub(crate) fn watch(self: &Arc<Self>, hold: &Arc<Hold>, at: Instant, runtime: &Handle) -> Due {
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

    pub(crate) fn forget(&self, due: Due) {
        self.schedule().remove(&due);
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, BTreeMap<Due, Weak<Hold>>> {
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
            hold.keep();
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
