//! Distributed locks on Redis for async Rust.
//!
//! Put `#[distributed_lock]` on an async fn, or take locks by hand with a
//! [`LockClient`]. Every acquisition has a token of its own and a lease; only the
//! guard that holds the token releases or renews it, a watchdog renews the lease
//! while the holder works, code running inside a hold re-enters it, and fencing
//! tokens order the holders of one key. The same machinery takes semaphores
//! ([`LockOptions::permits`]), read-write locks ([`LockOptions::shared`]) and several
//! keys at once ([`LockClient::acquire_all`]).
//!
//! ```
//! use lock_runtime::{LockClient, LockError, LockKey, LockOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), LockError> {
//! // `LockClient::connect("redis://127.0.0.1:6379").await?` for Redis.
//! let locks = LockClient::memory();
//! let key = LockKey::new("account").part(42);
//! let options = LockOptions::new();
//!
//! let guard = locks.acquire(&key, &options).await?;
//! assert!(locks.try_acquire(&key, &options).await?.is_none(), "one holder at a time");
//! guard
//!     .scope(async {
//!         let inner = locks.try_acquire(&key, &options).await?;
//!         assert!(inner.is_some(), "code inside the hold re-enters it");
//!         Ok::<_, LockError>(())
//!     })
//!     .await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! For operators, [`LockInspector`] lists the held locks and shows each one's
//! holders, queue and fencing counter (the `locks` command line prints them), and
//! [`LockClient::force_unlock`] frees one that is stuck.
//!
//! A key's path through the crate reads one way down: [`LockClient`] (`client`),
//! then `acquire` (re-entry, the local queue, the attempts), then `hold` (the
//! guard, its lease and watchdog, the re-entry scope), then `queue` (the client's
//! line per key), then `backend` (where locks live). See the repository's README for
//! the attribute, the guarantees and their limits.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// The README's code blocks, compiled as doctests of this crate (`README.md` here is a
// symlink to the workspace's, which `cargo package` copies). The attribute and
// shutdown blocks need the `axum` feature, the TLS block the `tls` feature:
// `cargo test -p lock-runtime --all-features --doc` (the workspace's tests enable both).
#[cfg(all(doctest, feature = "axum", feature = "tls"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// What `#[distributed_lock]` expands to. Not a public API: it may change in any release.
#[doc(hidden)]
#[path = "attribute.rs"]
pub mod __private;
mod acquire;
mod backend;
mod client;
mod error;
mod fencing;
pub mod history;
mod hold;
#[cfg(any(feature = "axum", feature = "actix"))]
mod http;
mod inspect;
mod key;
mod options;
mod queue;
mod telemetry;

/// The SHA1 of each lock script by name, for the bench's counts. Not a public API.
#[doc(hidden)]
pub use crate::backend::script_hashes as __script_hashes;
pub use crate::client::{
    ClientConfig, DEFAULT_HAND_OFF_WINDOW, DEFAULT_HAND_OFFS, DEFAULT_REPLICA_TIMEOUT, LockClient,
    default_client, set_default_client,
};
pub use crate::error::LockError;
pub use crate::fencing::fenced_set;
pub use crate::hold::LockGuard;
pub use crate::inspect::{Holder, LockInspector, LockKind, LockState, Waiter};
pub use crate::key::{LockKey, MAX_KEY_LEN};
pub use crate::options::{
    DEFAULT_RETRIES, DEFAULT_RETRY_WAIT, LockOptions, MAX_LEASE, MIN_LEASE, WATCHDOG_LEASE,
};
pub use lock_macros::distributed_lock;
/// The redis-rs this crate is built on, so that a [`redis::Client`] or
/// `ConnectionManager` given to [`LockClient`] comes from the same version.
pub use redis;
