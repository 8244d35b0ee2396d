//! What the client reports about its locks, each behind its feature: `tracing`
//! spans and events, and `metrics` counters and histograms. Metrics are labelled by
//! the kind of store only, never by key: keys are unbounded and may carry user data.
//! Without the features every call here is empty.

use std::future::Future;

use tokio::time::Instant;

use crate::LockError;

/// Runs `acquiring` inside a `lock.acquire` span (at DEBUG) that records the key, the
/// attempts made at the store, the wait and the outcome.
pub(crate) fn acquire_span<F: Future>(key: &str, acquiring: F) -> impl Future<Output = F::Output> {
    #[cfg(feature = "tracing")]
    {
        use tracing::field::Empty;
        let span = tracing::debug_span!(
            "lock.acquire",
            key,
            attempts = 0u32,
            wait_ms = Empty,
            outcome = Empty,
        );
        tracing::Instrument::instrument(acquiring, span)
    }
    #[cfg(not(feature = "tracing"))]
    {
        let _ = key;
        acquiring
    }
}

/// One more attempt at the store for the acquire in progress.
pub(crate) fn attempted(attempts: u32) {
    #[cfg(feature = "tracing")]
    tracing::Span::current().record("attempts", attempts);
    let _ = attempts;
}

/// How an acquire started at `started` ended, on a store of `kind`.
pub(crate) fn acquired<T>(outcome: &Result<T, LockError>, started: Instant, kind: &'static str) {
    let outcome = match outcome {
        Ok(_) => "acquired",
        Err(LockError::Busy { .. }) => "busy",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(_) => "error",
    };
    // Read only where something records it.
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    let waited = started.elapsed();
    #[cfg(feature = "tracing")]
    {
        let span = tracing::Span::current();
        span.record("wait_ms", waited.as_secs_f64() * 1e3);
        span.record("outcome", outcome);
    }
    #[cfg(feature = "metrics")]
    {
        let counter = match outcome {
            "acquired" => "distributed_lock_acquired_total",
            "busy" => "distributed_lock_busy_total",
            "timeout" => "distributed_lock_timeouts_total",
            _ => "distributed_lock_errors_total",
        };
        metrics::counter!(counter, "backend" => kind).increment(1);
        metrics::histogram!("distributed_lock_wait_seconds", "backend" => kind)
            .record(waited.as_secs_f64());
    }
    let _ = (outcome, started, kind);
}

/// When a hold began: the clock is read only where something records it.
#[derive(Clone, Copy)]
pub(crate) struct Since {
    #[cfg(feature = "metrics")]
    at: Instant,
}

impl Since {
    pub(crate) fn now() -> Since {
        Since {
            #[cfg(feature = "metrics")]
            at: Instant::now(),
        }
    }
}

/// A hold that began at `since` ended: released, or handed on within the client.
pub(crate) fn held(since: Since, handed_on: bool, kind: &'static str) {
    #[cfg(feature = "metrics")]
    {
        metrics::histogram!("distributed_lock_hold_seconds", "backend" => kind)
            .record(since.at.elapsed().as_secs_f64());
        if handed_on {
            metrics::counter!("distributed_lock_hand_offs_total", "backend" => kind).increment(1);
        }
    }
    let _ = (since, handed_on, kind);
}

/// The lease on `key` is known lost for good.
pub(crate) fn lost(key: &str, kind: &'static str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        key,
        "lock lost: its lease was refused or ran out before the holder let go"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_lost_total", "backend" => kind).increment(1);
    let _ = (key, kind);
}

/// The watchdog could not renew `key`'s lease; it tries again while the lease lasts.
pub(crate) fn renewal_failed(key: &str, error: &LockError) {
    #[cfg(feature = "tracing")]
    tracing::warn!(key, %error, "lock renewal failed; retrying while the lease lasts");
    let _ = (key, error);
}

/// Releasing `key` failed where nobody is told (the attribute, a dropped guard):
/// the lock stays until its lease ends.
pub(crate) fn release_failed(key: &str, error: &LockError) {
    #[cfg(feature = "tracing")]
    tracing::warn!(key, %error, "lock release failed; the lock frees when its lease ends");
    let _ = (key, error);
}

/// Redis may evict keys under memory pressure with `policy`, lock keys included.
pub(crate) fn eviction_possible(policy: &str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        policy,
        "Redis may evict lock keys under memory pressure, freeing held locks; \
         set `maxmemory-policy noeviction` on the Redis that holds locks"
    );
    let _ = policy;
}

/// Whether anything listens to [`eviction_possible`], so that the check is worth a
/// round trip.
pub(crate) const WARNS: bool = cfg!(feature = "tracing");
