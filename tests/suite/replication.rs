//! Replica sync: a grant counts once a replica has it. With the replica cut off, a
//! grant is given back, never asked for again under its token, and the caller learns
//! why, and so is a grant that lapsed before it was confirmed; a renewal the replica
//! does not confirm extends nothing the holder counts on; many grants share one
//! `WAIT`, on a Cluster one per primary; a primary without replicas pays nothing; and
//! a replica added after the client connected is waited for within a recount, on one
//! server, through Sentinel and on a Cluster.

use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockOptions};
use lock_tests::{RedisCluster, RedisServer, SentinelGroup, TcpProxy};
use tokio::time::Instant;

/// A primary and a replica in sync with it.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    // The primary counts a replica (`ROLE`) a moment after the replica is in sync.
    let started = Instant::now();
    while !primary_lists_a_replica(&primary) {
        assert!(started.elapsed() < Duration::from_secs(10), "not listed");
        std::thread::sleep(Duration::from_millis(20));
    }
    (primary, replica)
}

fn primary_lists_a_replica(primary: &RedisServer) -> bool {
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut primary.connection()).unwrap();
    matches!(role.get(2), Some(redis::Value::Array(replicas)) if !replicas.is_empty())
}

/// Freezes the replica, so that nothing written from now on reaches it; the primary
/// still counts it as connected, as in a partition it has not noticed yet. Then a
/// `WAIT` on a connection that has written nothing answers 1 at once (on Valkey 9;
/// Redis 7.0 counts a read-only script as a write), which the confirming round's
/// write of the lock's expiry is there to prevent.
fn freeze(replica: &RedisServer) {
    replica.freeze();
}

/// Freezes the replica and makes the primary drop its link.
fn cut_off(primary: &RedisServer, replica: &RedisServer) {
    replica.freeze();
    primary.drop_replica_links();
}

fn quick_to_give_up() -> ClientConfig {
    ClientConfig::new().replica_timeout(Duration::from_millis(200))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_counts_only_once_the_replica_has_it() {
    let (primary, replica) = primary_and_replica();
    let client = LockClient::connect_with(&primary.url(), quick_to_give_up())
        .await
        .unwrap();
    let guard = client
        .acquire("invoice:7", &LockOptions::new())
        .await
        .unwrap();
    let on_replica: Option<String> = redis::cmd("GET")
        .arg("lock:{invoice:7}")
        .query(&mut replica.connection())
        .unwrap();
    assert!(
        on_replica.is_some(),
        "the replica has the lock once granted"
    );
    assert!(
        primary.calls("wait") >= 1,
        "the grant waited for the replica"
    );
    guard.release().await.unwrap();

    freeze(&replica);
    let started = Instant::now();
    let refused = client
        .acquire("invoice:8", &LockOptions::new().retries(1))
        .await
        .expect_err("no replica confirms the grant");
    assert_eq!(shortfall(&refused), ("invoice:8", 0, 1, None));
    let said = refused.to_string();
    assert!(
        said.contains("only 0 of the 1 required replicas") && !said.contains("append-only"),
        "{said}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "two attempts of 200 ms each, not a hang: {:?}",
        started.elapsed()
    );
    assert!(
        !client.is_locked("invoice:8").await.unwrap(),
        "the unconfirmed grant was given back"
    );
    assert_eq!(refused.http_status(), 503);
    assert!(refused.retry_after().is_some());
    assert!(
        !refused.http_body().contains("invoice"),
        "the body leaks no key"
    );

    // Availability instead: another client that asks for no replica takes it.
    let available = ClientConfig::new().replicas(0);
    let other = LockClient::connect_with(&primary.url(), available)
        .await
        .unwrap();
    let guard = other
        .acquire("invoice:8", &LockOptions::new().spin(false))
        .await
        .unwrap();
    guard.release().await.unwrap();
    replica.thaw();
}

/// A grant no replica confirmed is given back, and the caller asks again, under a
/// new token each time: were a give-back to reach Redis late (sent again on a new
/// connection, or given up on while still queued), it would otherwise free what a
/// later attempt was granted under the same token, which its holder would go on
/// believing it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_given_back_is_not_asked_for_again_under_its_token() {
    let (primary, replica) = primary_and_replica();
    let client = LockClient::connect_with(&primary.url(), quick_to_give_up())
        .await
        .unwrap();
    let monitor = primary.monitor();
    freeze(&replica);
    let options = LockOptions::new().timeout(Duration::from_millis(1_500));
    let refused = client.acquire("payout:3", &options).await;
    assert!(
        matches!(refused, Err(LockError::Replication { .. })),
        "{refused:?}"
    );
    let tokens = monitor.stop_with_tokens_asked_for("lock:{payout:3}");
    replica.thaw();

    crate::assert_each_token_asked_for_once(&tokens);
}

/// A waiter passed the lock whose claim is answered after the claim's lease ran out
/// finds, when the replica is asked to confirm it, that it holds nothing; it gives
/// the grant back and asks next under a new token, not its place's, whose give-back
/// could reach Redis late and free the later grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_lapsed_before_it_was_confirmed_is_not_asked_for_again_under_its_token() {
    let (primary, _replica) = primary_and_replica();
    let proxy = TcpProxy::start(primary.port()).await;
    let waiter = LockClient::connect(&proxy.url()).await.unwrap();
    let holder = LockClient::connect(&primary.url()).await.unwrap();
    let held = holder
        .acquire("payout:4", &LockOptions::new())
        .await
        .unwrap();
    let monitor = primary.monitor();
    // Woken by the release, seconds before it would ask again by itself, so that
    // the answer held back is its claim's.
    let lease = Duration::from_millis(300);
    let options = LockOptions::new()
        .lease(lease)
        .retry_wait(Duration::from_secs(2))
        .timeout(Duration::from_secs(10));
    let waiting = tokio::spawn(async move { waiter.acquire("payout:4", &options).await });
    crate::queued_once(&primary, "payout:4", 1).await;
    proxy.stall_answers_after("payout:4");
    held.release().await.unwrap();
    tokio::time::sleep(lease * 2).await;
    proxy.resume();
    let granted = waiting.await.unwrap();
    let tokens = monitor.stop_with_tokens_asked_for("lock:{payout:4}");
    granted
        .expect("granted under a new token")
        .release()
        .await
        .unwrap();

    let last = tokens.last().expect("tokens asked for");
    let times = tokens.iter().filter(|token| *token == last).count();
    assert!(
        tokens.len() >= 4 && times == 1,
        "the grant that stood was asked for {times} times (the lapsed one's token?): {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_is_told_about_the_replica_not_that_the_lock_is_busy() {
    let (primary, replica) = primary_and_replica();
    let client = LockClient::connect_with(&primary.url(), quick_to_give_up())
        .await
        .unwrap();
    cut_off(&primary, &replica);
    let refused = client
        .try_acquire("report", &LockOptions::new())
        .await
        .expect_err("not `None`: nobody else holds it");
    assert!(
        matches!(refused, LockError::Replication { .. }),
        "{refused:?}"
    );
    replica.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_replica_does_not_confirm_extends_nothing() {
    let (primary, replica) = primary_and_replica();
    let client = LockClient::connect_with(&primary.url(), quick_to_give_up())
        .await
        .unwrap();
    let lease = Duration::from_millis(900);
    let guard = client
        .acquire("ledger", &LockOptions::new().lease(lease).watchdog(true))
        .await
        .unwrap();
    let granted_at = Instant::now();
    cut_off(&primary, &replica);

    let extended = guard.extend(Duration::from_secs(30)).await;
    assert!(
        matches!(extended, Err(LockError::Replication { .. })),
        "{extended:?}"
    );
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the holder learns it lost the lock");
    assert!(!guard.is_held());
    assert!(
        granted_at.elapsed() < lease + Duration::from_millis(300),
        "the hold ended with the last confirmed lease, not a renewed one: {:?}",
        granted_at.elapsed()
    );
    replica.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_that_arrive_together_share_one_wait() {
    let (primary, _replica) = primary_and_replica();
    let clients = [
        LockClient::connect(&primary.url()).await.unwrap(),
        LockClient::connect(&primary.url()).await.unwrap(),
    ];
    let sections = 20;
    let mut tasks = Vec::new();
    for task in 0..32 {
        let client = clients[task % 2].clone();
        tasks.push(tokio::spawn(async move {
            for section in 0..sections {
                let key = format!("account:{task}:{section}");
                let guard = client.acquire(&key, &LockOptions::new()).await.unwrap();
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let grants = 32 * sections;
    let waits = primary.calls("wait");
    assert!(waits > 0, "the grants waited for the replica");
    assert!(
        waits * 2 <= grants,
        "{waits} WAITs for {grants} grants: they were not grouped"
    );
}

/// A `WAIT` blocks the connection it is sent on, and a Cluster client has one per
/// node: a `WAIT` for each slot would wait out the replica timeout behind the one
/// before, and the last ones outlast their request's bound, answered by an error
/// that says nothing of the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_grants_in_many_slots_of_one_primary_share_its_wait() {
    let cluster = RedisCluster::start();
    let shard = cluster.shard_for(cluster.slot_of("batch-0"));
    let mut slots = Vec::new();
    let keys: Vec<String> = (0..)
        .map(|n| format!("batch-{n}"))
        .filter(|key| {
            let slot = cluster.slot_of(key);
            let fresh = cluster.shard_for(slot) == shard && !slots.contains(&slot);
            slots.push(slot);
            fresh
        })
        .take(6)
        .collect();
    let primary = cluster.primary_for(cluster.slot_of(&keys[0]));
    let config = ClientConfig::new()
        .replica_timeout(Duration::from_millis(500))
        .command_timeout(Duration::from_secs(1));
    let client = LockClient::cluster_with(cluster.urls(), config)
        .await
        .unwrap();
    let warm_up = client.acquire(&keys[0], &LockOptions::new()).await;
    warm_up.unwrap().release().await.unwrap();

    cluster.cut_off_replica(shard);
    let waits_before = primary.calls("wait");
    let mut asking = tokio::task::JoinSet::new();
    for key in keys.clone() {
        let client = client.clone();
        asking.spawn(async move {
            let once = LockOptions::new().spin(false);
            (client.acquire(&key, &once).await.map(drop), key)
        });
    }
    while let Some(asked) = asking.join_next().await {
        let (refused, key) = asked.unwrap();
        let refused = refused.expect_err("the replica is cut off");
        assert_eq!(shortfall(&refused), (key.as_str(), 0, 1, None));
    }
    let waits = primary.calls("wait") - waits_before;
    assert!(
        waits < 2 * keys.len() as u64,
        "{waits} WAITs for {} grants on one primary, two for each",
        keys.len()
    );

    let available = ClientConfig::new().replicas(0);
    let other = LockClient::cluster_with(cluster.urls(), available)
        .await
        .unwrap();
    for key in &keys {
        let guard = other.acquire(key, &LockOptions::new().spin(false)).await;
        guard
            .expect("the unconfirmed grant was given back")
            .release()
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_without_replicas_pays_nothing() {
    let primary = RedisServer::start();
    let client = LockClient::connect(&primary.url()).await.unwrap();
    let guard = client.acquire("solo", &LockOptions::new()).await.unwrap();
    guard.extend(Duration::from_secs(5)).await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(primary.calls("wait"), 0);
    assert_eq!(primary.calls("pexpireat"), 0, "no confirmation round ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_added_after_connect_is_waited_for() {
    let primary = RedisServer::start();
    let client = LockClient::connect_with(&primary.url(), quick_to_give_up())
        .await
        .unwrap();
    let replica = RedisServer::start_replica_of(&primary);
    crate::the_added_replica_is_waited_for(&client, &replica).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_replica_added_after_connect_is_waited_for() {
    let mut cluster = RedisCluster::start_without_replicas();
    let client = LockClient::cluster_with(cluster.urls(), quick_to_give_up())
        .await
        .unwrap();
    let slot = cluster.slot_of("payout:9");
    let primary = (cluster.servers.iter())
        .position(|server| server.port() == cluster.primary_for(slot).port())
        .unwrap();
    let replica = cluster.add_replica(primary);
    crate::the_added_replica_is_waited_for(&client, &cluster.servers[replica]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_a_replica_added_after_connect_is_waited_for() {
    let mut group = SentinelGroup::start(Duration::from_secs(5));
    // The group's replica goes, and the Sentinels forget it.
    group.replica.kill();
    let lists_replicas = |sentinel: &RedisServer| {
        let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(group.name)
            .query(&mut sentinel.connection())
            .unwrap();
        !replicas.is_empty()
    };
    let started = Instant::now();
    for sentinel in &group.sentinels {
        let _: i64 = redis::cmd("SENTINEL")
            .arg("RESET")
            .arg(group.name)
            .query(&mut sentinel.connection())
            .unwrap();
        while lists_replicas(sentinel) {
            assert!(started.elapsed() < Duration::from_secs(10), "not forgotten");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let client = LockClient::sentinel_with(group.sentinel_urls(), group.name, quick_to_give_up())
        .await
        .unwrap();
    let replica = RedisServer::start_replica_of(&group.primary);
    // The Sentinels find a replica in the primary's `INFO`, asked every 10 s.
    let started = Instant::now();
    for sentinel in &group.sentinels {
        while !lists_replicas(sentinel) {
            assert!(started.elapsed() < Duration::from_secs(30), "not listed");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    crate::the_added_replica_is_waited_for(&client, &replica).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_waits_for_the_append_only_file_where_the_server_has_it() {
    // With the default `appendfsync everysec`, WAITAOF waits for the next second's
    // fsync, which the default 1 s `replica_timeout` can miss on a loaded machine.
    let primary = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let config = ClientConfig::new().fsync(true);
    let connected = LockClient::connect_with(&primary.url(), config.clone()).await;
    if has_waitaof(&primary) {
        let client = connected.expect("the server has WAITAOF and an append-only file");
        let guard = client.acquire("payout", &LockOptions::new()).await.unwrap();
        guard.release().await.unwrap();
        assert!(
            primary.calls("waitaof") >= 2,
            "the connect check and the grant"
        );
    } else {
        let refused = connected.expect_err("this server has no WAITAOF");
        assert!(
            matches!(&refused, LockError::InvalidOptions { reason, .. } if reason.contains("7.2")),
            "{refused}"
        );
    }

    let without_aof = RedisServer::start();
    let refused = LockClient::connect_with(&without_aof.url(), config)
        .await
        .expect_err("no append-only file to wait for");
    assert!(refused.to_string().contains("appendonly"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_missing_from_the_disk_says_to_fsync_always() {
    // Under `appendfsync no` the primary never fsyncs, so no grant ever reaches disk.
    let primary = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "no"]);
    if !has_waitaof(&primary) {
        return;
    }
    let config = ClientConfig::new()
        .fsync(true)
        .replica_timeout(Duration::from_millis(100));
    let client = LockClient::connect_with(&primary.url(), config)
        .await
        .unwrap();
    let refused = client
        .acquire("payout:2", &LockOptions::new().retries(1))
        .await
        .expect_err("the disk never has the grant");
    assert_eq!(shortfall(&refused), ("payout:2", 0, 0, Some(false)));
    let said = refused.to_string();
    assert!(
        said.contains("appendfsync always") && !said.contains("replicas had it"),
        "says what to change, and not that replicas were missing: {said}"
    );
    assert!(
        !client.is_locked("payout:2").await.unwrap(),
        "the grant was given back"
    );
}

/// What a replication error names: the key, the replicas that acknowledged and
/// were required, and whether the primary's disk had it.
fn shortfall(error: &LockError) -> (&str, usize, usize, Option<bool>) {
    match error {
        LockError::Replication {
            key,
            acknowledged,
            required,
            on_disk,
            ..
        } => (key, *acknowledged, *required, *on_disk),
        other => panic!("expected a replication error, got {other:?}"),
    }
}

/// Whether the server has `WAITAOF` (Redis and Valkey 7.2 and newer).
fn has_waitaof(server: &RedisServer) -> bool {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(|version| {
            let mut parts = version.trim().split('.').map(|part| part.parse::<u32>());
            let (major, minor) = (parts.next(), parts.next());
            matches!((major, minor), (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= (7, 2))
        })
        .unwrap_or(false)
}
