//! What the client reports with the `tracing` and `metrics` features: a span per
//! acquire with its outcome, warnings for lost locks and for an eviction policy that
//! could free locks, the replicas grants wait for, and counters and histograms
//! labelled by store, never by key.
//! Each test runs on a runtime of its own thread with its own subscriber and
//! recorder, so the other tests of the suite do not count here.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockGuard, LockOptions};
use lock_tests::{RedisServer, TcpProxy};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};

#[test]
fn acquires_report_their_outcome_and_never_label_a_key() {
    let redis = RedisServer::start();
    let (spans, events, metrics) = observed(async {
        let holder = LockClient::connect(&redis.url()).await.unwrap();
        let waiter = LockClient::connect(&redis.url()).await.unwrap();
        let guard = holder
            .acquire("invoice:7", &LockOptions::new())
            .await
            .unwrap();
        let busy = waiter
            .acquire("invoice:7", &LockOptions::new().spin(false))
            .await;
        assert!(matches!(busy, Err(LockError::Busy { .. })));
        let patient = LockOptions::new().timeout(Duration::from_millis(100));
        let timeout = waiter.acquire("invoice:7", &patient).await;
        assert!(matches!(timeout, Err(LockError::Timeout { .. })));
        guard.release().await.unwrap();
        waiter
            .acquire("invoice:7", &LockOptions::new())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();

        // Its renewal, a second in, is refused with two seconds of its lease left here.
        let renewed = LockOptions::new()
            .lease(Duration::from_secs(3))
            .watchdog(true);
        let cleared = holder.acquire("invoice:8", &renewed).await.unwrap();
        assert!(waiter.force_unlock("invoice:8").await.unwrap());
        cleared.lost().await;
        drop(cleared);
    });

    let outcomes: Vec<&str> = spans
        .iter()
        .filter(|span| span.name == "lock.acquire")
        .map(|span| span.fields["outcome"].as_str())
        .collect();
    assert_eq!(
        outcomes,
        ["acquired", "busy", "timeout", "acquired", "acquired"]
    );
    for span in spans.iter().filter(|span| span.name == "lock.acquire") {
        assert!(span.fields["key"].starts_with("invoice:"));
        assert!(span.fields["attempts"].parse::<u32>().unwrap() >= 1);
        assert!(span.fields.contains_key("wait_ms"));
    }
    assert!(
        events.iter().any(|event| event
            .fields
            .get("key")
            .is_some_and(|key| key == "invoice:8")
            && event.fields["message"].contains("lock lost: Redis refused to renew it")),
        "no warning that Redis took the lock: {events:?}"
    );

    let metrics = metrics.lock().unwrap();
    let count = |name: &str| metrics.get(&format!("{name}{{backend=redis}}")).copied();
    assert_eq!(count("distributed_lock_acquired_total"), Some(3));
    assert_eq!(count("distributed_lock_busy_total"), Some(1));
    assert_eq!(count("distributed_lock_timeouts_total"), Some(1));
    assert_eq!(
        metrics
            .get("distributed_lock_lost_total{backend=redis,reason=refused}")
            .copied(),
        Some(1)
    );
    assert_eq!(
        count("distributed_lock_wait_seconds"),
        Some(5),
        "one per acquire"
    );
    assert_eq!(
        count("distributed_lock_hold_seconds"),
        Some(3),
        "one per hold"
    );
    for name in metrics.keys() {
        assert!(
            name.ends_with("{backend=redis}") || name.ends_with("{backend=redis,reason=refused}"),
            "a metric labelled by more than its store and why it was lost: {name}"
        );
    }
}

#[test]
fn hand_offs_are_counted() {
    let redis = RedisServer::start();
    let (_, _, metrics) = observed(async {
        let config = ClientConfig::new().hand_off(32, Duration::from_secs(10));
        let client = LockClient::connect_with(&redis.url(), config)
            .await
            .unwrap();
        let first = client.acquire("press", &LockOptions::new()).await.unwrap();
        let mut next = Vec::new();
        for _ in 0..2 {
            let client = client.clone();
            next.push(tokio::spawn(async move {
                let guard = client.acquire("press", &LockOptions::new()).await;
                guard.unwrap().release().await.unwrap();
            }));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        first.release().await.unwrap();
        for task in next {
            task.await.unwrap();
        }
    });
    let metrics = metrics.lock().unwrap();
    // Three holds: the first two handed the lock on, the last released it.
    assert_eq!(
        metrics.get("distributed_lock_hand_offs_total{backend=redis}"),
        Some(&2)
    );
    assert_eq!(
        metrics.get("distributed_lock_hold_seconds{backend=redis}"),
        Some(&3)
    );
}

#[test]
fn a_hold_released_while_its_renewal_is_on_its_way_is_not_reported_lost() {
    let (released, events, metrics) =
        released_while_renewing(ClientConfig::new(), Duration::from_millis(50));
    released.unwrap();
    assert!(
        !logged(&events, "lost"),
        "a released hold was reported lost: {events:?}"
    );
    let metrics = metrics.lock().unwrap();
    assert!(
        !metrics
            .keys()
            .any(|name| name.starts_with("distributed_lock_lost_total")),
        "a released hold was counted lost: {metrics:?}"
    );
}

#[test]
fn a_hold_released_while_its_renewal_fails_is_not_reported_as_renewing() {
    // The renewal gets no answer within the bound, and gives up after the release
    // began; the release, sent later on the same stalled connection, fails too.
    let bound = Duration::from_millis(1_000);
    let config = ClientConfig::new().command_timeout(bound);
    let (released, events, _) = released_while_renewing(config, 2 * bound);
    assert!(
        matches!(released, Err(LockError::Backend { .. })),
        "the answers were not held back past the bound: {released:?}"
    );
    assert!(
        !logged(&events, "renewal failed"),
        "a released hold was reported renewing: {events:?}"
    );
}

#[test]
fn renewals_that_get_no_answer_are_warned_of_with_their_cause_then_the_lease_running_out() {
    let redis = RedisServer::start();
    let config = ClientConfig::new().command_timeout(Duration::from_millis(200));
    let (_, events, metrics) = observed(async {
        let lease = Duration::from_millis(900);
        let (proxy, _client, guard) = held_then_stalled(&redis, config, "invoice:10", lease).await;
        guard.lost().await;
        // The keeper finds the lease run out once the renewal on its way fails too.
        tokio::time::sleep(Duration::from_millis(600)).await;
        proxy.resume();
    });
    let about: Vec<&Seen> = events
        .iter()
        .filter(|event| {
            event
                .fields
                .get("key")
                .is_some_and(|key| key == "invoice:10")
        })
        .collect();
    let failed = about
        .iter()
        .find(|event| event.fields["message"].contains("renewal failed"));
    let error = failed.map(|event| event.fields["error"].as_str());
    assert!(
        error.is_some_and(|error| error.contains("no answer from Redis in time")),
        "the warning does not say why the renewal failed: {about:?}"
    );
    let last = about.last().map(|event| event.fields["message"].as_str());
    assert!(
        last.is_some_and(|last| last.contains("lock lost: its lease ran out")),
        "the loss is not put down to the lease running out: {about:?}"
    );
    assert_eq!(
        metrics
            .lock()
            .unwrap()
            .get("distributed_lock_lost_total{backend=redis,reason=expired}"),
        Some(&1)
    );
}

/// Holds `invoice:9` on a 3 s watchdog lease whose answers are held back from the
/// renewal's on, begins the release, and lets the answers through `answered` later.
/// Returns what the release did, and the events and metrics seen.
fn released_while_renewing(
    config: ClientConfig,
    answered: Duration,
) -> (Result<(), LockError>, Vec<Seen>, Counts) {
    let redis = RedisServer::start();
    let mut released = Ok(());
    let (_, events, metrics) = observed(async {
        let lease = Duration::from_secs(3);
        let (proxy, _client, guard) = held_then_stalled(&redis, config, "invoice:9", lease).await;
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        assert!(guard.is_held());
        let releasing = tokio::spawn(guard.release());
        tokio::time::sleep(answered).await;
        proxy.resume();
        released = releasing.await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    (released, events, metrics)
}

/// A client through a proxy of `redis`, holding `key` on a watchdog `lease`, with the
/// proxy set to hold back every answer from the renewal's on (sent a third of the
/// lease in, it is the next request for the lock).
async fn held_then_stalled(
    redis: &RedisServer,
    config: ClientConfig,
    key: &'static str,
    lease: Duration,
) -> (TcpProxy, LockClient, LockGuard) {
    let proxy = TcpProxy::start(redis.port()).await;
    let client = LockClient::connect_with(&proxy.url(), config)
        .await
        .unwrap();
    let renewed = LockOptions::new().lease(lease).watchdog(true);
    let guard = client.acquire(key, &renewed).await.unwrap();
    proxy.stall_answers_after(key);
    (proxy, client, guard)
}

/// Whether any event, at any level, was logged with `text` in its message.
fn logged(events: &[Seen], text: &str) -> bool {
    events.iter().any(|event| {
        event
            .fields
            .get("message")
            .is_some_and(|message| message.contains(text))
    })
}

#[test]
fn an_eviction_policy_that_could_free_locks_is_warned_of() {
    let evicting =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let safe =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"]);
    let refusing = RedisServer::start_with(&[
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "volatile-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let (_, events, _) = observed(async {
        for redis in [&evicting, &safe, &refusing] {
            LockClient::connect(&redis.url()).await.unwrap();
        }
    });
    let policies: Vec<&str> = events
        .iter()
        .filter_map(|event| event.fields.get("policy"))
        .map(String::as_str)
        .collect();
    assert_eq!(policies, ["allkeys-lru"], "{events:?}");
}

/// What an operator reads to know whether grants wait for a replica: the count at
/// connect, and the count again once a replica added later is waited for.
#[test]
fn the_replicas_grants_wait_for_are_told_at_connect_and_when_one_is_added() {
    let primary = RedisServer::start();
    let (_, events, _) = observed(async {
        let config = ClientConfig::new().replica_timeout(Duration::from_millis(200));
        let client = LockClient::connect_with(&primary.url(), config)
            .await
            .unwrap();
        let replica = RedisServer::start_replica_of(&primary);
        crate::the_added_replica_is_waited_for(&client, &replica).await;
    });
    let counted: Vec<&str> = events
        .iter()
        .filter_map(|event| event.fields.get("replicas"))
        .map(String::as_str)
        .collect();
    assert_eq!(counted, ["0", "1"], "{events:?}");
}

/// Metric values by name, shared with the recorder that counts them.
type Counts = Arc<Mutex<HashMap<String, u64>>>;

/// Runs `work` on a runtime of this thread, under a subscriber and a recorder of its
/// own; returns the closed spans, the events and the metrics it saw.
fn observed(work: impl Future<Output = ()>) -> (Vec<Seen>, Vec<Seen>, Counts) {
    crate::ask_every_subscriber();
    let subscriber = Collector::default();
    let seen = subscriber.seen.clone();
    let recorder = Counting::default();
    let metrics = recorder.values.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || runtime.block_on(work))
    });
    drop(runtime);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (seen.spans, seen.events, metrics)
}

#[derive(Debug, Clone, Default)]
struct Seen {
    name: String,
    fields: HashMap<String, String>,
}

impl Visit for Seen {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.fields
            .insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields
            .insert(field.name().to_owned(), value.to_owned());
    }

    /// The error and its sources, as a subscriber that prints errors shows them.
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut shown = value.to_string();
        let mut source = value.source();
        while let Some(cause) = source {
            shown.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        self.fields.insert(field.name().to_owned(), shown);
    }
}

#[derive(Default)]
struct SeenSoFar {
    /// Open spans, with their metadata and how many handles they have.
    open: HashMap<u64, (Seen, &'static tracing::Metadata<'static>, usize)>,
    /// The spans entered and not yet exited, innermost last: one thread runs all.
    entered: Vec<u64>,
    spans: Vec<Seen>,
    events: Vec<Seen>,
}

/// Keeps every span (its fields as last recorded) and every event.
#[derive(Default)]
struct Collector {
    next_id: AtomicU64,
    seen: Arc<Mutex<SeenSoFar>>,
}

impl Subscriber for Collector {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut seen = Seen {
            name: span.metadata().name().to_owned(),
            ..Seen::default()
        };
        span.record(&mut seen);
        let open = (seen, span.metadata(), 1);
        self.seen.lock().unwrap().open.insert(id, open);
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some((seen, ..)) = self.seen.lock().unwrap().open.get_mut(&span.into_u64()) {
            values.record(seen);
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut seen = Seen {
            name: event.metadata().name().to_owned(),
            ..Seen::default()
        };
        event.record(&mut seen);
        self.seen.lock().unwrap().events.push(seen);
    }

    fn enter(&self, span: &Id) {
        self.seen.lock().unwrap().entered.push(span.into_u64());
    }

    fn exit(&self, span: &Id) {
        let mut seen = self.seen.lock().unwrap();
        if let Some(at) = seen.entered.iter().rposition(|id| *id == span.into_u64()) {
            seen.entered.remove(at);
        }
    }

    fn current_span(&self) -> tracing_core::span::Current {
        let seen = self.seen.lock().unwrap();
        let current = seen
            .entered
            .last()
            .and_then(|id| Some((*id, seen.open.get(id)?.1)));
        match current {
            Some((id, metadata)) => tracing_core::span::Current::new(Id::from_u64(id), metadata),
            None => tracing_core::span::Current::none(),
        }
    }

    fn clone_span(&self, span: &Id) -> Id {
        if let Some((.., handles)) = self.seen.lock().unwrap().open.get_mut(&span.into_u64()) {
            *handles += 1;
        }
        span.clone()
    }

    fn try_close(&self, span: Id) -> bool {
        let mut seen = self.seen.lock().unwrap();
        let id = span.into_u64();
        let Some((.., handles)) = seen.open.get_mut(&id) else {
            return false;
        };
        *handles -= 1;
        if *handles > 0 {
            return false;
        }
        let (closed, ..) = seen.open.remove(&id).unwrap();
        seen.spans.push(closed);
        true
    }
}

/// Counts counter increments and histogram records by name and labels.
#[derive(Default)]
struct Counting {
    values: Counts,
}

struct Count {
    name: String,
    values: Counts,
}

impl Count {
    fn add(&self, by: u64) {
        *self
            .values
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default() += by;
    }
}

impl metrics::CounterFn for Count {
    fn increment(&self, value: u64) {
        self.add(value);
    }

    fn absolute(&self, value: u64) {
        self.values.lock().unwrap().insert(self.name.clone(), value);
    }
}

impl metrics::HistogramFn for Count {
    fn record(&self, _: f64) {
        self.add(1);
    }
}

impl Counting {
    fn count(&self, key: &Key) -> Arc<Count> {
        let labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        Arc::new(Count {
            name: format!("{}{{{}}}", key.name(), labels.join(",")),
            values: self.values.clone(),
        })
    }
}

impl Recorder for Counting {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.count(key))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.count(key))
    }
}
