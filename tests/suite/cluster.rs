//! A Redis Cluster of three primaries and three replicas: lock traffic keeps its
//! guarantees while the lock's slot migrates to another primary, and the client
//! connects, goes on locking the other slots, and reloads the scripts a primary lost
//! while one primary is silent; a lock is confirmed where its slot moved, and so are
//! those confirmed beside it; a client that connects while a replica is down waits
//! for it, and one that connects after a failover, for the old primary; a failover
//! from a primary gone silent is followed while it stays silent, by requests and by
//! waiters. A Cluster of one node, which lists itself with no address, serves locks
//! as well.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use lock_runtime::history::History;
use lock_runtime::{ClientConfig, LockClient, LockInspector, LockOptions};
use lock_tests::{RedisCluster, RedisServer, Shard};
use redis::AsyncCommands;
use tokio::task::block_in_place;

use crate::{assert_refused_unreplicated, once_settled};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locking_runs_on_while_the_slot_migrates() {
    let cluster = Arc::new(RedisCluster::start());
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let mut data = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    // The counter shares the lock's hash tag, so it migrates with the lock.
    let counter = "{stock}:count";
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(counter)
        .query(&mut cluster.servers[0].connection())
        .unwrap();
    let () = data.set(counter, 0).await.unwrap();

    let migrated = Arc::new(AtomicBool::new(false));
    let history = Arc::new(History::new());
    let options = LockOptions::new()
        .fencing(true)
        .retry_wait(Duration::from_millis(5))
        .timeout(Duration::from_secs(30));
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let (client, mut data, options) = (client.clone(), data.clone(), options.clone());
            let (migrated, history) = (migrated.clone(), history.clone());
            tokio::spawn(async move {
                let mut sections = 0u64;
                // Keep going until the move is done, then a little longer, on the new owner.
                let mut after_move = 0;
                while after_move < 20 {
                    let guard = client
                        .acquire("stock", &options)
                        .await
                        .expect("acquire while migrating");
                    let from = SystemTime::now();
                    let count: i64 = data.get(counter).await.unwrap();
                    let () = data.set(counter, count + 1).await.unwrap();
                    history.record_guard(format!("worker {worker}"), &guard, from);
                    guard.release().await.expect("release while migrating");
                    sections += 1;
                    if migrated.load(Ordering::SeqCst) {
                        after_move += 1;
                    }
                }
                sections
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(100)).await;
    let moving = cluster.clone();
    tokio::task::spawn_blocking(move || {
        move_elsewhere(&moving, slot);
    })
    .await
    .unwrap();
    let new_owner = cluster.primary_for(slot).port();
    migrated.store(true, Ordering::SeqCst);

    let mut sections = 0;
    for worker in workers {
        sections += worker.await.unwrap();
    }
    let count: i64 = data.get(counter).await.unwrap();
    assert_eq!(count as u64, sections, "every section counted once");
    assert_eq!(
        history.check(),
        Ok(sections as usize),
        "holders overlapped or tokens went back"
    );
    let lock_calls_on_new_owner = cluster
        .servers
        .iter()
        .find(|server| server.port() == new_owner)
        .unwrap()
        .lock_calls();
    assert!(
        lock_calls_on_new_owner >= 20 * 8,
        "the lock followed its slot"
    );
}

/// The client connects while one primary is silent (its host gone without a word),
/// and locks whose slots other primaries serve are granted. Its two Cluster
/// connections (one waits for replicas) are made side by side, each waiting for the
/// silent node twice: connecting to the listed nodes, then to the slot map's. The
/// silent primary also serves the key the client asks at connect which commands the
/// servers have, which costs a command timeout more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_connects_with_one_primary_silent() {
    let cluster = RedisCluster::start();
    let silent = &cluster.servers[0];
    let key = a_key(&cluster, |primary| primary != silent.port());
    let config = ClientConfig::new()
        .connect_timeout(Duration::from_secs(1))
        .command_timeout(Duration::from_secs(1));
    silent.freeze();
    let started = Instant::now();
    let connected = LockClient::cluster_with(cluster.urls(), config.clone()).await;
    let connecting = started.elapsed();
    let options = LockOptions::new();
    let granted = match &connected {
        Ok(client) => Some(once_settled(|| client.acquire(&key, &options)).await),
        Err(_) => None,
    };
    let inspected = match LockInspector::cluster_with(cluster.urls(), config).await {
        Ok(inspector) => once_settled(|| inspector.lock(&key))
            .await
            .map(|state| state.is_some()),
        Err(error) => Err(error),
    };
    silent.thaw();
    let client = connected.unwrap();
    granted.unwrap().unwrap().release().await.unwrap();
    assert!(
        inspected.unwrap(),
        "the inspector did not see the lock held"
    );
    assert!(
        connecting < Duration::from_secs(4),
        "connecting took {connecting:?} on 1 s bounds, with one primary silent"
    );
    client.shutdown().await;
}

/// While one primary is silent and calls for its slots time out, locks on the other
/// primaries' slots go on being granted: none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_other_slots_go_on_while_one_primary_is_silent() {
    let cluster = RedisCluster::start();
    let silent = &cluster.servers[0];
    let stuck = a_key(&cluster, |primary| primary == silent.port());
    let healthy = a_key(&cluster, |primary| primary != silent.port());
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let guard = client.acquire(&stuck, &LockOptions::new()).await.unwrap();
    guard.release().await.unwrap();

    silent.freeze();
    let timing_out = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut failed = 0;
            for _ in 0..3 {
                failed += client.acquire(&stuck, &LockOptions::new()).await.is_err() as usize;
            }
            failed
        })
    };
    let (started, mut granted) = (Instant::now(), 0);
    while started.elapsed() < Duration::from_secs(5) {
        let guard = client.acquire(&healthy, &LockOptions::new()).await;
        guard.unwrap().release().await.unwrap();
        granted += 1;
    }
    let failed_on_the_silent_primary = timing_out.await.unwrap();
    silent.thaw();
    // The third may reach the replica promoted meanwhile.
    assert!(
        failed_on_the_silent_primary >= 2,
        "its slots were reachable after all"
    );
    assert!(granted > 100, "only {granted} grants on other slots in 5 s");
}

/// A primary that lost its scripts (a restart, `SCRIPT FLUSH`) is given them again
/// while another primary is silent: the reload goes to the primary that asked for
/// it, not to every primary, which would wait on the silent one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_lost_by_one_primary_are_loaded_again_while_another_is_silent() {
    let cluster = RedisCluster::start();
    let silent = &cluster.servers[0];
    let key = a_key(&cluster, |primary| primary != silent.port());
    let config = ClientConfig::new().command_timeout(Duration::from_secs(1));
    let client = LockClient::cluster_with(cluster.urls(), config)
        .await
        .unwrap();
    let forgetful = cluster.primary_for(cluster.slot_of(&key));
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut forgetful.connection())
        .unwrap();

    silent.freeze();
    let fenced = LockOptions::new().fencing(true);
    let granted = client.acquire(&key, &fenced).await;
    silent.thaw();
    granted.unwrap().release().await.unwrap();
    client.shutdown().await;
}

/// A client that took a lock before its slot moved takes it again after, where the
/// slot went, and each grant is confirmed with the replica of the primary that made
/// it: the check and the `WAIT` go together, and the script that checks is loaded on
/// each primary the first time it is missing there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_confirmed_where_its_slot_moved() {
    let cluster = RedisCluster::start();
    let key = "invoice:moving";
    let slot = cluster.slot_of(key);
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let once = LockOptions::new().spin(false);
    let guard = client.acquire(key, &once).await.unwrap();
    guard.release().await.unwrap();

    let to = move_elsewhere(&cluster, slot);
    let calls_before = to.lock_calls();
    let granted = client.acquire(key, &once).await;
    let guard = granted.expect("granted and confirmed where the slot moved");
    assert!(to.lock_calls() > calls_before, "granted on the new owner");
    guard.release().await.unwrap();
    client.shutdown().await;
}

/// The client lists which primary serves each slot, so that one `WAIT` covers each
/// primary's grants. Once a slot moves the list is wrong until read again, and the
/// moved slot's check, sent to its old primary beside those of slots that stayed,
/// is sent on: their grants are confirmed all the same, at the first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_beside_one_whose_slot_moved_are_confirmed() {
    let cluster = RedisCluster::start();
    let moving = "invoice:moving";
    let slot = cluster.slot_of(moving);
    let from = cluster.primary_for(slot).port();
    let mut keys: Vec<String> = (0..)
        .map(|n| format!("invoice:staying-{n}"))
        .filter(|key| {
            let staying = cluster.slot_of(key);
            staying != slot && cluster.primary_for(staying).port() == from
        })
        .take(8)
        .collect();
    keys.push(moving.to_owned());
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let once = LockOptions::new().spin(false);
    for key in &keys {
        client
            .acquire(key, &once)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    move_elsewhere(&cluster, slot);
    for _ in 0..3 {
        let mut asking = tokio::task::JoinSet::new();
        for key in keys.clone() {
            let (client, once) = (client.clone(), once.clone());
            asking.spawn(async move { (client.acquire(&key, &once).await, key) });
        }
        while let Some(asked) = asking.join_next().await {
            let (granted, key) = asked.unwrap();
            let guard = granted.unwrap_or_else(|error| panic!("`{key}` refused: {error:?}"));
            guard.release().await.unwrap();
        }
    }
    client.shutdown().await;
}

/// A client that connects while the replica of its lock's primary has failed (the
/// other nodes flag it `fail`, and `CLUSTER SLOTS` leaves it out) waits for a
/// replica there all the same, as a client connected before does: granting without
/// one, it would be the client whose grants a failover after the replica's return
/// could lose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_connects_while_a_replica_has_failed_waits_for_one() {
    let cluster = RedisCluster::start();
    let key = "invoice:unreplicated";
    let shard = cluster.shard_for(cluster.slot_of(key));
    let replica = &cluster.servers[shard.replica];
    replica.freeze();
    block_in_place(|| cluster.wait_until_flagged_failed(replica));
    let config = ClientConfig::new().replica_timeout(Duration::from_millis(100));
    let connected = LockClient::cluster_with(cluster.urls(), config).await;
    let granted = match &connected {
        Ok(client) => Some(client.acquire(key, &LockOptions::new().spin(false)).await),
        Err(_) => None,
    };
    replica.thaw();
    let client = connected.unwrap();
    let granted = granted.unwrap();
    assert_refused_unreplicated(&granted);
    client.shutdown().await;
}

/// A client that connects after a failover, while the old primary is down and not
/// yet back as the new one's replica, waits for it as for any replica that is down.
/// The nodes list the old primary then as a failed primary, not a replica: in the
/// promoted one's shard on Redis 7.2 and newer, apart with no slots on 7.0. Counting
/// none there, a client granted on that shard unconfirmed until it counted again, and
/// a second failover in that time granted its locks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_connects_before_the_old_primary_is_back_waits_for_it() {
    let mut cluster = RedisCluster::start();
    let key = "invoice:after-failover";
    let slot = cluster.slot_of(key);
    let shard = cluster.shard_for(slot);
    cluster.kill_primary(shard);
    let shard = block_in_place(|| cluster.promote_replica(shard, slot, Duration::from_secs(30)));
    let config = ClientConfig::new().replica_timeout(Duration::from_millis(100));
    let client = LockClient::cluster_with(cluster.urls(), config)
        .await
        .unwrap();
    let granted = client.acquire(key, &LockOptions::new().spin(false)).await;
    assert_refused_unreplicated(&granted);
    block_in_place(|| cluster.restore_old_primary(shard));
    let options = LockOptions::new().timeout(Duration::from_secs(5));
    let guard = client.acquire(key, &options).await;
    guard
        .expect("granted, confirmed by the old primary as a replica")
        .release()
        .await
        .unwrap();
    client.shutdown().await;
}

/// A primary whose host goes without a word (no reset: its connections stay open and
/// silent, as when a host loses power or drops off the network) is failed over by the
/// Cluster, and the client follows while it stays silent: locks on its slots are
/// granted by the promoted replica, and confirmed with the shard's other replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_gone_silent_is_followed_to_the_replica_promoted() {
    let key = "invoice:silent";
    let (cluster, ..) = a_shard_to_silence(key);
    follows_a_silent_primary(&cluster, &cluster.urls(), ClientConfig::new(), key).await;
}

/// A Cluster of one node, which lists itself with no address (as a node that never
/// met another does): two clients keep a hot key's sections apart, with growing
/// tokens, and lock again once the node, silent for a while, answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_one_node_that_lists_no_address_locks() {
    let cluster = RedisCluster::start_alone();
    let config = quick_to_see_silence(ClientConfig::new());
    let mut clients = Vec::new();
    for _ in 0..2 {
        let client = LockClient::cluster_with(cluster.urls(), config.clone()).await;
        clients.push(client.expect("a client of a one-node Cluster"));
    }
    let history = Arc::new(History::new());
    let options = LockOptions::new()
        .fencing(true)
        .timeout(Duration::from_secs(10));
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let (client, history) = (clients[task % 2].clone(), history.clone());
            let options = options.clone();
            tokio::spawn(async move {
                for _ in 0..25 {
                    let guard = client.acquire("alone", &options).await.unwrap();
                    let from = SystemTime::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    history.record_guard(format!("task {task}"), &guard, from);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(history.check().unwrap(), 200);

    let node = &cluster.servers[0];
    node.freeze();
    let while_silent = clients[0]
        .acquire("alone", &options.clone().timeout(Duration::from_secs(1)))
        .await;
    node.thaw();
    assert!(while_silent.is_err(), "granted by a frozen node");
    let answered = Instant::now();
    let guard = loop {
        match clients[1].acquire("alone", &options).await {
            Ok(guard) => break guard,
            Err(error) if answered.elapsed() > Duration::from_secs(10) => {
                panic!("no grant 10 s after the node answered again: {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    guard.release().await.unwrap();
}

/// `config` with the bounds of a client that meets a silent primary: a request to
/// it is given up on after 500 ms, and a connection to it after 5 s, longer than
/// following a failover from it should take.
pub(crate) fn quick_to_see_silence(config: ClientConfig) -> ClientConfig {
    config
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(SILENT_NODE_CONNECT_TIMEOUT)
}

const SILENT_NODE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Freezes `cluster`'s primary of `key` until a replica has taken its slot over, and
/// has a client of `urls` lock `key` there meanwhile: granted within the connect
/// timeout of the failover, since the client's new connections start from the
/// primaries the nodes list, reached as its URLs say (credentials, TLS), not from
/// the URLs, one of which is the silent node.
pub(crate) async fn follows_a_silent_primary(
    cluster: &RedisCluster,
    urls: &[String],
    config: ClientConfig,
    key: &str,
) {
    let slot = cluster.slot_of(key);
    let shard = cluster.shard_for(slot);
    let client = LockClient::cluster_with(urls, quick_to_see_silence(config))
        .await
        .unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(1));
    let guard = client.acquire(key, &options).await.unwrap();
    guard.release().await.unwrap();

    let silent = &cluster.servers[shard.primary];
    silent.freeze();
    block_in_place(|| cluster.wait_until_failed_over(shard.primary, slot, Duration::from_secs(30)));
    let failed_over = Instant::now();
    let granted = loop {
        match client.acquire(key, &options).await {
            Ok(guard) => break Ok(guard),
            Err(_) if failed_over.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => break Err(error),
        }
    };
    let following = failed_over.elapsed();
    silent.thaw();
    let guard = granted.unwrap_or_else(|error| {
        panic!("no lock granted 15 s after the failover, the old primary silent: {error}")
    });
    guard.release().await.unwrap();
    client.shutdown().await;
    assert!(
        following < SILENT_NODE_CONNECT_TIMEOUT,
        "granted {following:?} after the failover: the client waited out the connect \
         timeout on the silent node"
    );
    eprintln!("granted {following:?} after the failover");
}

/// A client that waits for a lock on a primary gone silent hears its release from the
/// replica promoted: once the client finds the failover, its subscriber follows as
/// its requests do, subscribes there again, and wakes the waiters. Else a waiter
/// would learn of the release only by asking again, after `retry_wait` or the
/// holder's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_the_release_on_the_replica_promoted_from_a_silent_primary() {
    let key = "invoice:heard";
    let (cluster, slot, shard) = a_shard_to_silence(key);
    let config = quick_to_see_silence(ClientConfig::new());
    let silent = &cluster.servers[shard.primary];
    let nudge = a_key(&cluster, |primary| primary == silent.port());
    let holder = LockClient::cluster_with(cluster.urls(), config.clone());
    let waiter = LockClient::cluster_with(cluster.urls(), config);
    let (holder, waiter) = (holder.await.unwrap(), waiter.await.unwrap());
    let fixed = LockOptions::new().lease(Duration::from_secs(30));
    let held = holder.acquire(key, &fixed).await.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        let patient = LockOptions::new()
            .retry_wait(Duration::from_secs(20))
            .timeout(Duration::from_secs(25));
        tokio::spawn(async move {
            let guard = waiter.acquire(key, &patient).await;
            (guard, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    silent.freeze();
    block_in_place(|| cluster.wait_until_failed_over(shard.primary, slot, Duration::from_secs(30)));
    // Each client finds the failover once a call to the silent primary runs out of
    // time, and then makes its connections anew from the primaries listed.
    let at_once = LockOptions::new().spin(false);
    for client in [&holder, &waiter] {
        let found = Instant::now();
        let guard = loop {
            match client.acquire(&nudge, &at_once).await {
                Err(_) if found.elapsed() < Duration::from_secs(15) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                guard => break guard,
            }
        };
        guard.unwrap().release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (granted, at) = waiting.await.unwrap();
    silent.thaw();
    let guard = granted.unwrap_or_else(|error| panic!("the waiter got no lock: {error}"));
    assert!(
        at > released,
        "the waiter was granted the lock while it was held"
    );
    let heard_in = at - released;
    assert!(
        heard_in < Duration::from_secs(3),
        "the waiter got the lock {heard_in:?} after the release"
    );
    eprintln!("heard {heard_in:?} after the release");
    guard.release().await.unwrap();
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// A Cluster whose shard serving `key` has a second replica, so that the replica
/// promoted from it has one of its own to confirm grants with; `key`'s slot, and
/// that shard.
fn a_shard_to_silence(key: &str) -> (RedisCluster, u16, Shard) {
    let mut cluster = RedisCluster::start();
    let slot = cluster.slot_of(key);
    let shard = cluster.shard_for(slot);
    block_in_place(|| cluster.add_replica(shard.primary));
    (cluster, slot, shard)
}

/// Migrates `slot` to a primary other than the one serving it; returns that primary.
fn move_elsewhere(cluster: &RedisCluster, slot: u16) -> &RedisServer {
    let from = cluster.primary_for(slot).port();
    let to = cluster
        .primaries()
        .into_iter()
        .find(|primary| primary.port() != from)
        .expect("another primary");
    cluster.migrate_slot(slot, to);
    to
}

/// A key whose slot is served by a primary whose port `served` accepts.
fn a_key(cluster: &RedisCluster, served: impl Fn(u16) -> bool) -> String {
    (0..)
        .map(|n| format!("invoice:{n}"))
        .find(|key| served(cluster.primary_for(cluster.slot_of(key)).port()))
        .expect("every primary serves some slot")
}
