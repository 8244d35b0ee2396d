//! Distributed locks on Redis for async Rust.
//!
//! Put `#[distributed_lock]` on an async fn, or take locks by hand with a
//! [`LockClient`]. Locks have an owner token and a lease, only their owner releases or
//! renews them, a watchdog renews the lease while the holder works, a task re-enters
//! the locks it holds, and fencing tokens order the holders of one key.
//!
//! ```
//! use std::time::Duration;
//! use lock_runtime::{LockClient, LockError, LockKey, LockOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), LockError> {
//! // `LockClient::connect("redis://127.0.0.1:6379").await?` for Redis.
//! let locks = LockClient::memory();
//! let key = LockKey::new("account").part(42);
//!
//! let guard = locks.acquire(&key, &LockOptions::new()).await?;
//! assert!(locks.try_acquire(&key, &LockOptions::new()).await?.is_some(), "this task re-enters");
//! let elsewhere = tokio::spawn({
//!     let locks = locks.clone();
//!     async move { locks.try_acquire(&key, &LockOptions::new()).await }
//! });
//! assert!(elsewhere.await.unwrap()?.is_none(), "another task is another owner");
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! See the repository's README for the attribute, the guarantees and their limits.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod client;
mod error;
mod fencing;
mod guard;
pub mod history;
#[cfg(any(feature = "axum", feature = "actix"))]
mod http;
mod keeper;
mod key;
mod options;
mod waiting;

use std::sync::RwLock;

pub use crate::client::{ClientConfig, LockClient};
pub use crate::error::LockError;
pub use crate::fencing::fenced_set;
pub use crate::guard::LockGuard;
pub use crate::key::{LockKey, MAX_KEY_LEN};
pub use crate::options::{
    DEFAULT_RETRIES, DEFAULT_RETRY_WAIT, LockOptions, MAX_LEASE, WATCHDOG_LEASE,
};
pub use lock_macros::distributed_lock;

static DEFAULT_CLIENT: RwLock<Option<LockClient>> = RwLock::new(None);

/// Sets the client that `#[distributed_lock]` uses when no `client = "..."` is given.
/// A later call replaces it.
pub fn set_default_client(client: LockClient) {
    *DEFAULT_CLIENT.write().unwrap_or_else(|p| p.into_inner()) = Some(client);
}

/// The client set by [`set_default_client`], or `NoDefaultClient`.
pub fn default_client() -> Result<LockClient, LockError> {
    DEFAULT_CLIENT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or(LockError::NoDefaultClient)
}

/// What `#[distributed_lock]` expands to. Not a public API: it may change in any release.
#[doc(hidden)]
pub mod __private {
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

    /// Runs the body while `guard` is held, then releases the lock. The body's
    /// result stands: it ran while the lease was known valid, and a failed release
    /// leaves the lock to expire with its lease.
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
        match on_lost {
            OnLost::Continue => body.await,
            OnLost::Cancel => tokio::select! {
                biased;
                result = body => result,
                () = guard.lost() => Err(E::from(LockError::Lost { key: guard.key().to_owned() })),
            },
        }
    }
}
