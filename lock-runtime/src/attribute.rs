//! What `#[distributed_lock]` expands to: the body runs inside the hold, so that
//! calls it makes on the same key re-enter, and the lock is released on every way
//! out.

use std::future::Future;

pub use crate::{LockClient, LockError, LockGuard, LockKey, LockOptions, default_client};

/// What the generated code does when the lease is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body and return `Err(LockError::Lost)`.
    Cancel,
    /// Let the body finish; it can watch the guard itself.
    Continue,
}

/// Runs the body inside `guard`'s hold, then releases the lock. The body's result
/// stands: it ran while the lease was known valid, and a failed release leaves the
/// lock to expire with its lease.
pub async fn run<T, E, F>(guard: LockGuard, on_lost: OnLost, body: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let result = hold(&guard, on_lost, body).await;
    let _ = guard.release().await;
    result
}

/// Like [`run`], for a body that borrows the guard (`guard = name`).
pub async fn hold<T, E, F>(guard: &LockGuard, on_lost: OnLost, body: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let body = guard.scope(body);
    match on_lost {
        OnLost::Continue => body.await,
        OnLost::Cancel => tokio::select! {
            biased;
            result = body => result,
            () = guard.lost() => Err(E::from(LockError::Lost { key: guard.key().to_owned() })),
        },
    }
}
