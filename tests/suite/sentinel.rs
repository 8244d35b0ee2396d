//! Sentinel: the client follows a failover, and where replica sync is turned off, a
//! lock the old primary had not replicated is lost, which the holder's watchdog
//! reports. Waiters hear releases on the new primary, and the primary takes the
//! URL's password and database. A grant or renewal is confirmed on the server that
//! made it, even while a primary the Sentinels failed over from lives on, and
//! never on that primary, where a grant is refused as soon as they disown it, and a
//! release or a give-back that primary answered is sent again to the new one,
//! whether its caller went or was told the grant was not vouched for. A
//! client follows the switches of primary the Sentinels announce, so one that only
//! waits moves at once, and asks them on: one cut off from them through a switch
//! follows it too, and one whose Sentinels went silent listens anew and asks them on
//! new connections.
//! While the primary is down, the Sentinels are asked at a pace, not once per call,
//! and a Sentinel that is down is listened to again at a falling pace. A client
//! that connects before the old primary is back waits for it as a replica.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockGuard, LockInspector, LockOptions};
use lock_tests::{SentinelGroup, TcpProxy};
use redis::Commands;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{acquire_once_back, acquire_while_down, assert_refused_unreplicated};

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

/// A client that connects after a failover, while the old primary is down and not
/// yet back as the new one's replica, waits for it as for any replica that is down:
/// the Sentinels list the old primary among the new one's replicas at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_connects_before_the_old_primary_is_back_waits_for_it() {
    let mut group = SentinelGroup::start(Duration::from_secs(1));
    group.kill_primary();
    tokio::task::block_in_place(|| group.promote_replica(Duration::from_secs(30)));
    let config = ClientConfig::new().replica_timeout(Duration::from_millis(100));
    let client = LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
        .await
        .unwrap();
    let granted = client
        .acquire("invoice:after-failover", &LockOptions::new().spin(false))
        .await;
    assert_refused_unreplicated(&granted);
    tokio::task::block_in_place(|| group.restore_old_primary());
    let options = LockOptions::new().timeout(Duration::from_secs(5));
    let guard = client.acquire("invoice:after-failover", &options).await;
    guard
        .expect("granted, confirmed by the old primary as a replica")
        .release()
        .await
        .unwrap();
    client.shutdown().await;
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
    let acquired = after_failover(client, key, &LockOptions::new()).await;
    acquired.unwrap_or_else(|error| panic!("{error}"))
}

/// What acquiring `key` on `client` comes to once the client finds a primary after a
/// failover: while the Sentinels' views settle it may find none they agree on, and
/// says so (a `Backend` error, tried again here for up to 10 s).
async fn after_failover(
    client: &LockClient,
    key: &str,
    options: &LockOptions,
) -> Result<lock_runtime::LockGuard, LockError> {
    let started = Instant::now();
    loop {
        match client.acquire(key, options).await {
            Err(LockError::Backend { .. }) if started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            acquired => return acquired,
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

/// Sentinels that fail over from a primary that lives on (frozen past down-after,
/// then thawed) leave it answering as a primary until they demote it, seconds later.
/// A client whose connections went different ways through that, the lock's own to
/// the new primary and the one that confirms grants still to the old, confirms each
/// grant where it was made all the same. With no replica left to acknowledge it, an
/// acquisition in that window fails saying so, and leaves nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_confirmed_where_they_were_made_while_an_old_primary_lives_on() {
    let group = SentinelGroup::start(Duration::from_secs(1));
    let config = ClientConfig::new().command_timeout(Duration::from_millis(200));
    let client = LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
        .await
        .unwrap();
    let options = LockOptions::new()
        .lease(Duration::from_secs(10))
        .timeout(Duration::from_millis(1500));
    let guard = client.acquire("order:1", &options).await.unwrap();
    guard.release().await.unwrap();

    // The lock's connection times out on the frozen primary and is dropped; the one
    // that confirms grants sends nothing meanwhile, so it stays there.
    group.primary.freeze();
    let once = LockOptions::new().spin(false);
    let frozen = client.acquire("order:1", &once).await;
    assert!(
        matches!(frozen, Err(LockError::Backend { .. })),
        "{frozen:?}"
    );
    let started = Instant::now();
    thaw_once_failed_over(&group).await;

    let unconfirmed = after_failover(&client, "order:1", &options).await;
    assert_eq!(
        group.primary.role(),
        "master",
        "the Sentinels demoted the old primary before the test could look"
    );
    assert!(
        matches!(
            unconfirmed,
            Err(LockError::Replication {
                acknowledged: 0,
                ..
            })
        ),
        "{unconfirmed:?}"
    );
    let inspector = LockInspector::connect(group.replica.url().as_str())
        .await
        .unwrap();
    let left = inspector.lock("order:1").await.unwrap();
    assert!(
        left.is_none(),
        "a grant not confirmed was left held: {left:?}"
    );

    // Demoted, the old primary acknowledges grants as the new one's replica.
    while group.primary.role() != "slave" {
        assert!(started.elapsed() < Duration::from_secs(60), "never demoted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let options = options.timeout(Duration::from_secs(5));
    let guard = client.acquire("order:1", &options).await.unwrap();
    guard.release().await.unwrap();
}

/// With two replicas, the Sentinels move the one they did not promote to the new
/// primary, so renewals can be confirmed there while the old primary still answers
/// as one. A holder whose renewals the failover cut off, and whose connection that
/// confirms them stayed with the old primary, finds the new one on its first renewal
/// not confirmed, and keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_a_held_lock_outlives_an_old_primary_that_lives_on() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    let config = ClientConfig::new().command_timeout(Duration::from_millis(200));
    let client = LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
        .await
        .unwrap();
    let lease = Duration::from_secs(9);
    let held = client
        .acquire("account:7", &LockOptions::new().lease(lease).watchdog(true))
        .await
        .unwrap();

    let frozen_at = Instant::now();
    group.primary.freeze();
    thaw_once_failed_over(&group).await;

    // Past the lease the last renewal before the freeze gave.
    tokio::select! {
        () = held.lost() => panic!("the lock held through the failover was reported lost"),
        () = tokio::time::sleep_until(frozen_at + lease + Duration::from_millis(500)) => {}
    }
    let inspector = LockInspector::connect(group.named_primary().url().as_str())
        .await
        .unwrap();
    let found = inspector.lock("account:7").await.unwrap();
    assert!(found.is_some(), "the new primary does not hold the lock");
    held.release().await.unwrap();
}

/// A planned failover (`SENTINEL FAILOVER`) leaves the old primary answering as one
/// for seconds, and a release it answers frees nothing on the new primary. The
/// release is sent again there once the Sentinels name it, so a client waiting for
/// the lock gets it within moments, not once the lease left on the new primary ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_old_primary_answered_is_sent_again_to_the_new_one() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    let (_, held, waiting) = held_with_a_client_waiting(&group, "nightly-export").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    switch_over_with_the_old_primary_alive(&group);
    let released_at = Instant::now();
    held.release().await.unwrap();
    got_soon_after(
        waiting,
        released_at,
        "the release stayed on the old primary, and the new one kept the lock for its lease",
    )
    .await;
}

/// A grant whose caller went while the Sentinels were slow to vouch for it is given
/// back once they answer. A planned failover meanwhile has it given back on the old
/// primary, which frees nothing on the new one: it is sent again there, as a release
/// is, so a client waiting for the lock gets it within moments, not once the lease
/// of a grant nobody holds ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_given_back_on_the_old_primary_is_given_back_on_the_new_one() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    let (proxies, leaving, waiter) = proxied_and_direct(&group, Duration::from_secs(10)).await;

    // The grant is made on the primary at once; the Sentinels' word on it, and on
    // the switch below, reaches its client 4 s late.
    for proxy in &proxies {
        proxy.delay_answers(Duration::from_secs(4));
    }
    let gone =
        tokio::spawn(async move { leaving.acquire("refund-run", &LockOptions::new()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gone.abort();
    let waiting = waiting_for(waiter, "refund-run");
    switch_over_with_the_old_primary_alive(&group);
    let switched_at = Instant::now();
    // Its follow-up asks the slow Sentinels twice: 4 s each, then a release.
    let (next, got_at) = waiting.await.unwrap().expect("the waiter got the lock");
    let waited = got_at.duration_since(switched_at);
    eprintln!("the waiter got the lock {waited:?} after the switch");
    assert!(
        waited < Duration::from_secs(20),
        "the waiter got the lock {waited:?} after the switch: the grant stayed on the new \
         primary for its lease"
    );
    next.release().await.unwrap();
}

/// A grant the Sentinels do not vouch for is given back where it was made. Made
/// on the primary just before a planned failover, it reached the replica promoted;
/// the Sentinels, cut off from its client until the switch was made, never vouch
/// for it, and the old primary, which answers as one until they demote it, takes
/// the give-back, which frees nothing on the new one. It is sent again there, as a
/// release is, so a client waiting for the lock gets it within moments, not once
/// the lease of a grant nobody holds ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_given_back_unvouched_through_a_switch_is_given_back_on_the_new_primary() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    // What the Sentinels do not answer within this is not vouched for.
    let (proxies, granting, waiter) = proxied_and_direct(&group, Duration::from_secs(4)).await;

    for proxy in &proxies {
        proxy.stall();
    }
    let refused = tokio::spawn(async move {
        let once = LockOptions::new().spin(false);
        granting.acquire("ledger-close", &once).await
    });
    let asked_at = Instant::now();
    while !group
        .replicas()
        .all(|replica| replica.has_key("lock:{ledger-close}"))
    {
        assert!(
            asked_at.elapsed() < Duration::from_secs(3),
            "the grant did not reach every replica within 3 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = waiting_for(waiter, "ledger-close");
    switch_over_with_the_old_primary_alive(&group);
    let refused = refused.await.unwrap();
    assert!(
        matches!(refused, Err(LockError::Replication { .. })),
        "{refused:?}"
    );
    assert!(
        group.named_primary().has_key("lock:{ledger-close}"),
        "the give-back reached the new primary before the switch: nothing to follow"
    );

    for proxy in &proxies {
        proxy.resume();
    }
    got_soon_after(
        waiting,
        Instant::now(),
        "the give-back stayed on the old primary, and the new one kept the grant for its lease",
    )
    .await;
}

/// A client of `group` that reaches the Sentinels through proxies, with
/// `command_timeout`, and one that reaches them directly, both listening to them:
/// the proxies and the two clients.
async fn proxied_and_direct(
    group: &SentinelGroup,
    command_timeout: Duration,
) -> (Vec<TcpProxy>, LockClient, LockClient) {
    let (proxies, urls) = proxied_sentinels(group).await;
    let config = ClientConfig::new().command_timeout(command_timeout);
    let proxied = LockClient::sentinel_with(&urls, group.name, config);
    let proxied = proxied.await.unwrap();
    let direct = LockClient::sentinel(group.sentinel_urls(), group.name);
    let direct = direct.await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    (proxies, proxied, direct)
}

/// `waiter` waiting for `key`, for 40 s at most.
fn waiting_for(waiter: LockClient, key: &'static str) -> Waiting {
    tokio::spawn(async move {
        let patient = LockOptions::new().timeout(Duration::from_secs(40));
        let acquired = waiter.acquire(key, &patient).await;
        acquired.map(|guard| (guard, Instant::now()))
    })
}

/// A client that only waits through a planned failover makes no grant or release
/// that would show it the switch: its connections stay on the old primary, which
/// still holds its stale copy of the lock, until the Sentinels demote it. It
/// follows their announcement of the switch instead, so it gets the lock released
/// on the new primary within moments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_only_waits_follows_the_switch_the_sentinels_announce() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    let (holder, held, waiting) = held_with_a_client_waiting(&group, "ledger-close").await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let released_at = switch_over_then_release(&group, &holder, held).await;
    got_soon_after(
        waiting,
        released_at,
        "it stayed on the old primary until the Sentinels demoted it",
    )
    .await;
}

/// A client that only waits, cut off from every Sentinel from just before a planned
/// failover until it was over, heard no announcement of the switch. It still
/// follows it: once it listens again, it asks each Sentinel which primary it names,
/// and takes an answer that names another server than before as a switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_follows_a_switch_announced_while_it_could_not_listen() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    let (proxies, urls) = proxied_sentinels(&group).await;
    let waiter = LockClient::sentinel(&urls, group.name);
    let (holder, held, waiting) =
        held_while_waiting(&group, "payout-batch", waiter.await.unwrap()).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    for proxy in &proxies {
        // Closed, and a new connection held up until the failover is over.
        proxy.cut();
        proxy.stall();
    }
    switch_over_then_release(&group, &holder, held).await;
    // Until every Sentinel has announced the switch: the last learns of it later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for proxy in &proxies {
        proxy.resume();
    }
    got_soon_after(
        waiting,
        Instant::now(),
        "it learned of the switch only when the Sentinels demoted the old primary",
    )
    .await;
}

/// A client that only waits, whose connections to the Sentinels all went silent (as
/// when a firewall drops the flows) just before a planned failover, follows the
/// switch: its listening finds each Sentinel silent and listens anew, and has the
/// connection it asks that Sentinel questions on made again too, so that the
/// question that moves it to the new primary is not lost to the silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_sentinels_went_silent_follows_a_switch() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    let (proxies, urls) = proxied_sentinels(&group).await;
    let config = ClientConfig::new().command_timeout(Duration::from_millis(500));
    let waiter = LockClient::sentinel_with(&urls, group.name, config);
    let (holder, held, waiting) =
        held_while_waiting(&group, "payout-retry", waiter.await.unwrap()).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    for proxy in &proxies {
        proxy.silence();
    }
    let released_at = switch_over_then_release(&group, &holder, held).await;
    got_soon_after(
        waiting,
        released_at,
        "it asked the silent Sentinels where the new primary is",
    )
    .await;
}

/// A Sentinel whose host went without a word leaves the connection a client
/// listens on open and silent. The client notices, as it asks every second over
/// that connection which primary the Sentinel names, and listens anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_gone_silent_is_listened_to_anew() {
    let group = SentinelGroup::start(Duration::from_secs(60));
    let (proxies, urls) = proxied_sentinels(&group).await;
    let config = (ClientConfig::new().replicas(0)).command_timeout(Duration::from_millis(500));
    let client = LockClient::sentinel_with(&urls, group.name, config)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<u64> = proxies.iter().map(TcpProxy::connections).collect();

    for proxy in &proxies {
        proxy.silence();
    }
    // A second to the next question, half a second unanswered, 100 ms's pause.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for (index, proxy) in proxies.iter().enumerate() {
        let made = proxy.connections() - before[index];
        assert_eq!(
            made, 1,
            "{made} connections made to Sentinel {index} once it went silent"
        );
    }
    let held = client.acquire("invoice:9", &LockOptions::new()).await;
    held.unwrap().release().await.unwrap();
    client.shutdown().await;
}

/// What a client waits for: the guard, and when it came.
type Waiting = JoinHandle<Result<(LockGuard, Instant), LockError>>;

/// `key` held by one client of `group` on a fixed 20 s lease (no renewal takes the
/// holder to a new primary before it releases), and another client waiting for it:
/// the holder, its guard, and the wait.
async fn held_with_a_client_waiting(
    group: &SentinelGroup,
    key: &'static str,
) -> (LockClient, LockGuard, Waiting) {
    let waiter = LockClient::sentinel(group.sentinel_urls(), group.name);
    held_while_waiting(group, key, waiter.await.unwrap()).await
}

/// As [`held_with_a_client_waiting`], with `waiter` the client waiting.
async fn held_while_waiting(
    group: &SentinelGroup,
    key: &'static str,
    waiter: LockClient,
) -> (LockClient, LockGuard, Waiting) {
    let holder = LockClient::sentinel(group.sentinel_urls(), group.name);
    let holder = holder.await.unwrap();
    let lease = Duration::from_secs(20);
    let held = holder
        .acquire(key, &LockOptions::new().lease(lease))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let patient = LockOptions::new().timeout(lease + Duration::from_secs(5));
        let acquired = waiter.acquire(key, &patient).await;
        acquired.map(|guard| (guard, Instant::now()))
    });
    (holder, held, waiting)
}

/// Asserts that `waiting` got the lock within 5 s of `could`, the first moment it
/// could have; else `why`.
async fn got_soon_after(waiting: Waiting, could: Instant, why: &str) {
    let (next, got_at) = waiting.await.unwrap().expect("the waiter got the lock");
    let waited = got_at.duration_since(could);
    eprintln!("the waiter got the lock {waited:?} after it first could");
    assert!(
        waited < Duration::from_secs(5),
        "the waiter got the lock {waited:?} after it first could: {why}"
    );
    next.release().await.unwrap();
}

/// A grant on a primary the Sentinels have failed over from, which lives on, is
/// refused as soon as they say so, not once the replicas it has no more are waited
/// for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_the_sentinels_disown_is_refused_without_waiting_for_replicas() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    let replica_timeout = Duration::from_secs(3);
    let config = ClientConfig::new().replica_timeout(replica_timeout);
    let client = LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
        .await
        .unwrap();
    let warm_up = client.acquire("refund:3", &LockOptions::new()).await;
    warm_up.unwrap().release().await.unwrap();
    // Until the Sentinels have vouched for the server that answered the release.
    tokio::time::sleep(Duration::from_millis(500)).await;

    switch_over_with_the_old_primary_alive(&group);
    let asked = Instant::now();
    let refused = client
        .acquire("refund:3", &LockOptions::new().spin(false))
        .await;
    let took = asked.elapsed();
    assert!(
        matches!(
            refused,
            Err(LockError::Replication {
                named_by_sentinels: Some(false),
                ..
            })
        ),
        "{refused:?}"
    );
    assert!(
        took < replica_timeout / 3,
        "refused after {took:?}, with a replica timeout of {replica_timeout:?}"
    );
}

/// A planned failover with the old primary alive, after which `holder` learns of the
/// switch from a grant the Sentinels disown and releases `held` on the new primary
/// (the old one keeps its copy of the lock): when it released.
async fn switch_over_then_release(
    group: &SentinelGroup,
    holder: &LockClient,
    held: LockGuard,
) -> Instant {
    switch_over_with_the_old_primary_alive(group);
    let disowned = holder
        .acquire("disowned", &LockOptions::new().spin(false))
        .await;
    assert!(disowned.is_err(), "{disowned:?}");
    let released_at = Instant::now();
    held.release().await.unwrap();
    released_at
}

/// `SENTINEL FAILOVER`, and back once every Sentinel names the promoted replica,
/// while the old primary still answers as one.
fn switch_over_with_the_old_primary_alive(group: &SentinelGroup) {
    tokio::task::block_in_place(|| group.begin_switch_over());
    assert_eq!(
        group.primary.role(),
        "master",
        "the Sentinels demoted the old primary before the test could look"
    );
}

/// A primary the Sentinels failed over from that lives on (frozen past down-after,
/// then thawed) answers as a primary until they demote it, and a replica they have
/// not moved yet still acknowledges what it writes. A client idle through the
/// failover, whose connections stayed with that primary, is granted nothing there
/// while the new primary has the lock: the Sentinels say that the primary it reached
/// was failed over, so the grant is not confirmed. (Here the replica is never moved,
/// so that the window lasts until the Sentinels demote the old primary.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_that_lives_on_has_no_grant_confirmed() {
    let group = SentinelGroup::start_with_a_replica_left_behind(Duration::from_secs(1));
    let config = ClientConfig::new().command_timeout(Duration::from_millis(200));
    let idle = LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
        .await
        .unwrap();
    let guard = idle.acquire("stock:1", &LockOptions::new()).await.unwrap();
    guard.release().await.unwrap();

    group.primary.freeze();
    thaw_once_failed_over(&group).await;
    let on_new_primary = LockClient::connect_with(
        group.named_primary().url().as_str(),
        ClientConfig::new().replicas(0),
    )
    .await
    .unwrap();
    let options = LockOptions::new().lease(Duration::from_secs(10));
    let holder = on_new_primary.acquire("stock:1", &options).await.unwrap();

    assert_eq!(
        group.primary.role(),
        "master",
        "the Sentinels demoted the old primary before the test could look"
    );
    let second = after_failover(&idle, "stock:1", &options.timeout(Duration::from_secs(2))).await;
    assert!(
        matches!(
            second,
            Err(LockError::Timeout { .. } | LockError::Replication { .. })
        ),
        "the old primary granted the lock the new one's holder held, \
         or acquiring failed otherwise: {second:?}"
    );
    holder.release().await.unwrap();
}

/// A grant counts once a majority of the Sentinels vouch for the primary that made
/// it: with one of three down, locks are granted as before; with two down, none is,
/// and the caller is told why within its budget, with nothing left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_confirmed_while_a_majority_of_the_sentinels_answer() {
    let mut group = SentinelGroup::start(Duration::from_secs(1));
    let client = LockClient::sentinel(&group.sentinel_urls(), group.name)
        .await
        .unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(2));

    group.sentinels[0].kill();
    let guard = client.acquire("invoice:3", &options).await.unwrap();
    guard.release().await.unwrap();

    group.sentinels[1].kill();
    let started = Instant::now();
    let unconfirmed = client.acquire("invoice:3", &options).await;
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(4),
        "the caller waited {waited:?} for an answer on a 2 s budget"
    );
    let Err(
        error @ LockError::Replication {
            named_by_sentinels: Some(false),
            ..
        },
    ) = unconfirmed
    else {
        panic!("expected the Sentinels' vouching to fail: {unconfirmed:?}");
    };
    assert!(error.to_string().contains("majority"), "{error}");
    let inspector = LockInspector::connect(group.primary.url().as_str())
        .await
        .unwrap();
    let left = inspector.lock("invoice:3").await.unwrap();
    assert!(
        left.is_none(),
        "a grant not confirmed was left held: {left:?}"
    );
}

/// A Sentinel that stops answering (its host gone, its process stopped) costs the
/// command timeout to one round, not to every round: the next rounds go on with the
/// majority that answers, and wait for it again once it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_sentinel_delays_one_round_not_every_one() {
    let group = SentinelGroup::start(Duration::from_secs(5));
    let config = ClientConfig::new().command_timeout(Duration::from_secs(1));
    let client = LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
        .await
        .unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(5));
    let take_and_give_back = async || {
        let started = Instant::now();
        let guard = client.acquire("invoice:4", &options).await.unwrap();
        guard.release().await.unwrap();
        started.elapsed()
    };

    group.sentinels[1].freeze();
    let started = Instant::now();
    for _ in 0..5 {
        take_and_give_back().await;
    }
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "five grants took {waited:?} with one Sentinel silent, on a 1 s command timeout"
    );

    group.sentinels[1].thaw();
    take_and_give_back().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    group.sentinels[1].freeze();
    let waited = take_and_give_back().await;
    group.sentinels[1].thaw();
    assert!(
        waited >= Duration::from_millis(900),
        "a Sentinel that answered again was not waited for: the grant took {waited:?}"
    );
}

/// Waits until the Sentinels name another primary than the frozen one, then thaws
/// it: a primary they failed over from that lives on.
async fn thaw_once_failed_over(group: &SentinelGroup) {
    let (old_primary, started) = (group.primary.port(), Instant::now());
    while group.primary_port() == old_primary {
        assert!(started.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    group.primary.thaw();
}

/// After a failover, the client finds the new primary through the Sentinels that
/// answer: one listed first that went silent (its host gone without a word) does not
/// hold the reconnection for its timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_with_the_first_sentinel_silent() {
    let mut group = SentinelGroup::start(Duration::from_secs(1));
    // No replica left after the failover; and long bounds, which a lookup that
    // waited on the silent Sentinel would show.
    let config = ClientConfig::new()
        .replicas(0)
        .connect_timeout(Duration::from_secs(5))
        .command_timeout(Duration::from_secs(5));
    let client = LockClient::sentinel_with(group.sentinel_urls(), group.name, config)
        .await
        .unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(5));
    let guard = client.acquire("invoice:5", &options).await.unwrap();
    guard.release().await.unwrap();

    group.sentinels[0].freeze();
    let old_primary = group.primary.port();
    group.kill_primary();
    let started = Instant::now();
    while group.primary_port_named_by(1) == old_primary {
        assert!(started.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let acquired = after_failover(&client, "invoice:5", &options).await;
    let waited = started.elapsed();
    group.sentinels[0].thaw();
    let guard = acquired.unwrap();
    assert!(
        waited < Duration::from_secs(4),
        "the lock took {waited:?} to grant on the new primary, with 5 s bounds"
    );
    let promoted = LockInspector::connect(group.replica.url().as_str())
        .await
        .unwrap();
    let held = promoted.lock("invoice:5").await.unwrap();
    assert!(
        held.is_some(),
        "the lock is not held on the promoted replica"
    );
    guard.release().await.unwrap();
}

/// A primary name no Sentinel monitors is the caller's setup to fix: connecting
/// fails at once with `InvalidOptions` naming it, not as an outage to retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_name_no_sentinel_monitors_fails_at_connect() {
    let group = SentinelGroup::start(Duration::from_secs(5));
    let started = Instant::now();
    let connected = LockClient::sentinel(&group.sentinel_urls(), "no-such-primary").await;
    let waited = started.elapsed();
    let Err(error @ LockError::InvalidOptions { .. }) = connected else {
        panic!("expected InvalidOptions: {:?}", connected.err());
    };
    let message = error.to_string();
    assert!(message.contains("`no-such-primary`"), "{message}");
    assert!(message.contains("sentinel monitor"), "{message}");
    assert!(
        waited < Duration::from_secs(1),
        "the refusal took {waited:?}, as if it were an outage"
    );
}

/// The client connects while the first Sentinel listed is silent (its host gone
/// without a word): it asks the Sentinels at once, not one after another, and the
/// first grant does not wait for the silent one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_connects_with_the_first_sentinel_silent() {
    let group = SentinelGroup::start(Duration::from_secs(5));
    let config = ClientConfig::new()
        .connect_timeout(Duration::from_secs(1))
        .command_timeout(Duration::from_secs(1));
    group.sentinels[0].freeze();
    let started = Instant::now();
    let connected = LockClient::sentinel_with(group.sentinel_urls(), group.name, config).await;
    let connecting = started.elapsed();
    let started = Instant::now();
    let granted = match &connected {
        Ok(client) => Some(client.acquire("invoice:6", &LockOptions::new()).await),
        Err(_) => None,
    };
    let granting = started.elapsed();
    group.sentinels[0].thaw();
    let client = connected.unwrap();
    granted.unwrap().unwrap().release().await.unwrap();
    assert!(
        connecting < Duration::from_millis(1900),
        "connecting took {connecting:?} on 1 s bounds, with one Sentinel silent"
    );
    assert!(
        granting < Duration::from_millis(500),
        "the first grant took {granting:?}: it waited for the silent Sentinel"
    );
    client.shutdown().await;
}

/// While the primary the Sentinels name is down, a client that is called all the
/// time asks the Sentinels where it is over the connection it keeps to each for
/// questions, not over new ones: a try opened one to every Sentinel, and trying once per call
/// hammered them while they failed the primary over. That holds for a Sentinel slow
/// to answer, whose answer a try does not wait for. Each call still fails within the
/// bound, naming the key, and once the primary is back the client works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_primary_is_down_asks_the_sentinels_over_kept_connections() {
    let mut group = SentinelGroup::start(Duration::from_secs(60));
    let (proxies, urls) = proxied_sentinels(&group).await;
    proxies[2].delay_answers(Duration::from_millis(200));
    // No replication rounds: they would wait for the slow Sentinel, and so connect
    // to it before the primary goes down.
    let config = ClientConfig::new().replicas(0);
    let client = LockClient::sentinel_with(&urls, group.name, config)
        .await
        .unwrap();
    let options = LockOptions::new();
    let held = client.acquire("invoice:7", &options).await.unwrap();
    held.release().await.unwrap();
    group.kill_primary();
    let calls = acquire_while_down(&client, "invoice:7", &options).await;
    for (index, proxy) in proxies.iter().enumerate() {
        let made = proxy.connections();
        // One for questions, one listening for the switches they announce.
        assert_eq!(
            made, 2,
            "{calls} calls made {made} connections to Sentinel {index} in all"
        );
    }

    group.primary.restart();
    acquire_once_back(&client, "invoice:7", &options).await;
    client.shutdown().await;
}

/// A client listens for the switches of primary on every Sentinel for its whole
/// life; one Sentinel that is down (it refuses each connection at once) is tried
/// again at a falling pace, not ten times a second, and locking goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_that_is_down_is_listened_to_at_a_falling_pace() {
    let group = SentinelGroup::start(Duration::from_secs(60));
    let down = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let down_at = format!("redis://127.0.0.1:{}", down.local_addr().unwrap().port());
    let tries = Arc::new(AtomicU64::new(0));
    let counting = tries.clone();
    tokio::spawn(async move {
        while let Ok((refused, _)) = down.accept().await {
            counting.fetch_add(1, Ordering::Relaxed);
            drop(refused);
        }
    });
    let mut urls = group.sentinel_urls();
    urls.push(down_at);
    let config = ClientConfig::new().replicas(0);
    let client = LockClient::sentinel_with(&urls, group.name, config)
        .await
        .unwrap();
    let listened_for = Duration::from_secs(3);
    tokio::time::sleep(listened_for).await;
    let tried = tries.load(Ordering::Relaxed);
    assert!(
        tried <= 8,
        "the Sentinel that is down was tried {tried} times in {listened_for:?}"
    );
    let held = client.acquire("invoice:8", &LockOptions::new()).await;
    held.unwrap().release().await.unwrap();
    client.shutdown().await;
}

/// A proxy in front of each of `group`'s Sentinels, to count the connections made
/// to it, and the proxies' URLs.
async fn proxied_sentinels(group: &SentinelGroup) -> (Vec<TcpProxy>, Vec<String>) {
    let mut proxies = Vec::new();
    for sentinel in &group.sentinels {
        proxies.push(TcpProxy::start(sentinel.port()).await);
    }
    let urls = proxies.iter().map(TcpProxy::url).collect();
    (proxies, urls)
}

/// A Sentinel frozen while the primary is down (it takes connections and never
/// answers) is not given a connection per try either: its kept connection is
/// forgotten once it leaves a probe unanswered for the bound, and a new one is tried
/// at most once per bound, not ten times a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_sentinel_is_not_given_a_connection_per_try() {
    let mut group = SentinelGroup::start(Duration::from_secs(60));
    let (proxies, urls) = proxied_sentinels(&group).await;
    let bound = Duration::from_millis(500);
    let config = (ClientConfig::new().replicas(0))
        .connect_timeout(bound)
        .command_timeout(bound);
    let client = LockClient::sentinel_with(&urls, group.name, config)
        .await
        .unwrap();
    let options = LockOptions::new();
    let held = client.acquire("invoice:8", &options).await.unwrap();
    held.release().await.unwrap();
    group.sentinels[2].freeze();
    group.kill_primary();
    let mut calls = 0;
    for _ in 0..3 {
        calls += acquire_while_down(&client, "invoice:8", &options).await;
    }
    group.sentinels[2].thaw();
    // The one kept from before, then one try per bound and pace (0.6 s): 6 in 3 s,
    // where a try per call made 32. And listening: the connection from before, then
    // tries at a falling pace once a question goes unanswered (3 in 3 s).
    let made = proxies[2].connections();
    assert!(
        made <= 11,
        "{calls} calls in 3 s made {made} connections to the frozen Sentinel"
    );

    group.primary.restart();
    acquire_once_back(&client, "invoice:8", &options).await;
    client.shutdown().await;
}
