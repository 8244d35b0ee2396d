//! Sentinel: the client follows a failover, and where replica sync is turned off, a
//! lock the old primary had not replicated is lost, which the holder's watchdog
//! reports. Waiters hear releases on the new primary, and the primary takes the
//! URL's password and database.

use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockOptions};
use lock_tests::SentinelGroup;
use redis::Commands;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_in_a_failover_is_reported_by_the_watchdog() {
    let mut group = SentinelGroup::start(Duration::from_secs(1));
    // Availability over failover safety: the grant below counts without a replica.
    let config = ClientConfig::new().replicas(0);
    let client = LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_takes_the_urls_password_and_database() {
    let group = SentinelGroup::start_with_password(Duration::from_secs(1), "s3cret");
    let urls = group
        .sentinel_urls()
        .into_iter()
        .map(|url| format!("{url}/3"));
    let client = LockClient::sentinel(urls, group.name).await.unwrap();
    let guard = client
        .acquire("payroll", &LockOptions::new())
        .await
        .expect("the client authenticates to the primary");
    let mut primary = group.primary.connection();
    let () = redis::cmd("SELECT").arg(3).query(&mut primary).unwrap();
    assert!(
        primary.exists::<_, bool>("lock:{payroll}").unwrap(),
        "the lock lives in database 3"
    );
    guard.release().await.unwrap();
}

/// Takes `key` on `client`, retrying while the client finds its way to a new
/// primary after a failover.
async fn acquire_after_failover(client: &LockClient, key: &str) -> lock_runtime::LockGuard {
    let started = Instant::now();
    loop {
        match client.acquire(key, &LockOptions::new()).await {
            Ok(guard) => return guard,
            Err(error @ LockError::Backend { .. }) => {
                assert!(started.elapsed() < Duration::from_secs(10), "{error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_hear_releases_on_the_new_primary_after_a_failover() {
    let mut group = SentinelGroup::start(Duration::from_secs(1));
    // The new primary has no replica once the old one is dead: with replica sync,
    // nothing could be granted there.
    let connect = || {
        let config = ClientConfig::new().replicas(0);
        LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
    };
    let holder = connect().await.unwrap();
    let waiter = connect().await.unwrap();
    // The waiter listens for releases once, on the old primary.
    let guard = holder
        .acquire("warm-up", &LockOptions::new())
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire("warm-up", &LockOptions::new()).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    guard.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();

    let old_primary = group.primary.port();
    group.primary.kill();
    tokio::task::block_in_place(|| group.wait_for_failover(old_primary, Duration::from_secs(30)));

    let guard = acquire_after_failover(&holder, "payroll").await;
    // Busy at once, so the release below is the first thing that can wake it.
    let _ = acquire_after_failover(&waiter, "probe")
        .await
        .release()
        .await;
    let pause = Duration::from_secs(5);
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let patient = LockOptions::new()
                .retry_wait(pause)
                .timeout(Duration::from_secs(30));
            let guard = waiter.acquire("payroll", &patient).await.unwrap();
            let got_it = Instant::now();
            guard.release().await.unwrap();
            got_it
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let got_it = waiting.await.unwrap();
    let heard_after = got_it.duration_since(released_at);
    assert!(
        heard_after < Duration::from_millis(1_500),
        "the waiter got the lock {heard_after:?} after its release: it polled at {pause:?} \
         instead of hearing the release on the new primary"
    );
}
