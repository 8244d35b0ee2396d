use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The client's requests that run detached from their callers, so that a caller
/// dropped at an await cannot leave a lock behind, counted so that a shutdown can
/// wait for them.
#[derive(Default)]
pub(crate) struct Background {
    pending: Arc<Pending>,
}

#[derive(Default)]
struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

/// Counts one task from its spawn until it ends, however it ends.
struct Counted(Arc<Pending>);

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Background {
    /// Runs `task` on `runtime`; dropping the handle does not cancel it.
    pub(crate) fn spawn_on<T: Send + 'static>(
        &self,
        runtime: &Handle,
        task: impl Future<Output = T> + Send + 'static,
    ) -> JoinHandle<T> {
        self.pending.count.fetch_add(1, Ordering::AcqRel);
        let counted = Counted(self.pending.clone());
        runtime.spawn(async move {
            let _counted = counted;
            task.await
        })
    }

    /// Completes once no request is left running.
    pub(crate) async fn idle(&self) {
        loop {
            let idle = self.pending.idle.notified();
            if self.pending.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}
