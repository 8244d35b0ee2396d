//! Operators' tools, outside the ownership rules: looking at a lock, and clearing
//! one stuck behind a holder that will never let go.

use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockOptions};
use lock_tests::{RedisServer, TcpProxy};
use tokio::time::Instant;

use crate::behaviour::{Fixture, Topology, on_every_backend};

on_every_backend!(
    operators_see_and_clear_a_stuck_lock,
    operators_see_a_shared_key_free_once_its_last_lease_ends,
);

async fn operators_see_and_clear_a_stuck_lock(fixture: Fixture) {
    let operator = &fixture.client;
    assert!(!operator.is_locked("stuck-report").await.unwrap());
    assert_eq!(operator.lease_left("stuck-report").await.unwrap(), None);

    let lease = Duration::from_secs(60);
    let stuck = fixture
        .hold_elsewhere("stuck-report", LockOptions::new().lease(lease))
        .await;
    assert!(operator.is_locked("stuck-report").await.unwrap());
    let left = operator.lease_left("stuck-report").await.unwrap().unwrap();
    assert!(
        left > lease - Duration::from_secs(5) && left <= lease,
        "{left:?}"
    );

    let waiter = fixture.connect().await;
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new()
            .retry_wait(Duration::from_secs(5))
            .timeout(Duration::from_secs(20));
        waiter.acquire("stuck-report", &options).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cleared_at = Instant::now();
    assert!(operator.force_unlock("stuck-report").await.unwrap());
    let next = waiting
        .await
        .unwrap()
        .expect("the waiter gets the cleared lock");
    assert!(
        cleared_at.elapsed() < Duration::from_secs(2),
        "the waiter was not told: {:?}",
        cleared_at.elapsed()
    );

    let late = stuck.release().await;
    assert!(
        matches!(late, Err(LockError::NotHeld { .. })),
        "the cleared holder still thinks it released: {late:?}"
    );
    assert!(next.is_held());
    assert!(!fixture.free_elsewhere("stuck-report").await);
    next.release().await.unwrap();
    assert!(!operator.force_unlock("stuck-report").await.unwrap());
    assert!(matches!(
        operator.force_unlock("").await,
        Err(LockError::InvalidKey { .. })
    ));
}

/// A key that holders share lives in the store as long as the last lease left on it,
/// even when a holder shortened its own: by an `extend`, or by a release inside a
/// `hold_at_least` window.
async fn operators_see_a_shared_key_free_once_its_last_lease_ends(fixture: Fixture) {
    let operator = &fixture.client;
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(20);
    let reader = fixture
        .hold_elsewhere("price-list", LockOptions::new().shared(true).lease(long))
        .await;
    reader.extend(short).await.unwrap();
    let left = operator.lease_left("price-list").await.unwrap();
    assert!(
        left.is_some_and(|left| left <= short),
        "an extended shared hold: {left:?} left"
    );
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(
        !operator.is_locked("price-list").await.unwrap(),
        "a shared key locked after its only lease ended"
    );
    drop(reader);

    if fixture.topology == Topology::Redlock {
        return;
    }
    let windowed = LockOptions::new()
        .permits(2)
        .lease(long)
        .hold_at_least(short);
    let permit = fixture.hold_elsewhere("exports", windowed).await;
    permit.release().await.unwrap();
    let left = operator.lease_left("exports").await.unwrap();
    assert!(
        left.is_some_and(|left| left <= short),
        "a permit released in its window: {left:?} left"
    );
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(
        !operator.is_locked("exports").await.unwrap(),
        "a semaphore locked after its window ended"
    );
}

/// A `force_unlock` that Redis ran but whose answer was lost to a dropped
/// connection is not sent again: a second one would take the lock from the waiter it
/// was passed to, which may have claimed it already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_whose_answer_is_lost_frees_the_lock_once() {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port()).await;
    let operator = LockClient::connect(&proxy.url()).await.unwrap();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let stuck = holder
        .acquire(
            "stuck-report",
            &LockOptions::new().lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let waiter = LockClient::connect(&redis.url()).await.unwrap();
        waiting.push(tokio::spawn(async move {
            let patient = LockOptions::new()
                .retry_wait(Duration::from_secs(5))
                .timeout(Duration::from_secs(20));
            waiter.acquire("stuck-report", &patient).await
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The script is loaded, so that the request is one `EVALSHA` that Redis runs.
    assert!(!operator.force_unlock("another-report").await.unwrap());

    // The request reaches a frozen Redis, and the operator's connection drops before
    // the answer; nothing sent after it gets through until the first waiter has
    // claimed the lock that the request passed to it.
    redis.freeze();
    let unlocking = tokio::spawn(async move { operator.force_unlock("stuck-report").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.stall();
    proxy.cut();
    redis.thaw();
    let second = waiting.pop().unwrap();
    let first = waiting.pop().unwrap();
    let first = first
        .await
        .unwrap()
        .expect("the first waiter gets the cleared lock");
    proxy.resume();
    let unlocked = unlocking.await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.is_held());
    assert!(
        !second.is_finished(),
        "two holders: the lock went on to the second waiter too (force_unlock: {unlocked:?})"
    );
    second.abort();
    drop(stuck);
    first.release().await.unwrap();
}
