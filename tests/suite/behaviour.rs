//! What every topology must do: one Redis, Redlock over five masters, a Cluster,
//! a Sentinel-watched primary, and the memory backend. Contending owners are
//! different clients (a client's own queue would hide a broken protocol), and
//! where a test needs "anyone else", it asks through a second client.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lock_runtime::history::History;
use lock_runtime::{LockClient, LockError, LockGuard, LockOptions, distributed_lock};
use lock_tests::{RedisCluster, RedisServer, SentinelGroup};
use redis::AsyncCommands;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Topology {
    Redis,
    Redlock,
    Cluster,
    Sentinel,
    Memory,
}

/// A client under test and the servers behind it. `redis` holds the tests' shared
/// data; on one Redis and on Redlock (as the first master) it holds locks too.
pub(crate) struct Fixture {
    pub(crate) client: LockClient,
    /// Another client of the same store, as another process would have.
    pub(crate) other: LockClient,
    pub(crate) redis: RedisServer,
    pub(crate) topology: Topology,
    servers: Servers,
}

enum Servers {
    None,
    MoreMasters(Vec<RedisServer>),
    Cluster(Box<RedisCluster>),
    Sentinel(Box<SentinelGroup>),
}

impl Fixture {
    pub(crate) async fn new(topology: Topology) -> Fixture {
        let servers = match topology {
            Topology::Redis | Topology::Memory => Servers::None,
            Topology::Redlock => {
                Servers::MoreMasters((1..5).map(|_| RedisServer::start()).collect())
            }
            Topology::Cluster => Servers::Cluster(Box::new(RedisCluster::start())),
            Topology::Sentinel => {
                Servers::Sentinel(Box::new(SentinelGroup::start(Duration::from_secs(1))))
            }
        };
        let memory = LockClient::memory();
        let mut fixture = Fixture {
            client: memory.clone(),
            other: memory,
            redis: RedisServer::start(),
            topology,
            servers,
        };
        fixture.client = fixture.connect().await;
        fixture.other = fixture.connect().await;
        fixture
    }

    /// A new client of the store under test, with connections of its own where the
    /// store is Redis, as another process would have.
    pub(crate) async fn connect(&self) -> LockClient {
        let connected = match &self.servers {
            Servers::None if self.topology == Topology::Memory => return self.client.peer(),
            Servers::None => LockClient::connect(&self.redis.url()).await,
            Servers::MoreMasters(more) => {
                let masters = std::iter::once(&self.redis).chain(more);
                LockClient::redlock(masters.map(RedisServer::url)).await
            }
            Servers::Cluster(cluster) => LockClient::cluster(cluster.urls()).await,
            Servers::Sentinel(group) => {
                LockClient::sentinel(group.sentinel_urls(), group.name).await
            }
        };
        connected.expect("connect")
    }

    pub(crate) fn counts_round_trips(&self) -> bool {
        self.topology != Topology::Memory
    }

    /// Whether waiting clients queue in the store (all but Redlock and memory).
    pub(crate) fn queues(&self) -> bool {
        !matches!(self.topology, Topology::Redlock | Topology::Memory)
    }

    /// Lock requests that one lock server saw, the first master on Redlock, all of
    /// them on a Cluster.
    pub(crate) fn round_trips(&self) -> u64 {
        match &self.servers {
            Servers::None | Servers::MoreMasters(_) => self.redis.lock_calls(),
            Servers::Cluster(cluster) => cluster.servers.iter().map(RedisServer::lock_calls).sum(),
            Servers::Sentinel(group) => group.primary.lock_calls(),
        }
    }

    pub(crate) async fn data(&self) -> redis::aio::MultiplexedConnection {
        crate::data(&self.redis).await
    }

    /// Takes `key` through the other client.
    pub(crate) async fn hold_elsewhere(&self, key: &str, options: LockOptions) -> LockGuard {
        self.other
            .acquire(key, &options)
            .await
            .expect("the other client takes the lock")
    }

    /// Whether the other client could take `key` right now.
    pub(crate) async fn free_elsewhere(&self, key: &str) -> bool {
        let guard = self
            .other
            .try_acquire(key, &LockOptions::new())
            .await
            .unwrap();
        let free = guard.is_some();
        if let Some(guard) = guard {
            guard.release().await.unwrap();
        }
        free
    }

    /// How long until the other client can take `key`, polling every millisecond.
    pub(crate) async fn time_until_free(&self, key: &str, at_most: Duration) -> Duration {
        let started = Instant::now();
        while !self.free_elsewhere(key).await {
            assert!(
                started.elapsed() < at_most,
                "`{key}` still held after {at_most:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        started.elapsed()
    }
}

/// Runs each listed behaviour (an async fn of the calling module taking a
/// `Fixture`) on every topology.
macro_rules! on_every_backend {
    ($($behaviour:ident),* $(,)?) => {
        on_every_backend!(@on on_redis Redis $($behaviour),*);
        on_every_backend!(@on on_redlock Redlock $($behaviour),*);
        on_every_backend!(@on on_cluster Cluster $($behaviour),*);
        on_every_backend!(@on on_sentinel Sentinel $($behaviour),*);
        on_every_backend!(@on on_memory Memory $($behaviour),*);
    };
    (@on $module:ident $topology:ident $($behaviour:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    use $crate::behaviour::{Fixture, Topology};
                    let fixture = Fixture::new(Topology::$topology).await;
                    super::$behaviour(fixture).await;
                }
            )*
        }
    };
}
pub(crate) use on_every_backend;

on_every_backend!(
    mutual_exclusion,
    stale_holder_cannot_release_or_extend,
    fail_fast,
    retries_end_in_timeout,
    timeout_bounds_waiting,
    panic_releases,
    dropped_future_releases,
    bad_input_is_an_error,
    spawned_task_is_another_owner,
    watchdog_keeps_a_long_body_safe,
    fixed_lease_expires_and_is_lost,
    fencing_tokens_strictly_increase,
    the_attribute_works_unchanged,
);

async fn mutual_exclusion(fixture: Fixture) {
    const CLIENTS: usize = 4;
    const TASKS: usize = 32;
    const SECTIONS: usize = 50;
    let history = Arc::new(History::new());
    let options = LockOptions::new()
        .fencing(true)
        .retry_wait(Duration::from_millis(2))
        .timeout(Duration::from_secs(60));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(fixture.connect().await);
    }
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = clients[task % CLIENTS].clone();
        let mut data = fixture.data().await;
        let history = history.clone();
        let options = options.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..SECTIONS {
                let guard = client.acquire("counter", &options).await.unwrap();
                let from = SystemTime::now();
                let count: i64 = data.get("count").await.unwrap_or(0);
                tokio::task::yield_now().await;
                let () = data.set("count", count + 1).await.unwrap();
                history.record_guard(format!("task {task}"), &guard, from);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let count: i64 = fixture.data().await.get("count").await.unwrap();
    assert_eq!(count, (TASKS * SECTIONS) as i64);
    assert_eq!(
        history.check(),
        Ok(TASKS * SECTIONS),
        "holders overlapped or tokens went back"
    );
}

async fn stale_holder_cannot_release_or_extend(fixture: Fixture) {
    let lease = Duration::from_millis(100);
    let stale = fixture
        .client
        .acquire("account", &LockOptions::new().lease(lease))
        .await
        .unwrap();
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    assert!(!stale.is_held());
    let current = fixture
        .hold_elsewhere("account", LockOptions::new().lease(Duration::from_secs(10)))
        .await;

    let extended = stale.extend(Duration::from_secs(60)).await;
    assert!(matches!(extended, Err(LockError::NotHeld { ref key, .. }) if key == "account"));
    let released = stale.release().await;
    assert!(matches!(released, Err(LockError::NotHeld { ref key, .. }) if key == "account"));

    assert!(current.is_held());
    assert!(
        !fixture.free_elsewhere("account").await,
        "the stale release freed the new holder's lock"
    );
    current.release().await.unwrap();
    assert!(fixture.free_elsewhere("account").await);
}

async fn fail_fast(fixture: Fixture) {
    let holder = fixture.hold_elsewhere("sku-1", LockOptions::new()).await;
    assert!(
        fixture
            .client
            .try_acquire("sku-1", &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    let busy = fixture
        .client
        .acquire("sku-1", &LockOptions::new().spin(false))
        .await;
    assert!(
        matches!(busy, Err(LockError::Busy { ref key, .. }) if key == "sku-1"),
        "{busy:?}"
    );
    holder.release().await.unwrap();
    let free = fixture
        .client
        .try_acquire("sku-1", &LockOptions::new())
        .await
        .unwrap();
    assert!(free.is_some());
}

async fn retries_end_in_timeout(fixture: Fixture) {
    let holder = fixture
        .hold_elsewhere("job", LockOptions::new().lease(Duration::from_secs(10)))
        .await;
    // Pauses long enough that a loaded machine does not eat the spare one in the
    // budget (`retries + 2` pauses) before the last retry is made.
    let wait = Duration::from_millis(40);
    let trips_before = fixture.round_trips();
    let started = Instant::now();
    let result = fixture
        .client
        .acquire("job", &LockOptions::new().retries(3).retry_wait(wait))
        .await;
    let elapsed = started.elapsed();
    match result {
        Err(LockError::Timeout { key, attempts, .. }) => {
            assert_eq!(key, "job");
            if fixture.counts_round_trips() {
                // Where waiters queue, a waiter that finds the lock busy asks again at
                // once to take a place in the queue, and leaves it when it gives up;
                // taking the place marks the holder's token and leaving it, the last
                // in the queue, takes the mark off, a `SET` each counted here (on a
                // Cluster, by the shard's replica as well).
                // Redlock keeps its waiting writers only to hold off readers: it takes
                // the place (and marks) with the next attempt, and withdraws it as well.
                let (joining, leaving, marking) = match fixture.topology {
                    Topology::Cluster => (1, 1, 4),
                    _ if fixture.queues() => (1, 1, 2),
                    Topology::Redlock => (0, 1, 2),
                    _ => (0, 0, 0),
                };
                assert_eq!(
                    attempts,
                    4 + joining,
                    "the first attempt and exactly 3 retries"
                );
                // Leaving the queue is done in the background.
                fixture.client.shutdown().await;
                assert_eq!(
                    fixture.round_trips() - trips_before,
                    u64::from(4 + joining + leaving + marking)
                );
            }
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    // In one client the waiter queues behind the holder for as long as its retries
    // would take; across clients it makes them.
    assert!(
        elapsed >= wait * 3,
        "3 pauses of {wait:?} between 4 attempts, took {elapsed:?}"
    );
    assert!(
        elapsed < wait * 4 + Duration::from_millis(100),
        "took {elapsed:?}"
    );
    holder.release().await.unwrap();
}

async fn timeout_bounds_waiting(fixture: Fixture) {
    let holder = fixture
        .hold_elsewhere("report", LockOptions::new().lease(Duration::from_secs(10)))
        .await;
    let timeout = Duration::from_millis(200);
    let started = Instant::now();
    let result = fixture
        .client
        .acquire("report", &LockOptions::new().timeout(timeout))
        .await;
    let elapsed = started.elapsed();
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    assert!(elapsed >= timeout, "gave up early: {elapsed:?}");
    assert!(
        elapsed < timeout + Duration::from_millis(500),
        "gave up late: {elapsed:?}"
    );
    holder.release().await.unwrap();
}

async fn panic_releases(fixture: Fixture) {
    let client = fixture.client.clone();
    let panicked = tokio::spawn(async move {
        let _guard = client.acquire("payout", &LockOptions::new()).await.unwrap();
        panic!("the critical section failed");
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    // The lease is 30 s: getting the lock within a second means the guard released it.
    fixture
        .time_until_free("payout", Duration::from_secs(1))
        .await;
}

async fn dropped_future_releases(fixture: Fixture) {
    let client = fixture.client.clone();
    let section = async move {
        let _guard = client.acquire("refund", &LockOptions::new()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
    };
    let cut_short = tokio::time::timeout(Duration::from_millis(100), section).await;
    assert!(cut_short.is_err(), "the section was dropped mid-way");
    fixture
        .time_until_free("refund", Duration::from_secs(1))
        .await;
}

async fn bad_input_is_an_error(fixture: Fixture) {
    let client = &fixture.client;
    let options = LockOptions::new();
    let empty = client.acquire("", &options).await;
    assert!(
        matches!(empty, Err(LockError::InvalidKey { .. })),
        "{empty:?}"
    );
    let empty = client.try_acquire("", &options).await;
    assert!(
        matches!(empty, Err(LockError::InvalidKey { .. })),
        "{empty:?}"
    );
    let long = "k".repeat(lock_runtime::MAX_KEY_LEN + 1);
    let error = client.acquire(&long, &options).await.unwrap_err();
    assert!(matches!(error, LockError::InvalidKey { .. }));
    assert!(error.to_string().contains("64 KiB"), "{error}");

    for (options, says) in [
        (LockOptions::new().lease(Duration::ZERO), "at least 3 ms"),
        (
            LockOptions::new().lease(Duration::from_millis(2)),
            "clock drift",
        ),
        (
            LockOptions::new().lease(Duration::from_secs(u64::MAX)),
            "longer than Redis accepts",
        ),
        (LockOptions::new().spin(false).retries(5), "spin(false)"),
        (LockOptions::new().retry_wait(Duration::ZERO), "retry_wait"),
    ] {
        let error = client.acquire("order:1", &options).await.unwrap_err();
        assert!(
            matches!(error, LockError::InvalidOptions { .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("`order:1`") && message.contains(says),
            "{message}"
        );
    }
    let guard = client.acquire("order:1", &options).await.unwrap();
    let error = guard.extend(Duration::from_millis(2)).await.unwrap_err();
    assert!(
        matches!(error, LockError::InvalidOptions { .. }),
        "{error:?}"
    );
    assert!(guard.is_held(), "a refused extend changes nothing");
    guard.release().await.unwrap();
}

async fn spawned_task_is_another_owner(fixture: Fixture) {
    let outer = fixture
        .client
        .acquire("ledger", &LockOptions::new())
        .await
        .unwrap();
    let client = fixture.client.clone();
    // From the spawn, not from the child's first poll, which load can delay.
    let started = Instant::now();
    let child = tokio::spawn(async move {
        let waiting = LockOptions::new()
            .retry_wait(Duration::from_millis(5))
            .timeout(Duration::from_secs(10));
        let guard = client.acquire("ledger", &waiting).await.unwrap();
        let waited = started.elapsed();
        guard.release().await.unwrap();
        waited
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        !child.is_finished(),
        "the child task got in while the parent held the lock"
    );
    outer.release().await.unwrap();
    let waited = child.await.unwrap();
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
}

async fn watchdog_keeps_a_long_body_safe(fixture: Fixture) {
    let lease = Duration::from_millis(300);
    let options = LockOptions::new().lease(lease).watchdog(true);
    let guard = fixture.client.acquire("import", &options).await.unwrap();
    let body_ends = Instant::now() + lease * 3;
    while Instant::now() < body_ends {
        assert!(guard.is_held());
        assert!(
            !fixture.free_elsewhere("import").await,
            "another owner got in while the body ran"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    guard.release().await.unwrap();
    if fixture.counts_round_trips() {
        let calls_after_release = fixture.round_trips();
        tokio::time::sleep(lease).await;
        assert_eq!(
            fixture.round_trips(),
            calls_after_release,
            "renewals went on after release"
        );
    }
    assert!(fixture.free_elsewhere("import").await);
}

async fn fixed_lease_expires_and_is_lost(fixture: Fixture) {
    let lease = Duration::from_millis(150);
    // The lease counts from when the request was sent: on Redlock, a slow quorum
    // leaves less of it once the acquire returns.
    let started = Instant::now();
    let guard = fixture
        .client
        .acquire("export", &LockOptions::new().lease(lease))
        .await
        .unwrap();
    assert!(guard.is_held());
    guard.lost().await;
    let elapsed = started.elapsed();
    assert!(!guard.is_held());
    assert!(
        elapsed <= lease + Duration::from_millis(40),
        "lost is known by the end of the lease, give or take scheduling: {elapsed:?}"
    );
    assert!(elapsed >= lease * 9 / 10, "lost too early: {elapsed:?}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(fixture.free_elsewhere("export").await);
}

async fn fencing_tokens_strictly_increase(fixture: Fixture) {
    let history = Arc::new(History::new());
    let options = LockOptions::new()
        .fencing(true)
        .retry_wait(Duration::from_millis(2))
        .timeout(Duration::from_secs(30));
    let mut tasks = Vec::new();
    for client_number in 0..4 {
        let client = fixture.connect().await;
        for task in 0..2 {
            let (client, options, history) = (client.clone(), options.clone(), history.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..20 {
                    let guard = client.acquire("fenced", &options).await.unwrap();
                    let from = SystemTime::now();
                    assert!(guard.fencing_token().is_some());
                    tokio::task::yield_now().await;
                    history.record_guard(
                        format!("client {client_number} task {task}"),
                        &guard,
                        from,
                    );
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(history.check(), Ok(160));
    let plain = fixture
        .client
        .acquire("fenced", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(plain.fencing_token(), None, "no token unless asked");
}

#[distributed_lock(
    client = "locks",
    prefix = "topology",
    keys = "shard",
    wait_ms = 5,
    timeout_ms = 30_000
)]
async fn count_once(
    locks: &LockClient,
    shard: u32,
    data: &mut redis::aio::MultiplexedConnection,
) -> Result<(), LockError> {
    let count: i64 = data.get("attribute-count").await.unwrap_or(0);
    tokio::task::yield_now().await;
    let () = data.set("attribute-count", count + 1).await.unwrap();
    Ok(())
}

/// One annotated fn; only the client handed to it differs between topologies.
async fn the_attribute_works_unchanged(fixture: Fixture) {
    let mut callers = Vec::new();
    for _ in 0..8 {
        let (client, mut data) = (fixture.connect().await, fixture.data().await);
        callers.push(tokio::spawn(async move {
            for _ in 0..10 {
                count_once(&client, 4, &mut data).await.unwrap();
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    let count: i64 = fixture.data().await.get("attribute-count").await.unwrap();
    assert_eq!(count, 80);
}
