//! The behaviour suite: one binary, one module per concern, against real
//! `redis-server`s started by `lock_tests` (and the memory backend where it applies).

mod attribute;
mod behaviour;
mod chaos;
mod cluster;
mod connection;
mod crash;
mod everyday;
mod failover;
mod hand_off;
mod http;
mod lease;
mod multi;
mod observability;
mod operator;
mod outage;
mod ownership;
mod read_write;
mod redlock;
mod renewal;
mod replication;
mod secured;
mod semaphore;
mod sentinel;
mod waiting;
mod window;

/// Calls `acquire` on `key` with `options` from 16 tasks for 1 s, while its Redis is
/// down: each call fails with `Backend`, naming the key, and does not hang. How many
/// calls were made.
pub(crate) async fn acquire_while_down(
    client: &lock_runtime::LockClient,
    key: &'static str,
    options: &lock_runtime::LockOptions,
) -> u64 {
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (client, options) = (client.clone(), options.clone());
        callers.spawn(async move {
            let started = tokio::time::Instant::now();
            let mut calls = 0;
            while started.elapsed() < std::time::Duration::from_secs(1) {
                let called = tokio::time::Instant::now();
                match client.acquire(key, &options).await {
                    Err(error @ lock_runtime::LockError::Backend { .. }) => {
                        assert_eq!(error.key(), Some(key));
                        let waited = called.elapsed();
                        assert!(waited < std::time::Duration::from_secs(3), "{waited:?}");
                    }
                    other => panic!("expected a Backend error, got {other:?}"),
                }
                calls += 1;
            }
            calls
        });
    }
    callers.join_all().await.into_iter().sum()
}

/// Acquires and releases `key` with `options` once its Redis is back, trying for 5 s.
pub(crate) async fn acquire_once_back(
    client: &lock_runtime::LockClient,
    key: &str,
    options: &lock_runtime::LockOptions,
) {
    let started = tokio::time::Instant::now();
    loop {
        match client.acquire(key, options).await {
            Ok(guard) => return guard.release().await.unwrap(),
            Err(lock_runtime::LockError::Backend { .. })
                if started.elapsed() < std::time::Duration::from_secs(5) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(error) => panic!("the client did not recover: {error}"),
        }
    }
}

/// A connection for the tests' own reads and writes on `redis`.
pub(crate) async fn data(redis: &lock_tests::RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Has tracing ask every live subscriber whether it wants a callsite hit for the
/// first time. While just one dispatcher is registered, tracing-core asks only the
/// hitting thread's own: a library callsite first hit on another test's thread,
/// which has none, would stay off for good for a test's thread-local subscriber.
/// A second dispatcher, registered once and kept, rules that out.
pub(crate) fn ask_every_subscriber() {
    static KEPT: std::sync::LazyLock<tracing::Dispatch> = std::sync::LazyLock::new(|| {
        tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default())
    });
    std::sync::LazyLock::force(&KEPT);
}

/// Fails when a token was asked for more than once: a grant given back is never asked
/// for again under its token, lest the give-back reach Redis late (sent again on a new
/// connection, or given up on while still queued) and free what a later attempt was
/// granted under it, which its holder would go on believing it held.
pub(crate) fn assert_each_token_asked_for_once(tokens: &[String]) {
    assert!(tokens.len() >= 3, "too few grants asked for: {tokens:?}");
    let mut distinct = tokens.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        tokens.len(),
        "a token whose grant was given back was asked for again: {tokens:?}"
    );
}

/// Once `count` clients wait in the queue for `key`.
pub(crate) async fn queued_once(redis: &lock_tests::RedisServer, key: &str, count: u64) {
    let asked = tokio::time::Instant::now();
    loop {
        let queued: u64 = redis::cmd("ZCARD")
            .arg(format!("lock:{{{key}}}:queue"))
            .query(&mut redis.connection())
            .unwrap();
        if queued == count {
            return;
        }
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(5),
            "{queued} queued"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Panics unless `granted` was refused for want of the one replica required, which
/// had not acknowledged it.
pub(crate) fn assert_refused_unreplicated(
    granted: &Result<lock_runtime::LockGuard, lock_runtime::LockError>,
) {
    assert!(
        matches!(
            granted,
            Err(lock_runtime::LockError::Replication {
                acknowledged: 0,
                required: 1,
                ..
            })
        ),
        "granted without its replica: {granted:?}"
    );
}

/// With `added`, a replica started after `client` connected, frozen: grants of one
/// key, one every 250 ms, until one fails for want of its acknowledgement, since the
/// client counted it, within 20 s (twice the recount's period). Thawed, it confirms
/// the next grant.
pub(crate) async fn the_added_replica_is_waited_for(
    client: &lock_runtime::LockClient,
    added: &lock_tests::RedisServer,
) {
    added.freeze();
    let started = tokio::time::Instant::now();
    loop {
        match client
            .acquire("payout:9", &lock_runtime::LockOptions::new().spin(false))
            .await
        {
            Err(lock_runtime::LockError::Replication { required: 1, .. }) => break,
            Ok(guard) => guard.release().await.unwrap(),
            Err(other) => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "no grant waited for the added replica within 20 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    added.thaw();
    let guard = client
        .acquire("payout:9", &lock_runtime::LockOptions::new())
        .await;
    guard
        .expect("confirmed by the replica")
        .release()
        .await
        .unwrap();
}

/// `call`'s answer, asked again while it fails with a `Backend` error, for up to 3 s.
/// A Cluster connection made while a primary is silent may hold its first requests
/// back for a connect timeout while redis-rs refreshes its slot map, and those
/// requests time out (see RELIABILITY.md); and once, in CI on a busy machine, a
/// client connecting to a Cluster just made timed out (not seen again: connecting
/// takes about 10 ms there).
pub(crate) async fn once_settled<T, F>(
    mut call: impl FnMut() -> F,
) -> Result<T, lock_runtime::LockError>
where
    F: std::future::Future<Output = Result<T, lock_runtime::LockError>>,
{
    let started = std::time::Instant::now();
    loop {
        match call().await {
            Err(lock_runtime::LockError::Backend { .. })
                if started.elapsed() < std::time::Duration::from_secs(3) => {}
            answer => return answer,
        }
    }
}
