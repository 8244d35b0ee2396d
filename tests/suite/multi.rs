//! Multi-key locks (`LockClient::acquire_all`): all keys or none, one guard for all,
//! and no deadlock between callers that list the same keys in different orders,
//! across clients and across processes.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockOptions};
use lock_tests::{RedisCluster, RedisServer};
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::behaviour::{Fixture, on_every_backend};

on_every_backend!(
    concurrent_transfers_never_deadlock_or_overlap,
    keys_in_different_orders_both_complete,
    duplicate_keys_count_once,
    all_or_nothing,
    release_and_drop_free_every_key,
    refused_inside_a_held_scope,
    every_key_reenters_inside_the_scope,
);

/// Generous: waiting for a key is bounded, and a deadlock shows as `Timeout`.
fn waiting() -> LockOptions {
    LockOptions::new()
        .retry_wait(Duration::from_millis(5))
        .timeout(Duration::from_secs(60))
}

/// Accounts with balances, and a flag per account that a transfer raises while it
/// works on it: raising a raised flag is an overlap.
#[derive(Default)]
struct Bank {
    balances: Mutex<HashMap<&'static str, i64>>,
    in_use: Mutex<HashMap<&'static str, bool>>,
}

impl Bank {
    fn enter(&self, account: &'static str) {
        let was_in_use = self.in_use.lock().unwrap().insert(account, true);
        assert_ne!(
            was_in_use,
            Some(true),
            "two transfers worked on `{account}` at once"
        );
    }

    fn leave(&self, account: &'static str) {
        self.in_use.lock().unwrap().insert(account, false);
    }

    fn balance(&self, account: &'static str) -> i64 {
        self.balances.lock().unwrap()[account]
    }

    fn set(&self, account: &'static str, balance: i64) {
        self.balances.lock().unwrap().insert(account, balance);
    }

    /// Moves `amount` by reading both balances, pausing, then writing both: without
    /// the locks, two transfers that overlap lose one's update.
    async fn transfer(&self, from: &'static str, to: &'static str, amount: i64) {
        self.enter(from);
        self.enter(to);
        let (from_balance, to_balance) = (self.balance(from), self.balance(to));
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.set(from, from_balance - amount);
        self.set(to, to_balance + amount);
        self.leave(from);
        self.leave(to);
    }
}

const DIRECTIONS: [(&str, &str); 4] = [("A", "B"), ("B", "A"), ("B", "C"), ("C", "A")];
const START: i64 = 1_000;

/// What the balances must be after `transfers` transfers of 1 in each direction of
/// `directions`.
fn expected(directions: &[(&str, &str)], transfers: i64) -> HashMap<String, i64> {
    let mut balances: HashMap<String, i64> = ["A", "B", "C"].map(|a| (a.to_owned(), START)).into();
    for (from, to) in directions {
        *balances.get_mut(*from).unwrap() -= transfers;
        *balances.get_mut(*to).unwrap() += transfers;
    }
    balances
}

async fn concurrent_transfers_never_deadlock_or_overlap(fixture: Fixture) {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 4;
    const TRANSFERS: i64 = 20;
    let bank = Arc::new(Bank::default());
    for account in ["A", "B", "C"] {
        bank.set(account, START);
    }
    let mut tasks = Vec::new();
    let mut directions = Vec::new();
    for _ in 0..CLIENTS {
        let client = fixture.connect().await;
        for _ in 0..TASKS_PER_CLIENT {
            let (from, to) = DIRECTIONS[directions.len() % DIRECTIONS.len()];
            directions.push((from, to));
            let (client, bank) = (client.clone(), bank.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..TRANSFERS {
                    let keys = [format!("account:{from}"), format!("account:{to}")];
                    let guard = client.acquire_all(&keys, &waiting()).await.unwrap();
                    assert!(guard.is_held());
                    bank.transfer(from, to, 1).await;
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("every transfer completed");
    }
    let balances = bank.balances.lock().unwrap().clone();
    assert_eq!(balances.values().sum::<i64>(), 3 * START, "{balances:?}");
    for (account, balance) in expected(&directions, TRANSFERS) {
        assert_eq!(balances[account.as_str()], balance, "account {account}");
    }
}

async fn keys_in_different_orders_both_complete(fixture: Fixture) {
    const ROUNDS: usize = 30;
    let spin = |client: LockClient, keys: [&'static str; 3]| {
        tokio::spawn(async move {
            for _ in 0..ROUNDS {
                // The default budget, about a second: a deadlock ends in `Timeout`.
                let guard = client.acquire_all(keys, &LockOptions::new()).await?;
                tokio::time::sleep(Duration::from_millis(1)).await;
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        })
    };
    let started = Instant::now();
    let forward = spin(fixture.client.clone(), ["x", "y", "z"]);
    let backward = spin(fixture.other.clone(), ["z", "y", "x"]);
    let third = spin(fixture.connect().await, ["y", "z", "x"]);
    for spinner in [forward, backward, third] {
        let done = tokio::time::timeout(Duration::from_secs(30), spinner).await;
        done.expect("no deadlock")
            .unwrap()
            .expect("every round took all keys");
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

async fn duplicate_keys_count_once(fixture: Fixture) {
    let guard = fixture
        .client
        .acquire_all(["a", "a"], &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(guard.keys(), ["a"]);
    assert_eq!(guard.key(), "a");
    assert!(
        !fixture.free_elsewhere("a").await,
        "another client sees `a` busy"
    );
    guard.release().await.unwrap();
    assert!(fixture.free_elsewhere("a").await);
}

async fn all_or_nothing(fixture: Fixture) {
    let holder = fixture.hold_elsewhere("b", LockOptions::new()).await;
    let busy = fixture
        .client
        .acquire_all(["b", "a"], &LockOptions::new().spin(false))
        .await;
    assert!(
        matches!(busy, Err(LockError::Busy { ref key, .. }) if key == "b"),
        "{busy:?}"
    );
    assert!(fixture.free_elsewhere("a").await, "`a` was left taken");

    let waited = fixture
        .client
        .acquire_all(
            ["a", "b"],
            &LockOptions::new().timeout(Duration::from_millis(200)),
        )
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { ref key, .. }) if key == "b"),
        "{waited:?}"
    );
    assert!(fixture.free_elsewhere("a").await, "`a` was left taken");

    // Nothing ran under `a`, so its window does not keep it.
    let window = LockOptions::new().hold_at_least(Duration::from_secs(30));
    let busy = fixture
        .client
        .acquire_all(["a", "b"], &window.spin(false))
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    assert!(fixture.free_elsewhere("a").await, "`a` kept for its window");
    holder.release().await.unwrap();
}

async fn release_and_drop_free_every_key(fixture: Fixture) {
    let keys = ["left", "middle", "right"];
    let guard = fixture
        .client
        .acquire_all(keys, &LockOptions::new())
        .await
        .unwrap();
    let mut held = guard.keys();
    held.sort_unstable();
    assert_eq!(held, ["left", "middle", "right"]);
    for key in keys {
        assert!(!fixture.free_elsewhere(key).await, "`{key}` is held");
    }
    guard.release().await.unwrap();
    for key in keys {
        assert!(
            fixture.free_elsewhere(key).await,
            "`{key}` was not released"
        );
    }

    let guard = fixture
        .client
        .acquire_all(keys, &LockOptions::new())
        .await
        .unwrap();
    for key in keys {
        assert!(!fixture.free_elsewhere(key).await, "`{key}` is held");
    }
    drop(guard);
    // Dropping releases in the background; the lease is 30 s.
    for key in keys {
        fixture.time_until_free(key, Duration::from_secs(1)).await;
    }
}

async fn refused_inside_a_held_scope(fixture: Fixture) {
    let client = &fixture.client;
    let empty = client
        .acquire_all(Vec::<String>::new(), &LockOptions::new())
        .await;
    match empty {
        Err(error @ LockError::InvalidOptions { .. }) => {
            assert!(error.to_string().contains("at least one key"), "{error}")
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }

    let outer = client.acquire("cart", &LockOptions::new()).await.unwrap();
    let inside = outer
        .scope(client.acquire_all(["stock", "cart"], &LockOptions::new()))
        .await;
    match inside {
        Err(error @ LockError::InvalidOptions { .. }) => {
            assert!(
                error.to_string().contains("inside a hold of `cart`"),
                "{error}"
            )
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert!(fixture.free_elsewhere("stock").await, "nothing was taken");
    // Another client's scope is no hold of this one's.
    let elsewhere = outer
        .scope(fixture.other.acquire_all(["stock"], &LockOptions::new()))
        .await
        .unwrap();
    elsewhere.release().await.unwrap();
    outer.release().await.unwrap();

    let both = client
        .acquire_all(["a", "b"], &LockOptions::new())
        .await
        .unwrap();
    let nested = both
        .scope(client.acquire_all(["c"], &LockOptions::new()))
        .await;
    assert!(
        matches!(nested, Err(LockError::InvalidOptions { .. })),
        "{nested:?}"
    );
    both.release().await.unwrap();
}

async fn every_key_reenters_inside_the_scope(fixture: Fixture) {
    let client = &fixture.client;
    let options = LockOptions::new();
    let both = client
        .acquire_all(["cart", "stock"], &options)
        .await
        .unwrap();
    let trips = fixture.round_trips();
    both.scope(async {
        for key in ["stock", "cart"] {
            let inner = client.acquire(key, &options).await.unwrap();
            assert_eq!(inner.key(), key);
            inner.release().await.unwrap();
        }
    })
    .await;
    if fixture.counts_round_trips() {
        assert_eq!(fixture.round_trips(), trips, "re-entry asks Redis nothing");
    }
    for key in ["cart", "stock"] {
        assert!(
            !fixture.free_elsewhere(key).await,
            "inner releases keep `{key}`"
        );
    }
    both.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_in_different_cluster_slots() {
    let cluster = RedisCluster::start();
    let slot = |key: &str| -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("lock:{{{key}}}"))
            .query(&mut cluster.servers[0].connection())
            .unwrap()
    };
    let keys = [
        "order:1", "order:2", "order:3", "order:4", "order:5", "order:6",
    ];
    let primaries: Vec<u16> = keys
        .iter()
        .map(|key| cluster.primary_for(slot(key)).port())
        .collect();
    let mut distinct = primaries.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct.len() >= 2,
        "the keys lie on one primary: {primaries:?}"
    );

    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let other = LockClient::cluster(cluster.urls()).await.unwrap();
    let guard = client.acquire_all(keys, &LockOptions::new()).await.unwrap();
    for (key, port) in keys.iter().zip(&primaries) {
        let server = cluster.servers.iter().find(|s| s.port() == *port).unwrap();
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("lock:{{{key}}}"))
            .query(&mut server.connection())
            .unwrap();
        assert!(exists, "`{key}` is held on its slot's primary");
        let busy = other.try_acquire(key, &LockOptions::new()).await.unwrap();
        assert!(busy.is_none(), "`{key}` is held");
    }
    guard.release().await.unwrap();
    for key in keys {
        let free = other.try_acquire(key, &LockOptions::new()).await.unwrap();
        assert!(free.is_some(), "`{key}` was released");
    }
}

/// The central claim across processes: three workers move money between accounts
/// kept in one Redis, in different directions, each transfer a non-atomic
/// read-pause-write under `acquire_all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_across_processes_add_up() {
    const TRANSFERS: i64 = 40;
    let redis = RedisServer::start();
    let mut data = crate::data(&redis).await;
    for account in ["A", "B", "C"] {
        let () = data.set(format!("balance:{account}"), START).await.unwrap();
    }
    let directions = [("A", "B"), ("B", "A"), ("C", "A"), ("B", "C")];
    let workers: Vec<_> = directions
        .iter()
        .map(|(from, to)| {
            Command::new(env!("CARGO_BIN_EXE_transfer-worker"))
                .args([&redis.url(), *from, *to, &TRANSFERS.to_string()])
                .spawn()
                .expect("start a transfer worker")
        })
        .collect();
    let waited = tokio::task::spawn_blocking(move || {
        workers
            .into_iter()
            .map(|mut worker| worker.wait().unwrap())
            .collect::<Vec<_>>()
    });
    let statuses = tokio::time::timeout(Duration::from_secs(60), waited)
        .await
        .expect("the workers finish")
        .unwrap();
    for status in statuses {
        assert!(status.success(), "a worker failed: {status}");
    }
    let mut total = 0;
    for (account, balance) in expected(&directions, TRANSFERS) {
        let stored: i64 = data.get(format!("balance:{account}")).await.unwrap();
        assert_eq!(stored, balance, "account {account}");
        total += stored;
    }
    assert_eq!(total, 3 * START);
}
