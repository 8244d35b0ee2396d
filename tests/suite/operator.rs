//! Operators' tools, outside the ownership rules: looking at a lock, and clearing
//! one stuck behind a holder that will never let go.

use std::time::Duration;

use lock_runtime::{LockError, LockOptions};
use tokio::time::Instant;

use crate::behaviour::{Fixture, on_every_backend};

on_every_backend!(operators_see_and_clear_a_stuck_lock);

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
