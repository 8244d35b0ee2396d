use std::sync::atomic::{AtomicUsize, Ordering, fence};

use tokio::sync::Notify;

/// Tells the tasks waiting for a condition that it may have changed. Unlike a bare
/// [`Notify::notify_waiters`], which takes a lock every time, telling nobody costs
/// one atomic load: most holds end with nobody watching them.
#[derive(Default)]
pub(super) struct Notice {
    notify: Notify,
    listeners: AtomicUsize,
}

/// Counts one listener for as long as it lives, however its future ends.
struct Listening<'a>(&'a AtomicUsize);

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Notice {
    /// Wakes those waiting in [`until`](Self::until); call it after changing what
    /// their condition reads.
    pub(super) fn tell(&self) {
        // Orders the caller's change before the count, as `until` orders its count
        // before reading the condition: one of the two sees the other.
        fence(Ordering::SeqCst);
        if self.listeners.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Completes once `condition` holds, checking it again after every `tell`.
    pub(super) async fn until(&self, condition: impl Fn() -> bool) {
        self.listeners.fetch_add(1, Ordering::SeqCst);
        let _listening = Listening(&self.listeners);
        fence(Ordering::SeqCst);
        loop {
            // Created before the check, so a `tell` after it is not missed.
            let told = self.notify.notified();
            if condition() {
                return;
            }
            told.await;
        }
    }
}
