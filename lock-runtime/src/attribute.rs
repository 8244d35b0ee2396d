//! What `#[distributed_lock]` expands to: the body runs inside the hold, so that
//! calls it makes on the same key re-enter, and the lock is released on every way
//! out.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

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

/// The error type of a `Result` that an annotated fn returns: one a lock error
/// converts into. It stands for `From<LockError>` so that a type without it is
/// reported with what to do, when that is not to write the impl: another crate's
/// type, such as axum's `StatusCode`, cannot have it.
#[diagnostic::on_unimplemented(
    message = "a lock error cannot become `{Self}`: it does not implement `From<LockError>`",
    label = "`#[distributed_lock]` returns a lock error as this `Result`'s error",
    note = "for an error type of your own, add `impl From<LockError> for {Self}`",
    note = "another crate's type cannot have that impl (the orphan rule): return an error \
            type of your own that converts from both, or, with lock-runtime's `axum` feature, \
            `impl IntoResponse` or `Response`, which turn a lock error into a 423, 409 or 503 \
            response"
)]
pub trait FromLockError {
    /// The error that reports `error`.
    fn from_lock_error(error: LockError) -> Self;
}

#[diagnostic::do_not_recommend]
impl<E: From<LockError>> FromLockError for E {
    fn from_lock_error(error: LockError) -> Self {
        E::from(error)
    }
}

impl<T, E: FromLockError> CarriesLockError for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from_lock_error(error))
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

/// Where an annotated fn that takes the default prefix is written: one per use of
/// the attribute, so that two fns that come to the same default prefix can be told
/// apart.
#[derive(Debug)]
pub struct Site {
    /// Set once this site is known to be the only one with its prefix.
    sole: AtomicBool,
}

impl Site {
    /// A site not yet checked.
    #[allow(clippy::new_without_default, reason = "only ever a `static`")]
    pub const fn new() -> Site {
        Site {
            sole: AtomicBool::new(false),
        }
    }
}

/// Which site first used each default prefix in this process.
static DEFAULT_PREFIXES: Mutex<BTreeMap<&'static str, &'static Site>> = Mutex::new(BTreeMap::new());

/// The default prefix, module path and fn name, of the fn written at `site`; or
/// `InvalidOptions` when a fn written elsewhere already used it in this process. The
/// attribute sees only the fn: an associated fn of a type, with no `self`, looks like
/// a free fn, and two of them named alike in one module would share a lock.
pub fn default_prefix(
    site: &'static Site,
    prefix: &'static str,
) -> Result<&'static str, LockError> {
    if site.sole.load(Ordering::Acquire) {
        return Ok(prefix);
    }
    let first = *DEFAULT_PREFIXES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(prefix)
        .or_insert(site);
    if !std::ptr::eq(first, site) {
        return Err(LockError::InvalidOptions {
            key: prefix.to_owned(),
            reason: "another annotated fn already took this default prefix, the module path and \
                     the fn's name: two associated fns named alike on two types in one module, or \
                     two fns named alike in two bodies; give each a `prefix` of its own"
                .to_owned(),
        });
    }
    site.sole.store(true, Ordering::Release);
    Ok(prefix)
}
