//! Sentinel: the client follows a failover, and a lock the old primary had not
//! replicated is lost, which the holder's watchdog reports.

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::SentinelGroup;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_in_a_failover_is_reported_by_the_watchdog() {
    let mut group = SentinelGroup::start(Duration::from_secs(1));
    let client = LockClient::sentinel(group.sentinel_urls(), group.name)
        .await
        .unwrap();

    // Cut replication (the replica can no longer authenticate), so the lock taken
    // next never reaches the replica: the primary fails before replicating it.
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "masterauth", "wrong"])
        .query(&mut group.replica.connection())
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "replica"])
        .query(&mut group.primary.connection())
        .unwrap();
    let lease = Duration::from_secs(9);
    let acquired_at = Instant::now();
    let guard = client
        .acquire(
            "nightly-billing",
            &LockOptions::new().lease(lease).watchdog(true),
        )
        .await
        .unwrap();

    let old_primary = group.primary.port();
    group.primary.kill();
    tokio::task::block_in_place(|| group.wait_for_failover(old_primary, Duration::from_secs(30)));
    assert_eq!(
        group.primary_port(),
        group.replica.port(),
        "the replica was promoted"
    );

    tokio::time::timeout(lease, guard.lost())
        .await
        .expect("the watchdog reports the loss");
    assert!(!guard.is_held());
    assert!(
        acquired_at.elapsed() < lease - lease / 10,
        "the loss was learned from the new primary, before the lease ran out"
    );

    let next = client
        .acquire("nightly-billing", &LockOptions::new().spin(false))
        .await
        .expect("the client follows the failover and the lock is free there");
    next.release().await.unwrap();
}
