//! Waiting for a busy lock without polling. The tasks of one client that want a key
//! queue for it here, first come first served, so Redis sees one waiter per client
//! however many tasks wait; the task at the head listens for the holder's release.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, watch};
use tokio::time::Instant;

use crate::LockClient;
use crate::key::LockName;

#[derive(Default)]
pub(crate) struct Queues {
    by_name: Mutex<HashMap<String, Arc<Queue>>>,
}

#[derive(Default)]
struct Queue {
    turns: Arc<tokio::sync::Mutex<()>>,
    /// The key's release signals, from when a task of this queue first had to wait
    /// until the queue empties.
    releases: Mutex<Option<watch::Receiver<u64>>>,
}

/// A task's turn at the head of its client's queue for a key. The task keeps its
/// turn while it holds the lock, so the next task in line asks Redis only once the
/// lock is released.
pub(crate) struct Turn {
    client: LockClient,
    name: Arc<LockName>,
    queue: Arc<Queue>,
    permit: Option<OwnedMutexGuard<()>>,
}

impl Queues {
    /// Waits for the caller's turn on `name`, after the tasks that queued earlier.
    pub(crate) async fn wait_turn(&self, client: &LockClient, name: &Arc<LockName>) -> Turn {
        let queue = self.queue(name);
        let permit = queue.turns.clone().lock_owned().await;
        Turn::new(client, name, queue, permit)
    }

    /// The caller's turn on `name` if no task of this client is ahead.
    pub(crate) fn try_turn(&self, client: &LockClient, name: &Arc<LockName>) -> Option<Turn> {
        let queue = self.queue(name);
        let permit = queue.turns.clone().try_lock_owned().ok();
        let turn = Turn::new(client, name, queue, permit?);
        Some(turn)
    }

    fn queue(&self, name: &LockName) -> Arc<Queue> {
        self.by_name().entry(name.hash.clone()).or_default().clone()
    }

    fn by_name(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Queue>>> {
        self.by_name
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Turn {
    fn new(
        client: &LockClient,
        name: &Arc<LockName>,
        queue: Arc<Queue>,
        permit: OwnedMutexGuard<()>,
    ) -> Turn {
        Turn {
            client: client.clone(),
            name: name.clone(),
            queue,
            permit: Some(permit),
        }
    }

    /// The key's release signals, subscribing when no task of the queue has yet.
    /// `None` when subscribing failed: the caller polls instead.
    pub(crate) async fn releases(&self) -> Option<watch::Receiver<u64>> {
        if let Some(releases) = self.subscribed() {
            return Some(releases);
        }
        let releases = self.client.backend().subscribe(&self.name).await.ok()?;
        *self
            .queue
            .releases
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(releases.clone());
        Some(releases)
    }

    /// The key's release signals if the queue already listens for them.
    pub(crate) fn subscribed(&self) -> Option<watch::Receiver<u64>> {
        self.queue
            .releases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.permit.take());
        let queues = &self.client.shared().queues;
        let mut by_name = queues.by_name();
        // The map's reference and ours: nobody else is waiting or holding.
        if Arc::strong_count(&self.queue) == 2 {
            by_name.remove(&self.name.hash);
            drop(by_name);
            let subscribed = self
                .queue
                .releases
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            // Outside a runtime the client is going away with it, and the channel too.
            if let (Some(_), Ok(runtime)) = (subscribed, tokio::runtime::Handle::try_current()) {
                let (client, name) = (self.client.clone(), self.name.clone());
                runtime.spawn(async move { client.backend().unsubscribe(&name).await });
            }
        }
    }
}

/// Sleeps until a release is signalled or `pause` passes; true when signalled.
pub(crate) async fn wait_for_release(
    releases: Option<&mut watch::Receiver<u64>>,
    pause: Duration,
) -> bool {
    let until = Instant::now() + pause;
    if let Some(releases) = releases {
        match tokio::time::timeout_at(until, releases.changed()).await {
            Ok(Ok(())) => return true,
            Err(_elapsed) => return false,
            Ok(Err(_closed)) => {}
        }
    }
    tokio::time::sleep_until(until).await;
    false
}
