use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The client's requests that outlived their callers, counted so that a shutdown
/// can wait for them.
#[derive(Clone, Default)]
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

/// What to do with the answer of a request whose caller has gone.
pub(crate) trait Orphan<T>: Send + Unpin + 'static {
    fn adopt(self, answer: T) -> impl Future<Output = ()> + Send;
}

/// A request that runs to its end even when its caller stops waiting: dropped
/// before its answer, it moves to a background task that completes it and hands the
/// answer to its orphan handler. The caller who waits pays no task of its own.
pub(crate) struct Finishing<T: Send + 'static, O: Orphan<T>> {
    request: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    orphan: Option<O>,
    background: Background,
    runtime: Handle,
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

    /// `request`, finished on `runtime` by `orphan` if its caller goes. Boxed by the
    /// caller, where the future is made: passed unboxed, it was copied once more on
    /// its way into the box.
    pub(crate) fn finishing<T: Send + 'static, O: Orphan<T>>(
        &self,
        runtime: &Handle,
        request: Pin<Box<dyn Future<Output = T> + Send>>,
        orphan: O,
    ) -> Finishing<T, O> {
        Finishing {
            request: Some(request),
            orphan: Some(orphan),
            background: self.clone(),
            runtime: runtime.clone(),
        }
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

impl<T: Send + 'static, O: Orphan<T>> Future for Finishing<T, O> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let request = this
            .request
            .as_mut()
            .expect("a finished request is not polled again");
        let answer = ready!(request.as_mut().poll(cx));
        this.request = None;
        this.orphan = None;
        Poll::Ready(answer)
    }
}

impl<T: Send + 'static, O: Orphan<T>> Drop for Finishing<T, O> {
    fn drop(&mut self) {
        if let (Some(request), Some(orphan)) = (self.request.take(), self.orphan.take()) {
            self.background.spawn_on(&self.runtime, async move {
                orphan.adopt(request.await).await;
            });
        }
    }
}
