//! Lease safety on real Redis: losing a lock from outside, a stalled holder, the
//! watchdog's cap, fenced writes from a holder that woke up late, and a grant
//! answered too late to hold anything.

use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockOptions, fenced_set};
use lock_tests::{RedisServer, TcpProxy};
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::data;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_key_is_noticed_within_one_renewal() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let lease = Duration::from_millis(300);
    let guard = client
        .acquire("shipment", &LockOptions::new().lease(lease).watchdog(true))
        .await
        .unwrap();
    let () = data(&redis).await.del("lock:{shipment}").await.unwrap();
    let deleted_at = Instant::now();
    guard.lost().await;
    let noticed = deleted_at.elapsed();
    assert!(!guard.is_held());
    assert!(
        noticed <= lease / 3 + Duration::from_millis(150),
        "noticed after {noticed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_holder_learns_it_lost_and_its_late_release_deletes_nothing() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port()).await;
    let bound = Duration::from_millis(100);
    let config = ClientConfig::new()
        .command_timeout(bound)
        .connect_timeout(bound);
    let stalled = LockClient::connect_with(&proxy.url(), config)
        .await
        .unwrap();
    let healthy = LockClient::connect(&redis.url()).await.unwrap();
    let lease = Duration::from_millis(400);
    let options = LockOptions::new().lease(lease).watchdog(true);

    let stale = stalled.acquire("settlement", &options).await.unwrap();
    proxy.stall();
    let stalled_at = Instant::now();
    stale.lost().await;
    let noticed = stalled_at.elapsed();
    assert!(!stale.is_held());
    assert!(
        noticed <= lease,
        "the stalled holder noticed only after {noticed:?}"
    );

    let current = healthy
        .acquire("settlement", &options.clone().timeout(lease * 2))
        .await
        .expect("the lease ran out on the server, so the healthy client gets in");
    proxy.resume();
    let late = stale.release().await;
    assert!(matches!(late, Err(LockError::NotHeld { .. })), "{late:?}");
    assert!(current.is_held());
    let other_owner = tokio::spawn({
        let healthy = healthy.clone();
        async move {
            healthy
                .try_acquire("settlement", &LockOptions::new())
                .await
                .unwrap()
        }
    });
    assert!(
        other_owner.await.unwrap().is_none(),
        "the late release freed the current holder's lock"
    );
    current.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_caps_the_watchdog() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let lease = Duration::from_millis(150);
    let max_hold = Duration::from_millis(400);
    let started = Instant::now();
    let guard = client
        .acquire(
            "reindex",
            &LockOptions::new()
                .lease(lease)
                .watchdog(true)
                .max_hold(max_hold),
        )
        .await
        .unwrap();
    guard.lost().await;
    let held = started.elapsed();
    assert!(held >= max_hold - lease, "renewals stopped early: {held:?}");
    assert!(
        held <= max_hold + lease,
        "renewals went past the cap: {held:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_with_an_older_token_is_refused() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let mut store = data(&redis).await;
    let lease = Duration::from_millis(100);
    let options = LockOptions::new().fencing(true).lease(lease);

    let paused = client.acquire("balance", &options).await.unwrap();
    let paused_token = paused.fencing_token().unwrap();
    tokio::time::sleep(lease + Duration::from_millis(20)).await;

    let next = tokio::spawn({
        let client = client.clone();
        let options = options.clone();
        async move { client.acquire("balance", &options).await.unwrap() }
    })
    .await
    .unwrap();
    let next_token = next.fencing_token().unwrap();
    assert!(next_token > paused_token);
    assert!(
        fenced_set(&mut store, "balance:value", "110", next_token)
            .await
            .unwrap()
    );

    let late = fenced_set(&mut store, "balance:value", "90", paused_token)
        .await
        .unwrap();
    assert!(!late, "the paused holder's late write went through");
    let stored: String = store.hget("balance:value", "value").await.unwrap();
    assert_eq!(stored, "110");
    assert!(
        fenced_set(&mut store, "balance:value", "120", next_token)
            .await
            .unwrap(),
        "a holder may write twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortening_extend_whose_answer_is_lost_is_counted_as_applied() {
    let redis = RedisServer::start();
    let bound = Duration::from_millis(150);
    let config = ClientConfig::new().command_timeout(bound);
    let holder = LockClient::connect_with(&redis.url(), config)
        .await
        .unwrap();
    let other = LockClient::connect(&redis.url()).await.unwrap();
    let guard = holder
        .acquire("payout", &LockOptions::new().lease(Duration::from_secs(20)))
        .await
        .unwrap();

    // Redis takes the request while paused, answers too late, and then applies it.
    redis.pause(Duration::from_millis(800));
    let shorter = Duration::from_millis(500);
    let asked_at = Instant::now();
    let extended = guard.extend(shorter).await;
    assert!(
        matches!(extended, Err(LockError::Backend { .. })),
        "{extended:?}"
    );
    let waiting = LockOptions::new()
        .retry_wait(Duration::from_millis(10))
        .timeout(Duration::from_secs(5));
    let next = other.acquire("payout", &waiting).await.unwrap();
    assert!(
        asked_at.elapsed() >= Duration::from_millis(800) + shorter - Duration::from_millis(50),
        "Redis did not apply the extend: another client got in after {:?}",
        asked_at.elapsed()
    );
    assert!(
        !guard.is_held(),
        "two holders: the first guard still says held {:?} after its extend was sent",
        asked_at.elapsed()
    );
    assert!(matches!(
        guard.release().await,
        Err(LockError::NotHeld { .. })
    ));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_next_task_gets_the_lock_when_a_shortened_lease_ends() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let guard = client
        .acquire("ledger", &LockOptions::new().lease(Duration::from_secs(20)))
        .await
        .unwrap();
    let shorter = Duration::from_millis(300);
    guard.extend(shorter).await.unwrap();
    let extended_at = Instant::now();
    // The guard lives on past its lease; the client's next task in line still gets
    // the lock once that lease has ended.
    let next = tokio::spawn({
        let client = client.clone();
        async move {
            let patient = LockOptions::new().timeout(Duration::from_secs(5));
            client.acquire("ledger", &patient).await
        }
    });
    let next = next
        .await
        .unwrap()
        .expect("the next task waited for the lease the guard had before");
    let waited = extended_at.elapsed();
    assert!(
        waited < shorter + Duration::from_millis(500),
        "the next task got the lock {waited:?} after the extend"
    );
    assert!(!guard.is_held());
    next.release().await.unwrap();
}

/// An answer that comes after the lease it grants could have run out is no grant:
/// the acquire gives the lock back and asks again, and the guard it returns holds.
/// The request is held back in the network past the lease, so Redis runs it late and
/// holds the lock for a lease from then, which the acquire has to give back first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_after_its_lease_could_have_ended_is_asked_for_again() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port()).await;
    let config = ClientConfig::new().command_timeout(Duration::from_secs(5));
    let client = LockClient::connect_with(&proxy.url(), config)
        .await
        .unwrap();
    let other = LockClient::connect(&redis.url()).await.unwrap();
    let lease = Duration::from_millis(600);
    let plain = LockOptions::new().lease(lease);
    for (way, options) in [
        ("plain", plain.clone()),
        ("fenced", plain.clone().fencing(true)),
        ("watchdog", plain.clone().watchdog(true)),
    ] {
        client
            .acquire("payout", &options)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        proxy.stall();
        let acquiring = {
            let (client, options) = (
                client.clone(),
                options.clone().timeout(Duration::from_secs(5)),
            );
            tokio::spawn(async move { client.acquire("payout", &options).await })
        };
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        proxy.resume();
        let guard = acquiring
            .await
            .unwrap()
            .unwrap_or_else(|error| panic!("{way}: {error}"));
        assert!(guard.is_held(), "{way}: the guard returned holds nothing");
        let intruder = other
            .try_acquire("payout", &LockOptions::new())
            .await
            .unwrap();
        assert!(
            intruder.is_none(),
            "{way}: another client got in beside the guard"
        );
        guard.release().await.unwrap();

        // Asked not to wait, it fails, and leaves nothing held.
        proxy.stall();
        let acquiring = {
            let (client, options) = (client.clone(), options.clone().spin(false));
            tokio::spawn(async move { client.acquire("payout", &options).await })
        };
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        proxy.resume();
        let late = acquiring.await.unwrap();
        assert!(
            matches!(late, Err(LockError::Busy { .. })),
            "{way}: {late:?}"
        );
        client.shutdown().await;
        let left = other.lease_left("payout").await.unwrap();
        assert_eq!(left, None, "{way}: the late grant was left in Redis");
    }
}

/// Grants that always come late (here the shortest lease, 3 ms, of which the drift
/// allowance leaves 0.97 ms, behind a link that passes answers on 5 ms late) are
/// asked for no more often than a poller asks, until the acquire times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_that_always_come_late_are_asked_for_at_the_polling_pace() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port()).await;
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    proxy.delay_answers(Duration::from_millis(5));
    let (retry_wait, timeout) = (Duration::from_millis(50), Duration::from_millis(500));
    let options = LockOptions::new()
        .lease(lock_runtime::MIN_LEASE)
        .retry_wait(retry_wait)
        .timeout(timeout);
    let before = redis.lock_calls();
    let result = client.acquire("tick", &options).await;
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    client.shutdown().await;
    // An acquire and a withdrawal each time.
    let calls = redis.lock_calls() - before;
    let polls = (timeout.as_millis() / retry_wait.as_millis()) as u64 + 2;
    assert!(calls <= 3 * polls, "{calls} lock requests in {timeout:?}");
}
