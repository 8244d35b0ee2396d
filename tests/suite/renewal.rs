//! The watchdog renews the leases that fall due together in one request, tells
//! each lock of the request what happened to it, and asks again at a pace when
//! Redis refuses.

use std::collections::HashSet;
use std::time::Duration;

use lock_runtime::{LockClient, LockGuard, LockOptions};
use lock_tests::{CountingProxy, RedisCluster, RedisServer};
use tokio::task::JoinSet;
use tokio::time::Instant;

const LOCKS: usize = 100;

/// `locks` locks named `<name>:<number>`, taken together on watchdog leases.
async fn hold(client: &LockClient, name: &str, locks: usize, lease: Duration) -> Vec<LockGuard> {
    let options = LockOptions::new().lease(lease).watchdog(true);
    let mut taking = JoinSet::new();
    for lock in 0..locks {
        let (client, options, name) = (client.clone(), options.clone(), format!("{name}:{lock}"));
        taking.spawn(async move { (lock, client.acquire(&name, &options).await) });
    }
    let mut guards: Vec<Option<LockGuard>> = (0..locks).map(|_| None).collect();
    while let Some(taken) = taking.join_next().await {
        let (lock, guard) = taken.unwrap();
        guards[lock] = Some(guard.unwrap());
    }
    guards.into_iter().map(Option::unwrap).collect()
}

/// Another client takes `kept:7` from its holder in `guards`: the holder's next
/// renewal is refused, within `lost_within`, and that lock alone is lost, the others
/// on `lease` renewed on; the taker's lease is not touched by the stale holder's
/// renewals.
async fn only_the_lock_taken_away_is_lost(
    operator: &LockClient,
    guards: &[LockGuard],
    lease: Duration,
    lost_within: Duration,
) {
    assert!(operator.force_unlock("kept:7").await.unwrap());
    let taker = operator
        .acquire("kept:7", &LockOptions::new().lease(Duration::from_secs(10)))
        .await
        .unwrap();
    tokio::time::timeout(lost_within, guards[7].lost())
        .await
        .expect("the lock taken away is known lost by its next renewal");
    assert!(taker.is_held());
    tokio::time::sleep(lease).await;
    for (lock, guard) in guards.iter().enumerate().filter(|(lock, _)| *lock != 7) {
        assert!(guard.is_held(), "kept:{lock} was lost with kept:7");
    }
    assert!(!guards[7].is_held());
    let left = operator.lease_left("kept:7").await.unwrap().unwrap();
    assert!(
        left > Duration::from_secs(5),
        "the stale holder's renewals set the taker's lease to {left:?}"
    );
    taker.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_that_fall_due_together_are_renewed_in_one_request() {
    let redis = RedisServer::start();
    let proxy = CountingProxy::start(redis.port()).await;
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let operator = LockClient::connect(&redis.url()).await.unwrap();
    let lease = Duration::from_millis(600);
    proxy.take();
    let guards = hold(&client, "kept", LOCKS, lease).await;
    assert_eq!(proxy.take().get("SET"), LOCKS as u64);

    // Two leases long: without renewals every lock would be gone; with them, each
    // lock is renewed about six times.
    tokio::time::sleep(2 * lease).await;
    let requests = proxy.take().total();
    assert!(
        requests <= 20,
        "{requests} requests renewed {LOCKS} locks about six times each"
    );
    for (lock, guard) in guards.iter().enumerate() {
        assert!(guard.is_held(), "kept:{lock} was lost");
        let left = operator.lease_left(&format!("kept:{lock}")).await.unwrap();
        assert!(left.is_some(), "kept:{lock} is no longer in Redis");
    }

    only_the_lock_taken_away_is_lost(&operator, &guards, lease, lease / 2).await;
}

/// On a Cluster the locks that fall due together lie in many hash slots, which one
/// script call cannot span: each slot's locks go in a call of their own, to the
/// primary that serves it, and each lock learns its own call's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_locks_of_many_slots_are_renewed_together_and_each_told_its_own() {
    let cluster = RedisCluster::start();
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let operator = LockClient::cluster(cluster.urls()).await.unwrap();
    let lease = Duration::from_millis(600);
    let guards = hold(&client, "kept", 40, lease).await;
    let slots: HashSet<u16> = (0..40)
        .map(|lock| cluster.slot_of(&format!("lock:{{kept:{lock}}}")))
        .collect();
    assert!(
        slots.len() > 30,
        "the locks lie in {} slots only",
        slots.len()
    );

    tokio::time::sleep(3 * lease).await;
    for (lock, guard) in guards.iter().enumerate() {
        assert!(guard.is_held(), "kept:{lock} was lost");
        let left = operator.lease_left(&format!("kept:{lock}")).await.unwrap();
        let left = left.unwrap_or_else(|| panic!("kept:{lock} is no longer in Redis"));
        assert!(left > lease / 3, "kept:{lock} had {left:?} left");
    }

    only_the_lock_taken_away_is_lost(&operator, &guards, lease, lease).await;
}

/// Leases of two lengths taken together fall due together (every 200 ms and every
/// 300 ms: both at 600 ms), and each is renewed for its own lease: never a longer
/// one, which keeps the lock from others longer than asked, nor a shorter one,
/// which ends it in Redis before its holder knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_two_lengths_renewed_together_each_get_their_own() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let operator = LockClient::connect(&redis.url()).await.unwrap();
    let leases = [Duration::from_millis(600), Duration::from_millis(900)];
    let (short, long) = tokio::join!(
        hold(&client, "short", 20, leases[0]),
        hold(&client, "long", 20, leases[1])
    );
    let until = Instant::now() + 4 * leases[1];
    while Instant::now() < until {
        for (name, lease) in [("short", leases[0]), ("long", leases[1])] {
            // Renewed every third of it, a lease has two thirds of it left at least:
            // more than a third, even with a keeper a good while late.
            let least = lease / 3 + Duration::from_millis(50);
            for lock in 0..20 {
                let key = format!("{name}:{lock}");
                let left = operator.lease_left(&key).await.unwrap();
                let left = left.unwrap_or_else(|| panic!("{key} is no longer in Redis"));
                assert!(
                    least < left && left <= lease,
                    "{key}, on a {lease:?} lease, had {left:?} left"
                );
            }
        }
    }
    for (name, guards) in [("short", short), ("long", long)] {
        for (lock, guard) in guards.into_iter().enumerate() {
            assert!(guard.is_held(), "{name}:{lock} was lost");
            guard.release().await.unwrap();
        }
    }
}

/// A renewal Redis refuses at once is asked again a few times a lease while the
/// lease lasts, not as fast as the refusals come back: during an outage a short
/// lease would otherwise cost a request and a warning a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_renewal_is_asked_again_at_a_pace_not_in_a_loop() {
    let redis = RedisServer::start();
    let proxy = CountingProxy::start(redis.port()).await;
    let client = LockClient::connect(&proxy.url()).await.unwrap();
    let lease = Duration::from_millis(600);
    let options = LockOptions::new().lease(lease).watchdog(true);
    let guard = client.acquire("refused", &options).await.unwrap();
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "-evalsha", "-eval", "-fcall"])
        .query(&mut redis.connection())
        .unwrap();
    proxy.take();
    tokio::time::timeout(2 * lease, guard.lost())
        .await
        .expect("the lock is lost once its lease ends unrenewed");
    // Due every 200 ms, and asked again 50 to 100 ms after a refusal.
    let requests = proxy.take().total();
    assert!(
        requests <= 20,
        "{requests} renewal requests within one {lease:?} lease while Redis refused them"
    );
}

/// A client made and first used on a runtime that has since shut down, its watchdog
/// with it, still renews the leases it takes on the next runtime: an application
/// that builds a runtime per job, or a test per runtime, keeps one client.
#[test]
fn a_client_outliving_its_runtime_still_renews_leases() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(300);
    let options = LockOptions::new().lease(lease).watchdog(true);
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let client = runtime().block_on(async {
        let client = LockClient::connect(&redis.url()).await.unwrap();
        let guard = client.acquire("job:first", &options).await.unwrap();
        guard.release().await.unwrap();
        client
    });
    runtime().block_on(async {
        let operator = LockClient::connect(&redis.url()).await.unwrap();
        let guard = client.acquire("job:next", &options).await.unwrap();
        tokio::time::sleep(4 * lease).await;
        assert!(guard.is_held(), "the lease ran out: nothing renewed it");
        let left = operator.lease_left("job:next").await.unwrap();
        assert!(left.is_some(), "the lock is no longer in Redis");
        guard.release().await.unwrap();
    });
}
