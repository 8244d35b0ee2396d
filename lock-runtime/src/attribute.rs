//! What `#[distributed_lock]` expands to: the body runs inside the hold, so that
//! calls it makes on the same key re-enter, and the lock is released on every way
//! out.

use std::future::Future;

pub use crate::{LockClient, LockError, LockGuard, LockKey, LockOptions, default_client};

/// What the generated code does when the lease is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body and return the lock error.
    Cancel,
    /// Let the body finish; it can watch the guard itself.
    Continue,
}

/// A return type that a lock error converts into: what an annotated fn returns when
/// it cannot take the lock, or loses it. The expansion names the fn's return type
/// in this bound, so the compiler, not the macro, decides what fits.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot return a lock error as `{Self}`",
    label = "the fn's return type must implement `CarriesLockError`",
    note = "return `Result<T, E>` with `E: From<LockError>`; with lock-runtime's `axum` \
            feature, also `axum::response::Response` or `impl IntoResponse`; with its \
            `actix` feature, also `actix_web::HttpResponse`"
)]
pub trait CarriesLockError {
    /// The return value that reports `error`.
    fn from_lock_error(error: LockError) -> Self;
}

impl<T, E: From<LockError>> CarriesLockError for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}

#[cfg(feature = "axum")]
impl CarriesLockError for ::axum::response::Response {
    fn from_lock_error(error: LockError) -> Self {
        ::axum::response::IntoResponse::into_response(error)
    }
}

#[cfg(feature = "actix")]
impl CarriesLockError for actix_web::HttpResponse {
    fn from_lock_error(error: LockError) -> Self {
        actix_web::ResponseError::error_response(&error)
    }
}

/// For a fn returning `impl IntoResponse`. Without the `axum` feature, the build fails
/// to find this module, at the fn's return type.
#[cfg(feature = "axum")]
pub mod axum {
    /// The body's value and the lock error both become a `Response`, one type that
    /// the opaque return can stand for.
    pub fn into_response<T>(value: T) -> ::axum::response::Response
    where
        T: ::axum::response::IntoResponse,
    {
        value.into_response()
    }
}

/// Runs the body inside `guard`'s hold, then releases the lock. The body's result
/// stands: it ran while the lease was known valid, and a failed release leaves the
/// lock to expire with its lease. `lost` reports a lost lease in the fn's return
/// type.
pub async fn run<R, F>(guard: LockGuard, on_lost: OnLost, lost: fn(LockError) -> R, body: F) -> R
where
    F: Future<Output = R>,
{
    let result = hold(&guard, on_lost, lost, body).await;
    let _ = guard.release().await;
    result
}

/// Like [`run`], for a body that borrows the guard (`guard = name`).
pub async fn hold<R, F>(guard: &LockGuard, on_lost: OnLost, lost: fn(LockError) -> R, body: F) -> R
where
    F: Future<Output = R>,
{
    let body = guard.scope(body);
    match on_lost {
        OnLost::Continue => body.await,
        OnLost::Cancel => tokio::select! {
            biased;
            result = body => result,
            () = guard.lost() => lost(LockError::Lost { key: guard.key().to_owned() }),
        },
    }
}
