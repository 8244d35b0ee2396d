//! `#[distributed_lock]` on real Redis: free fns on the default client, methods with
//! their own client, re-entry through nested and recursive calls, fail-fast, what
//! happens to the body when the lease is lost, whole bodies locked in every shape
//! the attribute takes, and default prefixes that two fns never share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, distributed_lock};
use lock_tests::RedisServer;
use redis::AsyncCommands;
use tokio::time::Instant;

/// Counts the callers inside a section at once, and the most ever seen.
#[derive(Default)]
pub(crate) struct Overlap {
    inside: AtomicUsize,
    most: AtomicUsize,
}

impl Overlap {
    pub(crate) async fn section(&self, lasting: Duration) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(lasting).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    pub(crate) fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

#[distributed_lock(prefix = "payout", keys = "account", wait_ms = 5, timeout_ms = 30_000)]
async fn pay_out(
    redis: &mut redis::aio::MultiplexedConnection,
    account: u64,
) -> Result<(), LockError> {
    let balance: i64 = redis.get("balance").await.unwrap_or(0);
    tokio::task::yield_now().await;
    let () = redis.set("balance", balance + 1).await.unwrap();
    Ok(())
}

/// The only test in this binary that sets the default client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_fn_on_the_default_client_runs_alone() {
    let redis = RedisServer::start();
    lock_runtime::set_default_client(LockClient::connect(&redis.url()).await.unwrap());
    let client = redis::Client::open(redis.url()).unwrap();
    let callers: Vec<_> = (0..16)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut data = client.get_multiplexed_async_connection().await.unwrap();
                for _ in 0..20 {
                    pay_out(&mut data, 7).await.unwrap();
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    let balance: i64 = client
        .get_multiplexed_async_connection()
        .await
        .unwrap()
        .get("balance")
        .await
        .unwrap();
    assert_eq!(balance, 16 * 20);
}

struct Inventory {
    locks: LockClient,
    shard: u32,
    overlap: Overlap,
}

impl Inventory {
    #[distributed_lock(client = "self.locks", prefix = "inventory", keys = ["self.shard", "sku"], timeout_ms = 10_000)]
    async fn reserve(&self, sku: &str) -> Result<(), LockError> {
        self.overlap.section(Duration::from_millis(5)).await;
        Ok(())
    }

    #[distributed_lock(client = "self.locks", prefix = "inventory", keys = ["self.shard", "sku"], spin = false)]
    async fn reserve_or_give_up(&self, sku: &str) -> Result<(), LockError> {
        self.overlap.section(Duration::from_secs(1)).await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_locks_through_its_own_client() {
    let redis = RedisServer::start();
    let inventory = Arc::new(Inventory {
        locks: LockClient::connect(&redis.url()).await.unwrap(),
        shard: 3,
        overlap: Overlap::default(),
    });
    let callers: Vec<_> = (0..20)
        .map(|_| {
            let inventory = inventory.clone();
            tokio::spawn(async move { inventory.reserve("sku-9").await })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    assert_eq!(
        inventory.overlap.most(),
        1,
        "two callers were inside at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_returns_busy_while_the_lock_is_held() {
    let redis = RedisServer::start();
    let inventory = Arc::new(Inventory {
        locks: LockClient::connect(&redis.url()).await.unwrap(),
        shard: 1,
        overlap: Overlap::default(),
    });
    let holder = tokio::spawn({
        let inventory = inventory.clone();
        async move { inventory.reserve_or_give_up("sku-1").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let busy = inventory.reserve_or_give_up("sku-1").await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "it failed at once instead of waiting out the holder's second"
    );
    match busy {
        Err(LockError::Busy { key, .. }) => {
            assert_eq!(key, "inventory:1:sku-1")
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    holder.await.unwrap().unwrap();
    inventory.reserve_or_give_up("sku-1").await.unwrap();
}

#[distributed_lock(client = "locks", prefix = "tree", keys = "root", timeout_ms = 1_000)]
async fn walk(locks: &LockClient, root: u32, depth: u32) -> Result<u32, LockError> {
    if depth == 0 {
        return Ok(0);
    }
    Ok(1 + Box::pin(walk(locks, root, depth - 1)).await?)
}

#[distributed_lock(
    client = "locks",
    prefix = "ledger",
    keys = "account",
    timeout_ms = 1_000
)]
async fn debit(locks: &LockClient, account: u32, cents: u32) -> Result<u32, LockError> {
    if cents > 100 {
        return Box::pin(credit(locks, account, cents - 100)).await;
    }
    Ok(cents)
}

#[distributed_lock(
    client = "locks",
    prefix = "ledger",
    keys = "account",
    timeout_ms = 1_000
)]
async fn credit(locks: &LockClient, account: u32, cents: u32) -> Result<u32, LockError> {
    Box::pin(debit(locks, account, cents)).await
}

#[distributed_lock(
    client = "locks",
    prefix = "ledger",
    keys = "account",
    reentrant = false
)]
async fn audit(locks: &LockClient, account: u32) -> Result<(), LockError> {
    Box::pin(audit(locks, account)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_in_one_task_re_enter_and_spawned_tasks_wait() {
    let redis = RedisServer::start();
    let locks = LockClient::connect(&redis.url()).await.unwrap();

    let trips = redis.lock_calls();
    assert_eq!(
        walk(&locks, 1, 100).await.unwrap(),
        100,
        "100 nested calls re-entered"
    );
    assert_eq!(
        redis.lock_calls() - trips,
        2,
        "one acquire and one release for all of them"
    );

    assert_eq!(
        debit(&locks, 5, 450).await.unwrap(),
        50,
        "two fns on one key call each other"
    );

    let nested = audit(&locks, 5).await;
    assert!(
        matches!(nested, Err(LockError::Reentered { .. })),
        "{nested:?}"
    );

    assert!(
        parent(&locks, 1).await.unwrap(),
        "the spawned child waited for its parent's lock"
    );
}

/// Holds `tree:<root>` while a task it spawned asks for the same lock.
#[distributed_lock(client = "locks", prefix = "tree", keys = "root", timeout_ms = 5_000)]
async fn parent(locks: &LockClient, root: u32) -> Result<bool, LockError> {
    let child = tokio::spawn({
        let locks = locks.clone();
        async move { walk(&locks, root, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(!child.is_finished())
}

#[distributed_lock(client = "locks", prefix = "import", expire_ms = 300, watchdog = true)]
async fn long_import(locks: &LockClient, finished: &AtomicBool) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(client = "locks", prefix = "import", expire_ms = 300, watchdog = true, on_lost = "continue", guard = lock)]
async fn careful_import(locks: &LockClient) -> Result<bool, LockError> {
    tokio::time::sleep(Duration::from_millis(400)).await;
    Ok(lock.is_held())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_cancels_the_body_or_lets_it_see_the_loss() {
    let redis = RedisServer::start();
    let locks = LockClient::connect(&redis.url()).await.unwrap();
    let data = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let delete_soon = |mut data: redis::aio::MultiplexedConnection| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let () = data.del("lock:{import}").await.unwrap();
        Instant::now()
    };

    let finished = AtomicBool::new(false);
    let deleting = tokio::spawn(delete_soon(data.clone()));
    let result = long_import(&locks, &finished).await;
    let cancelled_after = deleting.await.unwrap().elapsed();
    assert!(
        matches!(result, Err(LockError::Lost { ref key, .. }) if key == "import"),
        "{result:?}"
    );
    assert!(!finished.load(Ordering::SeqCst), "the body was dropped");
    assert!(
        cancelled_after <= Duration::from_millis(100) + Duration::from_millis(150),
        "cancelled after {cancelled_after:?}"
    );

    let deleting = tokio::spawn(delete_soon(data.clone()));
    assert!(
        !careful_import(&locks).await.unwrap(),
        "the body ran on and saw the loss"
    );
    deleting.await.unwrap();
}

/// Two fns named alike in two modules: by default, two locks.
mod orders {
    use super::*;

    #[distributed_lock(client = "locks", spin = false)]
    pub(super) async fn cancel(locks: &LockClient, busy_for: Duration) -> Result<(), LockError> {
        tokio::time::sleep(busy_for).await;
        Ok(())
    }
}

mod payments {
    use super::*;

    #[distributed_lock(client = "locks", spin = false)]
    pub(super) async fn cancel(locks: &LockClient, busy_for: Duration) -> Result<(), LockError> {
        tokio::time::sleep(busy_for).await;
        Ok(())
    }
}

#[distributed_lock(client = "locks", prefix = "tenant:order", keys = "id", spin = false)]
async fn tenant_order(locks: &LockClient, id: u64) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_prefix_is_the_module_path_and_a_prefix_is_taken_as_written() {
    let redis = RedisServer::start();
    let here = LockClient::connect(&redis.url()).await.unwrap();
    let there = LockClient::connect(&redis.url()).await.unwrap();

    let order_cancel = tokio::spawn({
        let here = here.clone();
        async move { orders::cancel(&here, Duration::from_millis(500)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    payments::cancel(&there, Duration::ZERO)
        .await
        .expect("payments::cancel takes a lock of its own");
    let busy = orders::cancel(&there, Duration::ZERO).await;
    match busy {
        Err(LockError::Busy { key, .. }) => assert_eq!(key, "suite::attribute::orders::cancel"),
        other => panic!("expected Busy, got {other:?}"),
    }
    order_cancel.await.unwrap().unwrap();

    let by_hand = there
        .acquire("tenant:order:42", &lock_runtime::LockOptions::new())
        .await
        .unwrap();
    let busy = tenant_order(&here, 42).await;
    assert!(
        matches!(busy, Err(LockError::Busy { ref key, .. }) if key == "tenant:order:42"),
        "{busy:?}"
    );
    by_hand.release().await.unwrap();
    tenant_order(&here, 42).await.unwrap();
}

#[distributed_lock(client = "locks", prefix = "pair", keys = "id", timeout_ms = 5_000)]
async fn both_halves(locks: &LockClient, id: u32, overlap: &Overlap) -> Result<(), LockError> {
    let (first, second) = tokio::join!(half(locks, id, overlap), half(locks, id, overlap));
    first.and(second)
}

#[distributed_lock(client = "locks", prefix = "pair", keys = "id", timeout_ms = 5_000)]
async fn half(locks: &LockClient, id: u32, overlap: &Overlap) -> Result<(), LockError> {
    overlap.section(Duration::from_millis(50)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sections_joined_in_one_body_take_turns() {
    let redis = RedisServer::start();
    let locks = LockClient::connect(&redis.url()).await.unwrap();
    let overlap = Overlap::default();
    let trips = redis.lock_calls();
    tokio::time::timeout(Duration::from_secs(5), both_halves(&locks, 3, &overlap))
        .await
        .expect("no deadlock")
        .unwrap();
    assert_eq!(overlap.most(), 1, "the two halves ran at once");
    assert_eq!(
        redis.lock_calls() - trips,
        2,
        "the halves re-entered the body's lock"
    );
}

/// Stock held in one Redis and reserved through two clients, as two instances of a
/// service would.
#[async_trait::async_trait]
trait Reserve {
    async fn reserve(&self, sku: &str) -> Result<(), LockError>;
    async fn reserve_now(&self, (sku, lasting): (&str, Duration)) -> Result<(), LockError>;
}

struct Warehouse {
    locks: LockClient,
    shard: u32,
    overlap: Arc<Overlap>,
}

#[async_trait::async_trait]
impl Reserve for Warehouse {
    #[distributed_lock(client = "self.locks", prefix = "stock", keys(self.shard, sku), timeout_ms = 10_000)]
    async fn reserve(&self, sku: &str) -> Result<(), LockError> {
        self.overlap.section(Duration::from_millis(5)).await;
        Ok(())
    }

    #[distributed_lock(client = "self.locks", prefix = "stock", keys(self.shard, sku), spin = false)]
    async fn reserve_now(&self, (sku, lasting): (&str, Duration)) -> Result<(), LockError> {
        self.overlap.section(lasting).await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_trait_method_locks_across_two_clients() {
    let redis = RedisServer::start();
    let overlap = Arc::new(Overlap::default());
    let mut warehouses = Vec::new();
    for _ in 0..2 {
        warehouses.push(Arc::new(Warehouse {
            locks: LockClient::connect(&redis.url()).await.unwrap(),
            shard: 2,
            overlap: overlap.clone(),
        }));
    }
    let callers: Vec<_> = (0..20)
        .map(|caller| {
            let warehouse = warehouses[caller % 2].clone();
            tokio::spawn(async move { warehouse.reserve("sku-5").await })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    assert_eq!(overlap.most(), 1, "two callers were inside at once");

    let holder = tokio::spawn({
        let warehouse = warehouses[0].clone();
        async move {
            warehouse
                .reserve_now(("sku-6", Duration::from_millis(500)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = warehouses[1].reserve_now(("sku-6", Duration::ZERO)).await;
    assert!(
        matches!(busy, Err(LockError::Busy { ref key, .. }) if key == "stock:2:sku-6"),
        "{busy:?}"
    );
    holder.await.unwrap().unwrap();
}

/// For each event, the name of the innermost span it happened in.
#[derive(Clone, Default)]
struct EventSpans(Arc<std::sync::Mutex<EventSpansInner>>);

#[derive(Default)]
struct EventSpansInner {
    names: Vec<&'static str>,
    entered: Vec<u64>,
    seen: Vec<Option<&'static str>>,
}

impl tracing::Subscriber for EventSpans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut inner = self.0.lock().unwrap();
        inner.names.push(span.metadata().name());
        tracing::span::Id::from_u64(inner.names.len() as u64)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {
        let mut inner = self.0.lock().unwrap();
        let innermost = inner.entered.last().map(|id| inner.names[*id as usize - 1]);
        inner.seen.push(innermost);
    }

    fn enter(&self, span: &tracing::span::Id) {
        self.0.lock().unwrap().entered.push(span.into_u64());
    }

    fn exit(&self, _: &tracing::span::Id) {
        self.0.lock().unwrap().entered.pop();
    }
}

#[tracing::instrument(skip_all)]
#[distributed_lock(client = "locks", prefix = "traced", timeout_ms = 10_000)]
async fn traced_outside(locks: &LockClient, overlap: &Overlap) -> Result<(), LockError> {
    tracing::info!("inside");
    overlap.section(Duration::from_millis(20)).await;
    Ok(())
}

#[distributed_lock(client = "locks", prefix = "traced", timeout_ms = 10_000)]
#[tracing::instrument(skip_all)]
async fn traced_inside(locks: &LockClient, overlap: &Overlap) -> Result<(), LockError> {
    tracing::info!("inside");
    overlap.section(Duration::from_millis(20)).await;
    Ok(())
}

/// One thread, so that the subscriber set for it sees every poll.
#[tokio::test(flavor = "current_thread")]
async fn instrumented_fns_hold_the_lock_and_run_in_their_span_in_either_order() {
    let redis = RedisServer::start();
    let here = LockClient::connect(&redis.url()).await.unwrap();
    let there = LockClient::connect(&redis.url()).await.unwrap();
    let spans = EventSpans::default();
    crate::ask_every_subscriber();
    let _default = tracing::subscriber::set_default(spans.clone());
    let overlap = Overlap::default();
    let (a, b, c, d) = tokio::join!(
        traced_outside(&here, &overlap),
        traced_inside(&there, &overlap),
        traced_outside(&there, &overlap),
        traced_inside(&here, &overlap),
    );
    a.and(b).and(c).and(d).unwrap();
    assert_eq!(overlap.most(), 1, "two bodies ran at once");
    let mut seen = spans.0.lock().unwrap().seen.clone();
    seen.sort();
    assert_eq!(
        seen,
        [
            Some("traced_inside"),
            Some("traced_inside"),
            Some("traced_outside"),
            Some("traced_outside")
        ],
        "each body ran in its fn's span"
    );
}

#[distributed_lock(client = "locks", prefix = "export", permits = 2, timeout_ms = 10_000)]
async fn export(locks: LockClient, overlap: Arc<Overlap>) -> Result<(), LockError> {
    overlap.section(Duration::from_millis(100)).await;
    Ok(())
}

/// Two clients, as two processes would be: a broken semaphore on Redis cannot hide
/// behind one client's local line.
async fn two_clients(redis: &RedisServer) -> [LockClient; 2] {
    [
        LockClient::connect(&redis.url()).await.unwrap(),
        LockClient::connect(&redis.url()).await.unwrap(),
    ]
}

/// The most bodies of `body` inside at once, called 8 times on two clients.
async fn most_at_once<Body>(
    redis: &RedisServer,
    body: fn(LockClient, Arc<Overlap>) -> Body,
) -> usize
where
    Body: Future<Output = Result<(), LockError>> + Send + 'static,
{
    let clients = two_clients(redis).await;
    let overlap = Arc::new(Overlap::default());
    let callers: Vec<_> = (0..8)
        .map(|caller| tokio::spawn(body(clients[caller % 2].clone(), overlap.clone())))
        .collect();
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    overlap.most()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_let_that_many_bodies_run_at_once_across_clients() {
    let redis = RedisServer::start();
    assert_eq!(
        most_at_once(&redis, export).await,
        2,
        "with two permits, two bodies and never three run at once"
    );
}

const EXPORT_SEATS: u32 = 2;
const PATIENT_MS: u64 = 10_000;

#[distributed_lock(client = "locks", prefix = "seated-export", permits = EXPORT_SEATS, timeout_ms = PATIENT_MS)]
async fn seated_export(locks: LockClient, overlap: Arc<Overlap>) -> Result<(), LockError> {
    overlap.section(Duration::from_millis(100)).await;
    Ok(())
}

#[distributed_lock(client = "locks", prefix = "patient", timeout_ms = PATIENT_MS)]
async fn patient(locks: &LockClient) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_named_by_constants_apply_as_written_ones() {
    let redis = RedisServer::start();
    assert_eq!(
        most_at_once(&redis, seated_export).await,
        2,
        "with `permits = EXPORT_SEATS`, two bodies and never three run at once"
    );

    // Held longer than the default 20 retries last (about 1 s), and shorter than
    // `PATIENT_MS`.
    let clients = two_clients(&redis).await;
    let held = clients[0]
        .acquire("patient", &lock_runtime::LockOptions::new())
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        held.release().await
    });
    patient(&clients[1])
        .await
        .expect("`timeout_ms = PATIENT_MS` waits out the holder");
    release.await.unwrap().unwrap();
}

const FAIL_FAST: bool = false;
const READS: bool = true;

#[distributed_lock(client = "locks", prefix = "named-fail-fast", spin = FAIL_FAST)]
async fn fail_fast(locks: &LockClient) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(client = "locks", prefix = "named-reads", shared = READS)]
async fn read_report(locks: LockClient, overlap: Arc<Overlap>) -> Result<(), LockError> {
    overlap.section(Duration::from_millis(100)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switches_named_by_constants_apply_as_written_ones() {
    let redis = RedisServer::start();
    assert!(
        most_at_once(&redis, read_report).await > 1,
        "with `shared = READS`, readers hold the lock together"
    );

    let clients = two_clients(&redis).await;
    let held = clients[0]
        .acquire("named-fail-fast", &lock_runtime::LockOptions::new())
        .await
        .unwrap();
    match fail_fast(&clients[1]).await {
        Err(LockError::Busy { key, .. }) => assert_eq!(key, "named-fail-fast"),
        other => panic!("`spin = FAIL_FAST` fails at once with Busy, got {other:?}"),
    }
    held.release().await.unwrap();
}

const FENCED: bool = true;
const RENEWED: bool = true;
const ONCE_ONLY: bool = false;

#[distributed_lock(client = "locks", prefix = "named-fenced", fencing = FENCED, guard = lock)]
async fn fenced(locks: &LockClient) -> Result<Option<u64>, LockError> {
    Ok(lock.fencing_token())
}

/// Held three leases long while `other` tries the lock.
#[distributed_lock(client = "locks", prefix = "named-renewed", expire_ms = 300, watchdog = RENEWED)]
async fn renewed(locks: &LockClient, other: &LockClient) -> Result<bool, LockError> {
    tokio::time::sleep(Duration::from_millis(900)).await;
    let tried = other
        .acquire(
            "named-renewed",
            &lock_runtime::LockOptions::new().spin(false),
        )
        .await;
    Ok(matches!(tried, Err(LockError::Busy { .. })))
}

#[distributed_lock(client = "locks", prefix = "named-once", reentrant = ONCE_ONLY)]
async fn once_only(locks: &LockClient, depth: u32) -> Result<(), LockError> {
    if depth > 0 {
        Box::pin(once_only(locks, depth - 1)).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_switches_named_by_constants_apply_as_written_ones() {
    let redis = RedisServer::start();
    let clients = two_clients(&redis).await;
    let first = fenced(&clients[0]).await.unwrap();
    let second = fenced(&clients[1]).await.unwrap();
    assert!(
        first.is_some() && second > first,
        "`fencing = FENCED` gives growing tokens, got {first:?} then {second:?}"
    );
    assert!(
        renewed(&clients[0], &clients[1]).await.unwrap(),
        "`watchdog = RENEWED` keeps a 300 ms lease held for 900 ms"
    );
    once_only(&clients[0], 0).await.unwrap();
    match once_only(&clients[0], 1).await {
        Err(LockError::Reentered { key, .. }) => assert_eq!(key, "named-once"),
        other => panic!("`reentrant = ONCE_ONLY` refuses re-entry, got {other:?}"),
    }
}

const NO_SEATS: u32 = 0;

#[distributed_lock(client = "locks", prefix = "unseated", permits = NO_SEATS)]
async fn unseated(locks: &LockClient, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// Written out, `spin = false` with `retries` would be refused at compile time.
#[distributed_lock(client = "locks", prefix = "impatient", spin = FAIL_FAST, retries = 3)]
async fn impatient(locks: &LockClient, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constant_refused_written_out_is_refused_on_every_call() {
    let redis = RedisServer::start();
    let locks = LockClient::connect(&redis.url()).await.unwrap();
    let ran = AtomicBool::new(false);
    for _ in 0..2 {
        match unseated(&locks, &ran).await {
            Err(LockError::InvalidOptions { key, reason, .. }) => {
                assert_eq!(key, "unseated");
                assert!(reason.contains("`permits` must be at least 1"), "{reason}");
            }
            other => panic!("expected InvalidOptions, got {other:?}"),
        }
        match impatient(&locks, &ran).await {
            Err(LockError::InvalidOptions { key, reason, .. }) => {
                assert_eq!(key, "impatient");
                assert!(reason.contains("`spin(false)` fails at once"), "{reason}");
            }
            other => panic!("expected InvalidOptions, got {other:?}"),
        }
    }
    assert!(!ran.load(Ordering::SeqCst), "the body ran without a lock");
}

/// Readers and writers inside at once; an overlap of a writer with anyone is seen by
/// whichever of the two came in second.
#[derive(Default)]
struct ReadWrite {
    readers: AtomicUsize,
    writers: AtomicUsize,
    most_readers: AtomicUsize,
    writer_overlapped: AtomicBool,
}

impl ReadWrite {
    async fn read(&self) {
        let now = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_readers.fetch_max(now, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) > 0 {
            self.writer_overlapped.store(true, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }

    async fn write(&self) {
        let writers = self.writers.fetch_add(1, Ordering::SeqCst) + 1;
        if writers > 1 || self.readers.load(Ordering::SeqCst) > 0 {
            self.writer_overlapped.store(true, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[distributed_lock(
    client = "locks",
    prefix = "catalog",
    keys(id),
    shared = true,
    timeout_ms = 10_000
)]
async fn read_catalog(locks: LockClient, id: u32, seen: Arc<ReadWrite>) -> Result<(), LockError> {
    seen.read().await;
    Ok(())
}

#[distributed_lock(client = "locks", prefix = "catalog", keys(id), timeout_ms = 10_000)]
async fn write_catalog(locks: LockClient, id: u32, seen: Arc<ReadWrite>) -> Result<(), LockError> {
    seen.write().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_bodies_run_together_and_an_exclusive_body_runs_alone() {
    let redis = RedisServer::start();
    let clients = two_clients(&redis).await;
    let seen = Arc::new(ReadWrite::default());
    let mut callers: Vec<_> = (0..6)
        .map(|caller| tokio::spawn(read_catalog(clients[caller % 2].clone(), 4, seen.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    callers.extend(
        (0..3).map(|caller| {
            tokio::spawn(write_catalog(clients[caller % 2].clone(), 4, seen.clone()))
        }),
    );
    callers
        .extend((0..3).map(|caller| {
            tokio::spawn(read_catalog(clients[caller % 2].clone(), 4, seen.clone()))
        }));
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    assert!(
        !seen.writer_overlapped.load(Ordering::SeqCst),
        "an exclusive body ran alongside another body"
    );
    assert!(
        seen.most_readers.load(Ordering::SeqCst) >= 2,
        "shared bodies never ran together"
    );
}

/// Which accounts a transfer is inside of; a second transfer coming into one is an
/// overlap.
#[derive(Default)]
struct Accounts {
    in_use: std::sync::Mutex<std::collections::HashSet<u32>>,
    overlapped: AtomicBool,
    transfers: Overlap,
}

#[distributed_lock(
    client = "locks",
    prefix = "account",
    keys(from, to),
    multi = true,
    timeout_ms = 20_000
)]
async fn transfer(
    locks: LockClient,
    from: u32,
    to: u32,
    accounts: Arc<Accounts>,
) -> Result<(), LockError> {
    for account in [from, to] {
        if !accounts.in_use.lock().unwrap().insert(account) {
            accounts.overlapped.store(true, Ordering::SeqCst);
        }
    }
    accounts.transfers.section(Duration::from_millis(50)).await;
    let mut in_use = accounts.in_use.lock().unwrap();
    in_use.remove(&from);
    in_use.remove(&to);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_transfers_exclude_each_other_only_when_they_share_an_account() {
    let redis = RedisServer::start();
    let clients = two_clients(&redis).await;

    // A ring of three accounts: every two transfers share one account, whichever
    // of its keys each takes first.
    let ring = Arc::new(Accounts::default());
    let callers: Vec<_> = (0..12)
        .map(|caller| {
            let (from, to) = [(1, 2), (2, 3), (3, 1), (2, 1)][caller % 4];
            tokio::spawn(transfer(
                clients[caller % 2].clone(),
                from,
                to,
                ring.clone(),
            ))
        })
        .collect();
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    assert!(
        !ring.overlapped.load(Ordering::SeqCst),
        "two transfers touching one account ran at once"
    );
    assert_eq!(ring.transfers.most(), 1);

    let apart = Arc::new(Accounts::default());
    let (first, second) = tokio::join!(
        transfer(clients[0].clone(), 10, 11, apart.clone()),
        transfer(clients[1].clone(), 12, 13, apart.clone()),
    );
    first.unwrap();
    second.unwrap();
    assert!(!apart.overlapped.load(Ordering::SeqCst));
    assert_eq!(
        apart.transfers.most(),
        2,
        "transfers between four distinct accounts waited for each other"
    );
}

/// Bodies that compute a value in a block before they await: the whole body,
/// not only the block, must run inside the lock.
#[async_trait::async_trait]
trait Audit {
    async fn audit(&self, id: u64) -> Result<u64, LockError>;
    async fn traced_audit(&self, id: u64) -> Result<u64, LockError>;
}

struct Ledger {
    locks: LockClient,
    overlap: Arc<Overlap>,
}

#[async_trait::async_trait]
impl Audit for Ledger {
    #[distributed_lock(client = "self.locks", prefix = "audit", keys(id), timeout_ms = 20_000)]
    async fn audit(&self, id: u64) -> Result<u64, LockError> {
        let checked: Result<u64, LockError> = { Ok(id) };
        self.overlap.section(Duration::from_millis(20)).await;
        checked
    }

    #[tracing::instrument(skip(self))]
    #[distributed_lock(client = "self.locks", prefix = "audit", keys(id), timeout_ms = 20_000)]
    async fn traced_audit(&self, id: u64) -> Result<u64, LockError> {
        let doubled = { id * 2 };
        self.overlap.section(Duration::from_millis(20)).await;
        Ok(doubled / 2)
    }
}

#[distributed_lock(client = "locks", prefix = "audit", keys(id), timeout_ms = 20_000)]
async fn audit_by_hand(locks: &LockClient, id: u64, overlap: &Overlap) -> Result<u64, LockError> {
    let checked: Result<u64, LockError> = { Ok(id) };
    overlap.section(Duration::from_millis(20)).await;
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_the_attribute_takes_runs_its_whole_body_in_the_lock() {
    let redis = RedisServer::start();
    let overlap = Arc::new(Overlap::default());
    let [here, there] = two_clients(&redis).await;
    let ledgers = [here, there].map(|locks| {
        Arc::new(Ledger {
            locks,
            overlap: overlap.clone(),
        })
    });
    let callers: Vec<_> = (0..24)
        .map(|caller| {
            let ledger = ledgers[caller % 2].clone();
            tokio::spawn(async move {
                match caller % 3 {
                    0 => ledger.audit(9).await,
                    1 => ledger.traced_audit(9).await,
                    _ => audit_by_hand(&ledger.locks, 9, &ledger.overlap).await,
                }
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), 9);
    }
    assert_eq!(
        overlap.most(),
        1,
        "two bodies were inside at once: part of a body ran outside the lock"
    );
}

/// Associated fns without `self`, named alike on two types in one module: the
/// attribute cannot tell them apart, so they come to one default prefix.
struct Exports;

impl Exports {
    #[distributed_lock(client = "locks", permits = 4, spin = false)]
    async fn run(locks: &LockClient) -> Result<&'static str, LockError> {
        Ok("exports")
    }
}

struct Imports;

impl Imports {
    #[distributed_lock(client = "locks", spin = false)]
    async fn run(locks: &LockClient) -> Result<&'static str, LockError> {
        Ok("imports")
    }

    #[distributed_lock(client = "locks", prefix = "imports:run", spin = false)]
    async fn run_named(locks: &LockClient) -> Result<&'static str, LockError> {
        Ok("imports")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fns_never_share_a_default_prefix() {
    let redis = RedisServer::start();
    let [here, there] = two_clients(&redis).await;
    assert_eq!(Exports::run(&here).await.unwrap(), "exports");
    let refused = Imports::run(&there).await;
    match refused {
        Err(LockError::InvalidOptions { key, reason, .. }) => {
            assert_eq!(key, "suite::attribute::run");
            assert!(reason.contains("`prefix`"), "{reason}");
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert!(
        matches!(
            Imports::run(&here).await,
            Err(LockError::InvalidOptions { .. })
        ),
        "refused on every call, whatever the client"
    );
    assert_eq!(
        Exports::run(&there).await.unwrap(),
        "exports",
        "the fn that came first keeps its prefix"
    );
    assert_eq!(Imports::run_named(&here).await.unwrap(), "imports");
}
