//! What the client reports about its locks, each behind its feature: `tracing`
//! spans and events, and `metrics` counters and histograms. Metrics are labelled by
//! the kind of store (and a lost lock by why), never by key: keys are unbounded and
//! may carry user data.
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

/// How an acquire started at `started` ended, counted in the client's `meters`.
pub(crate) fn acquired<T>(outcome: &Result<T, LockError>, started: Instant, meters: &Meters) {
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
        meters.count(match outcome {
            "acquired" => Count::Acquired,
            "busy" => Count::Busy,
            "timeout" => Count::Timeouts,
            _ => Count::Errors,
        });
        meters.record(Spread::Wait, waited);
    }
    let _ = (outcome, started, meters);
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
pub(crate) fn held(since: Since, handed_on: bool, meters: &Meters) {
    #[cfg(feature = "metrics")]
    {
        meters.record(Spread::Hold, since.at.elapsed());
        if handed_on {
            meters.count(Count::HandOffs);
        }
    }
    let _ = (since, handed_on, meters);
}

/// The lease on `key` is known lost for good: `taken` from its holder while it was
/// still valid by this process's clock (Redis refused to renew it), or run out
/// before a renewal got through.
pub(crate) fn lost(key: &str, taken: bool, meters: &Meters) {
    #[cfg(feature = "tracing")]
    match taken {
        true => tracing::warn!(
            key,
            "lock lost: Redis refused to renew it while its lease was running here; as after \
             a forced unlock, an eviction or a failover"
        ),
        false => tracing::warn!(
            key,
            "lock lost: its lease ran out before a renewal got through"
        ),
    }
    #[cfg(feature = "metrics")]
    meters.count(match taken {
        true => Count::Refused,
        false => Count::Expired,
    });
    let _ = (key, taken, meters);
}

/// Redis granted `key` only after the lease asked for could have run out; the
/// acquire gives it back and asks again.
pub(crate) fn granted_late(key: &str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        key,
        "lock granted too late to use: its lease could have run out before the answer came; \
         asking again"
    );
    let _ = key;
}

/// The watchdog could not renew `key`'s lease; it tries again while the lease lasts.
pub(crate) fn renewal_failed(key: &str, error: &LockError) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        key,
        error = with_sources(error),
        "lock renewal failed; retrying while the lease lasts"
    );
    let _ = (key, error);
}

/// Releasing `key` failed where nobody is told (the attribute, a dropped guard):
/// the lock stays until its lease ends.
pub(crate) fn release_failed(key: &str, error: &LockError) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        key,
        error = with_sources(error),
        "lock release failed; the lock frees when its lease ends"
    );
    let _ = (key, error);
}

/// `error` recorded as an error, so that subscribers show its sources too: the
/// cause of a `Backend` error (no answer in time, a refused connection, an error
/// reply) is its source, which its own message leaves out.
#[cfg(feature = "tracing")]
fn with_sources(error: &LockError) -> &(dyn std::error::Error + 'static) {
    error
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

/// The client counted the replicas of its primaries, at connect or with a count
/// other than the last: from now on a grant waits for one of them to acknowledge it,
/// where its primary has any.
pub(crate) fn replicas_counted(replicas: &impl std::fmt::Display) {
    #[cfg(feature = "tracing")]
    tracing::info!(
        %replicas,
        "replicas counted; a grant waits for one to acknowledge it where its primary has any"
    );
    let _ = replicas;
}

/// The Cluster would not list its shards (`CLUSTER SHARDS`, refused by the user's
/// ACL): a replica it flags failed while the client counts, or a primary it failed
/// over from and that is not back yet, is not counted, and grants on its slots wait
/// for none. Said once a process: the replicas are counted again every few seconds.
pub(crate) fn failed_replicas_uncounted() {
    #[cfg(feature = "tracing")]
    {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                "the Cluster refused `CLUSTER SHARDS`, so a replica that is down now, or a \
                 primary failed over from and not back yet, is not counted, and grants on \
                 its slots will not wait for a replica; allow `cluster|shards` to the user"
            );
        }
    }
}

/// Whether anything listens to [`eviction_possible`], so that the check is worth a
/// round trip.
pub(crate) const WARNS: bool = cfg!(feature = "tracing");

/// A client's metrics, labelled with its kind of store. They are registered once,
/// with the recorder in use when the client first records, so that a hold does not
/// look each one up by name and labels, as the `metrics` macros do, on a path that
/// is otherwise a few thousand instructions. Recorded under another recorder (one
/// installed later, or one local to a thread), they are looked up each time.
pub(crate) struct Meters {
    kind: &'static str,
    #[cfg(feature = "metrics")]
    registered: std::sync::OnceLock<Registered>,
}

#[cfg(feature = "metrics")]
#[derive(Clone, Copy)]
enum Count {
    Acquired,
    Busy,
    Timeouts,
    Errors,
    HandOffs,
    /// Lost: Redis refused to renew it while its lease ran here.
    Refused,
    /// Lost: its lease ran out before a renewal got through.
    Expired,
}

#[cfg(feature = "metrics")]
#[derive(Clone, Copy)]
enum Spread {
    Wait,
    Hold,
}

#[cfg(feature = "metrics")]
struct Registered {
    /// The address of the recorder they were registered with.
    recorder: usize,
    counts: [metrics::Counter; Count::ALL.len()],
    spreads: [metrics::Histogram; Spread::ALL.len()],
}

#[cfg(feature = "metrics")]
impl Count {
    const ALL: [Count; 7] = [
        Count::Acquired,
        Count::Busy,
        Count::Timeouts,
        Count::Errors,
        Count::HandOffs,
        Count::Refused,
        Count::Expired,
    ];

    fn name(self) -> &'static str {
        match self {
            Count::Acquired => "distributed_lock_acquired_total",
            Count::Busy => "distributed_lock_busy_total",
            Count::Timeouts => "distributed_lock_timeouts_total",
            Count::Errors => "distributed_lock_errors_total",
            Count::HandOffs => "distributed_lock_hand_offs_total",
            Count::Refused | Count::Expired => "distributed_lock_lost_total",
        }
    }

    fn counter(self, kind: &'static str) -> metrics::Counter {
        let name = self.name();
        match self {
            Count::Refused => metrics::counter!(name, "backend" => kind, "reason" => "refused"),
            Count::Expired => metrics::counter!(name, "backend" => kind, "reason" => "expired"),
            _ => metrics::counter!(name, "backend" => kind),
        }
    }
}

#[cfg(feature = "metrics")]
impl Spread {
    const ALL: [Spread; 2] = [Spread::Wait, Spread::Hold];

    fn name(self) -> &'static str {
        match self {
            Spread::Wait => "distributed_lock_wait_seconds",
            Spread::Hold => "distributed_lock_hold_seconds",
        }
    }
}

impl Meters {
    pub(crate) fn new(kind: &'static str) -> Meters {
        Meters {
            kind,
            #[cfg(feature = "metrics")]
            registered: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }
}

#[cfg(feature = "metrics")]
impl Meters {
    fn count(&self, count: Count) {
        match self.registered() {
            Some(registered) => registered.counts[count as usize].increment(1),
            None => count.counter(self.kind).increment(1),
        }
    }

    fn record(&self, spread: Spread, value: std::time::Duration) {
        let value = value.as_secs_f64();
        match self.registered() {
            Some(registered) => registered.spreads[spread as usize].record(value),
            None => metrics::histogram!(spread.name(), "backend" => self.kind).record(value),
        }
    }

    /// The handles, if the recorder in use is the one they were registered with.
    fn registered(&self) -> Option<&Registered> {
        let recorder =
            metrics::with_recorder(|recorder| std::ptr::from_ref(recorder).cast::<()>() as usize);
        let kind = self.kind;
        let registered = self.registered.get_or_init(|| Registered {
            recorder,
            counts: Count::ALL.map(|count| count.counter(kind)),
            spreads: Spread::ALL
                .map(|spread| metrics::histogram!(spread.name(), "backend" => kind)),
        });
        (registered.recorder == recorder).then_some(registered)
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    use super::{Count, Meters};

    /// Adds up the increments of every counter registered with it.
    #[derive(Default)]
    struct Tally(Arc<AtomicU64>);

    impl Recorder for Tally {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.0.clone())
        }

        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }

        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn metrics_go_to_the_recorder_in_use_not_only_the_first() {
        let meters = Meters::new("redis");
        let (first, later) = (Tally::default(), Tally::default());
        metrics::with_local_recorder(&first, || {
            meters.count(Count::Acquired);
            meters.count(Count::HandOffs);
        });
        metrics::with_local_recorder(&later, || meters.count(Count::Acquired));
        meters.count(Count::Refused);
        metrics::with_local_recorder(&first, || meters.count(Count::Acquired));
        assert_eq!(first.0.load(Ordering::Relaxed), 3);
        assert_eq!(later.0.load(Ordering::Relaxed), 1);
    }
}
