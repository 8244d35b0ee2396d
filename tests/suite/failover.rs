//! Failover, on Sentinel and on Cluster: the primary grants a lock its replica
//! never receives, dies, and the replica is promoted. A client that counts a grant
//! only once a replica has it (the default) never believes it holds a lock that
//! the promoted replica then grants to another client, whatever the kind: a lock, a
//! shared hold, a semaphore's permit. A client that opts out with `replicas(0)`
//! does, beside it in the same failover: the fault is real. A planned failover,
//! with the old primary alive throughout, costs no lock held through it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use lock_runtime::history::{History, Holding};
use lock_runtime::{ClientConfig, LockClient, LockError, LockGuard, LockOptions};
use lock_tests::{RedisCluster, RedisServer, SentinelGroup, Shard};
use tokio::task::{JoinHandle, block_in_place};
use tokio::time::Instant;

/// A group whose primary for the test's keys can be failed over.
enum Failover {
    Sentinel(Box<SentinelGroup>),
    Cluster {
        cluster: RedisCluster,
        shard: Shard,
        slot: u16,
    },
}

impl Failover {
    async fn client(&self, config: ClientConfig) -> LockClient {
        match self {
            Failover::Sentinel(group) => {
                LockClient::sentinel_with(group.sentinel_urls(), group.name, config).await
            }
            Failover::Cluster { cluster, .. } => {
                LockClient::cluster_with(cluster.urls(), config).await
            }
        }
        .expect("connect to the healthy group")
    }

    fn cut_off_replica(&mut self) {
        match self {
            Failover::Sentinel(group) => group.cut_off_replica(),
            Failover::Cluster { cluster, shard, .. } => cluster.cut_off_replica(*shard),
        }
    }

    /// Kills the primary, waits until the replica is promoted, and brings the old
    /// primary back as its replica, so that grants can be acknowledged again.
    fn fail_over(&mut self) {
        let at_most = Duration::from_secs(30);
        match self {
            Failover::Sentinel(group) => {
                group.kill_primary();
                group.promote_replica(at_most);
                group.restore_old_primary();
            }
            Failover::Cluster {
                cluster,
                shard,
                slot,
            } => {
                cluster.kill_primary(*shard);
                *shard = cluster.promote_replica(*shard, *slot, at_most);
                cluster.restore_old_primary(*shard);
            }
        }
    }

    /// Every server's role and copy of the keys that hold `key`.
    fn describe(&self, key: &str) -> String {
        let servers: Vec<&RedisServer> = match self {
            Failover::Sentinel(group) => group.servers().collect(),
            Failover::Cluster { cluster, .. } => cluster.servers.iter().collect(),
        };
        let pattern = format!("*{key}*");
        let described = servers.iter().map(|server| server.describe(&pattern));
        described.collect::<Vec<_>>().join(" | ")
    }

    /// A planned failover: the replica takes over while the primary lives on.
    fn switch_over(&mut self) {
        match self {
            Failover::Sentinel(group) => group.switch_over(),
            Failover::Cluster {
                cluster,
                shard,
                slot,
            } => *shard = cluster.switch_over(*shard, *slot),
        }
    }
}

/// A guard granted before the failover, watched until it learns its lock is lost.
struct Believer {
    name: &'static str,
    key: String,
    from: SystemTime,
    lost_at: JoinHandle<(LockGuard, SystemTime)>,
}

impl Believer {
    fn watch(name: &'static str, guard: LockGuard, from: SystemTime) -> Believer {
        Believer {
            name,
            key: guard.key().to_owned(),
            from,
            lost_at: tokio::spawn(async move {
                guard.lost().await;
                (guard, SystemTime::now())
            }),
        }
    }

    /// Its holding as it believed it: until it learned the loss, or until now.
    async fn holding(self) -> Holding {
        let until = if self.lost_at.is_finished() {
            self.lost_at.await.expect("the watcher").1
        } else {
            self.lost_at.abort();
            SystemTime::now()
        };
        Holding {
            holder: self.name.to_owned(),
            key: self.key,
            from: self.from,
            until,
            fence: None,
        }
    }
}

/// Takes `key` after the failover, retrying while the client finds the new
/// primary and while its replica catches up.
async fn acquire_after_failover(
    client: &LockClient,
    key: &str,
    options: &LockOptions,
) -> (LockGuard, SystemTime) {
    let started = Instant::now();
    loop {
        match client.acquire(key, options).await {
            Ok(guard) => return (guard, SystemTime::now()),
            Err(error @ (LockError::Backend { .. } | LockError::Replication { .. })) => {
                assert!(started.elapsed() < Duration::from_secs(20), "{error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("after the failover: {error}"),
        }
    }
}

/// How the first client takes a key before the failover, and how the second takes
/// it after: so that the second holds it alone, and any hold of the first still
/// believed beside it is one holder too many.
struct Kind {
    key: String,
    before: LockOptions,
    after: LockOptions,
    /// How many holds the second takes: a semaphore's every permit.
    holds_after: usize,
}

/// A fixed lease, long enough to outlast the failover: nothing but the failover can
/// end a hold taken before it by the time the second client asks.
fn held_through() -> LockOptions {
    LockOptions::new().lease(Duration::from_secs(60))
}

/// A lock, the lock of a read-write pair taken shared, and one of a semaphore's two
/// permits, on the three `keys`.
fn kinds([lock, shared, permit]: [String; 3]) -> [Kind; 3] {
    let held_through = held_through();
    let exports = held_through.clone().permits(2);
    [
        Kind {
            key: lock,
            before: held_through.clone(),
            after: LockOptions::new(),
            holds_after: 1,
        },
        Kind {
            key: shared,
            before: held_through.clone().shared(true),
            after: LockOptions::new(),
            holds_after: 1,
        },
        Kind {
            key: permit,
            before: exports.clone(),
            after: exports,
            holds_after: 2,
        },
    ]
}

/// The first client's hold on `kind`, taken with the replica cut off: refused for
/// want of the replica, or granted, and then watched.
async fn hold_before(client: &LockClient, kind: &Kind) -> Option<Believer> {
    let asked = Instant::now();
    match client.acquire(&kind.key, &kind.before).await {
        Err(LockError::Replication {
            key: named,
            acknowledged,
            required,
            ..
        }) => {
            assert_eq!(named, kind.key);
            assert_eq!((acknowledged, required), (0, 1));
            None
        }
        Ok(guard) => Some(Believer::watch("first", guard, SystemTime::now())),
        Err(error) => panic!(
            "`{}` with the replica cut off, after {:?}: {error}",
            kind.key,
            asked.elapsed()
        ),
    }
}

async fn no_two_believed_holders_after_a_failover(
    mut failover: Failover,
    keys: [String; 3],
    control_key: &str,
) {
    let first = failover.client(ClientConfig::new()).await;
    let opted_out = failover.client(ClientConfig::new().replicas(0)).await;
    let second = failover.client(ClientConfig::new()).await;

    // A healthy group grants at once, replica sync included. The bound is loose on
    // purpose: it tells a grant from one that waited out the replica timeout.
    for client in [&first, &second] {
        let asked = Instant::now();
        let guard = client
            .acquire("warm-up", &LockOptions::new())
            .await
            .unwrap();
        let took = asked.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "an uncontended grant took {took:?}"
        );
        guard.release().await.unwrap();
    }

    let kinds = kinds(keys);
    block_in_place(|| failover.cut_off_replica());
    // Joined in one task, so that their confirmations share rounds: on Cluster, one
    // `WAIT` for the primary's slots, not one each waiting out the last in turn.
    let [lock, shared, permit] = &kinds;
    let protected = tokio::join!(
        hold_before(&first, lock),
        hold_before(&first, shared),
        hold_before(&first, permit)
    );
    let protected = [protected.0, protected.1, protected.2];
    let unprotected = opted_out
        .acquire(control_key, &held_through().spin(false))
        .await
        .expect("without replica sync, a grant needs no replica");
    let unprotected = Believer::watch("opted out", unprotected, SystemTime::now());

    block_in_place(|| failover.fail_over());
    let mut after = Vec::new();
    for kind in &kinds {
        let mut holds = Vec::new();
        for _ in 0..kind.holds_after {
            holds.push(acquire_after_failover(&second, &kind.key, &kind.after).await);
        }
        after.push(holds);
    }
    let (control_after, control_from) =
        acquire_after_failover(&second, control_key, &LockOptions::new()).await;

    let history = History::new();
    let control = History::new();
    for believer in protected.into_iter().flatten() {
        history.record(believer.holding().await);
    }
    control.record(unprotected.holding().await);
    let now = SystemTime::now();
    // The second's holds of a key, all of them together, as one: it holds the key
    // whole from its last grant.
    for (kind, holds) in kinds.iter().zip(&after) {
        let from = holds.iter().map(|(_, from)| *from).max().expect("a hold");
        let holder = match kind.holds_after {
            1 => "second".to_owned(),
            permits => format!("second, with all {permits} permits"),
        };
        history.record(Holding {
            holder,
            key: kind.key.clone(),
            from,
            until: now,
            fence: None,
        });
    }
    control.record(Holding {
        holder: "second".into(),
        key: control_key.to_owned(),
        from: control_from,
        until: now,
        fence: None,
    });
    if let Err(violation) = history.check() {
        panic!("two believed holders after the failover: {violation}");
    }
    assert!(
        control.check().is_err(),
        "the failover lost no unreplicated grant, so this test proves nothing"
    );
    for (guard, _) in after.into_iter().flatten() {
        guard.release().await.unwrap();
    }
    control_after.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_never_leaves_two_believed_holders_after_a_failover() {
    let group = SentinelGroup::start(Duration::from_secs(1));
    let keys = ["payroll", "readers", "exports"].map(str::to_owned);
    no_two_believed_holders_after_a_failover(Failover::Sentinel(Box::new(group)), keys, "invoices")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_never_leaves_two_believed_holders_after_a_failover() {
    let cluster = RedisCluster::start();
    let key = "payroll";
    let slot = cluster.slot_of(key);
    let shard = cluster.shard_for(slot);
    // Every key on the same primary, so that one failover covers them all.
    let on_the_same_primary = |stem: &str| {
        (0..)
            .map(|n| format!("{stem}-{n}"))
            .find(|name| cluster.shard_for(cluster.slot_of(name)) == shard)
            .expect("a name on the same primary")
    };
    let keys = [
        key.to_owned(),
        on_the_same_primary("readers"),
        on_the_same_primary("exports"),
    ];
    let control_key = on_the_same_primary("invoices");
    let failover = Failover::Cluster {
        cluster,
        shard,
        slot,
    };
    no_two_believed_holders_after_a_failover(failover, keys, &control_key).await;
}

/// The primary dies while grants it made wait for its replica, which is cut off.
/// redis-rs sends a request for a node it cannot reach to another node, where a
/// `WAIT` has none of its connection's writes to wait for and returns at once: that
/// must not count as the replica having a grant. Eight keys in eight slots, each
/// confirmed with a `WAIT` of its own, each of which may go astray.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_counts_no_grant_whose_primary_died_while_its_replica_was_asked() {
    let mut cluster = RedisCluster::start();
    let shard = cluster.shard_for(cluster.slot_of("payroll"));
    let keys: Vec<String> = (0..)
        .map(|n| format!("payroll-{n}"))
        .filter(|key| cluster.shard_for(cluster.slot_of(key)) == shard)
        .take(8)
        .collect();
    let config = ClientConfig::new().replica_timeout(Duration::from_secs(2));
    let client = LockClient::cluster_with(cluster.urls(), config)
        .await
        .expect("connect to the healthy Cluster");
    let warm_up = client.acquire("warm-up", &LockOptions::new()).await;
    warm_up.unwrap().release().await.unwrap();

    block_in_place(|| cluster.cut_off_replica(shard));
    let mut asking = tokio::task::JoinSet::new();
    for key in keys {
        let client = client.clone();
        asking.spawn(async move {
            let once = LockOptions::new().fencing(true).spin(false);
            (client.acquire(&key, &once).await, key)
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    block_in_place(|| cluster.kill_primary(shard));
    while let Some(asked) = asking.join_next().await {
        if let (Ok(guard), key) = asked.unwrap() {
            panic!(
                "`{key}` granted (token {:?}) though the only replica never had it",
                guard.fencing_token()
            );
        }
    }
}

/// A planned failover, as an operator makes one before maintenance, costs no lock.
/// A lock held through it, on a lease shorter than the switch takes, is kept by its
/// watchdog; a client waiting for it meanwhile gets it once it is released, with a
/// greater fencing token; and two clients taking turns on another key go on
/// throughout, never together, each section granted within its budget.
async fn a_planned_failover_loses_no_lock(mut failover: Failover, key: &str, busy_key: &str) {
    let holder = failover.client(ClientConfig::new()).await;
    let waiter = failover.client(ClientConfig::new()).await;
    let lease = Duration::from_secs(9);
    let options = LockOptions::new().lease(lease).watchdog(true).fencing(true);
    let held = holder.acquire(key, &options).await.unwrap();
    let first_token = held.fencing_token().expect("a fencing token");
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.to_owned());
        let options = options.clone().timeout(Duration::from_secs(120));
        tokio::spawn(async move { waiter.acquire(&key, &options).await })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let turns = [(holder.clone(), "holder"), (waiter, "waiter")].map(|(client, name)| {
        let turns = taking_turns(client, name, busy_key.to_owned(), stop.clone());
        (name, tokio::spawn(turns))
    });

    // Sections before the switch, so that the pause it makes is measured from one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let switching = Instant::now();
    block_in_place(|| failover.switch_over());
    let switched_in = switching.elapsed();
    tokio::time::sleep(lease).await;
    stop.store(true, Ordering::Relaxed);
    let mut sections = Vec::new();
    for (name, turns) in turns {
        match turns.await.expect("the turns' task") {
            Ok(taken) => sections.extend(taken),
            Err(error) => panic!(
                "the {name}'s section: {error}; {busy_key} now: {}",
                failover.describe(busy_key)
            ),
        }
    }
    let history = History::new();
    sections
        .iter()
        .cloned()
        .for_each(|held| history.record(held));
    history
        .check()
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert!(
        held.is_held(),
        "the lock held through a planned failover of {switched_in:?} was lost"
    );
    assert!(
        !waiting.is_finished(),
        "the waiter's acquire ended while the lock was held: {:?}",
        waiting.await
    );
    held.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter got the lock within 5 s of its release")
        .unwrap()
        .expect("the waiter got the lock");
    assert!(next.fencing_token().expect("a fencing token") > first_token);
    next.release().await.unwrap();

    sections.sort_by_key(|section| section.from);
    let longest_pause = sections
        .windows(2)
        .filter_map(|pair| pair[1].from.duration_since(pair[0].until).ok())
        .max()
        .unwrap_or_default();
    eprintln!(
        "a planned failover of {switched_in:?}: {} sections, the longest pause between two \
         {longest_pause:?}",
        sections.len()
    );
}

/// `client`'s sections on `key`, each granted within its budget, until `stop`; or
/// the first that was not.
async fn taking_turns(
    client: LockClient,
    name: &'static str,
    key: String,
    stop: Arc<AtomicBool>,
) -> Result<Vec<Holding>, LockError> {
    let options = LockOptions::new().timeout(Duration::from_secs(10));
    let mut sections = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let guard = client.acquire(&key, &options).await?;
        let from = SystemTime::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let until = SystemTime::now();
        if guard.is_held() {
            sections.push(Holding {
                holder: name.to_owned(),
                key: key.clone(),
                from,
                until,
                fence: None,
            });
        }
        let _ = guard.release().await;
    }
    Ok(sections)
}

/// With two replicas: the Sentinels move the one they do not promote to the new
/// primary as they fail over, so that grants are confirmed there at once. (With
/// one, the new primary has no replica until they demote the old primary, some
/// 10 s later, and no grant is confirmed meanwhile.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_loses_no_lock_in_a_planned_failover() {
    let group = SentinelGroup::start_with_replicas(Duration::from_secs(1), 2);
    a_planned_failover_loses_no_lock(Failover::Sentinel(Box::new(group)), "payroll", "invoices")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_loses_no_lock_in_a_planned_failover() {
    let cluster = RedisCluster::start();
    let key = "payroll";
    let slot = cluster.slot_of(key);
    let shard = cluster.shard_for(slot);
    let failover = Failover::Cluster {
        cluster,
        shard,
        slot,
    };
    a_planned_failover_loses_no_lock(failover, key, "{payroll}:invoices").await;
}
