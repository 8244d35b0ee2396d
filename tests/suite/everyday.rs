//! The everyday path: a lock nobody else wants costs Redis what the raw protocol
//! does, and newer servers release and renew it with native commands instead of
//! scripts; a lock somebody waits for still lets them in on release.

use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockInspector, LockOptions};
use lock_tests::RedisServer;
use tokio::time::Instant;

/// Commands a Redis server ran, before and after.
fn calls(redis: &RedisServer, commands: &[&str]) -> Vec<u64> {
    commands
        .iter()
        .map(|command| redis.calls(command))
        .collect()
}

fn ran_since(
    redis: &RedisServer,
    commands: &[&'static str],
    before: &[u64],
) -> Vec<(&'static str, u64)> {
    let after = calls(redis, commands);
    commands
        .iter()
        .zip(after.iter().zip(before))
        .map(|(command, (after, before))| (*command, after - before))
        .collect()
}

/// The server's own compare-and-delete, if it has one: the client looks for
/// `DELIFEQ` (Valkey 9) first, then `DELEX` (Redis 8.4).
fn native_compare_and_delete(redis: &RedisServer) -> Option<&'static str> {
    ["delifeq", "delex"]
        .into_iter()
        .find(|command| redis.has_command(command))
}

#[tokio::test]
async fn an_uncontended_release_is_a_plain_compare_and_delete() {
    let redis = RedisServer::start();
    let native = native_compare_and_delete(&redis);
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new().lease(Duration::from_secs(10));
    let commands = [
        "set", "delifeq", "delex", "evalsha", "get", "del", "zcard", "zrange", "time", "type",
    ];
    let before = calls(&redis, &commands);
    for _ in 0..10 {
        let guard = client.acquire("order:1", &options).await.unwrap();
        guard.release().await.unwrap();
    }
    // The acquire is a `SET NX`; the release the server's own compare-and-delete
    // (`DELIFEQ` on Valkey 9, `DELEX … IFEQ` on Redis 8.4), or else a script that
    // reads the lock and deletes it, as the raw protocol's does: nobody is queued
    // for a lock whose value is its token alone.
    let scripted = u64::from(native.is_none()) * 10;
    let expected: Vec<_> = commands
        .iter()
        .map(|&command| {
            let ran = match command {
                "set" => 10,
                "evalsha" | "get" | "del" => scripted,
                command if Some(command) == native => 10,
                _ => 0,
            };
            (command, ran)
        })
        .collect();
    assert_eq!(ran_since(&redis, &commands, &before), expected);
    assert_eq!(client.lease_left("order:1").await.unwrap(), None);
}

/// Whether a client waits in the queue for `key`.
fn queued(redis: &RedisServer, key: &str) -> bool {
    redis::cmd("ZCARD")
        .arg(format!("lock:{{{key}}}:queue"))
        .query::<u64>(&mut redis.connection())
        .unwrap()
        > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_with_a_client_waiting_renews_it_and_lets_that_client_in() {
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let waiter = LockClient::connect(&redis.url()).await.unwrap();
    let inspector = LockInspector::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new().lease(Duration::from_secs(10));
    let guard = holder.acquire("order:3", &options).await.unwrap();
    let token_held = inspector.lock("order:3").await.unwrap().unwrap().holders[0]
        .token
        .clone();
    let retry_wait = Duration::from_secs(5);
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new()
            .retry_wait(retry_wait)
            .timeout(Duration::from_secs(20));
        waiter.acquire("order:3", &options).await
    });
    while !queued(&redis, "order:3") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The holder's lease goes on, natively renewed or not.
    guard.extend(Duration::from_secs(20)).await.unwrap();
    let seen = inspector.lock("order:3").await.unwrap().unwrap();
    assert!(
        seen.lease_left.unwrap() > Duration::from_secs(15),
        "{seen:?}"
    );
    assert_eq!(seen.holders[0].token, token_held);
    assert_eq!(seen.queue.len(), 1);

    // Its release does not just delete the lock: the waiter is let in at once, not
    // after its pause.
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let handed = waiting.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < retry_wait / 10,
        "the waiter was not let in: {:?}",
        released_at.elapsed()
    );
    assert!(handed.is_held());
    handed.release().await.unwrap();
    assert_eq!(holder.lease_left("order:3").await.unwrap(), None);
    assert!(!queued(&redis, "order:3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_waiters_left_is_renewed_and_released_as_one_nobody_wanted() {
    let redis = RedisServer::start();
    let native_release = native_compare_and_delete(&redis).is_some();
    let native_renewal = has_set_ifeq(&redis);
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let quitter = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new().lease(Duration::from_secs(10));
    let guard = holder.acquire("order:5", &options).await.unwrap();
    // One waiter gives up, another is dropped, as a handler is when its caller
    // hangs up; each marked the lock as waited for when it joined the queue.
    let impatient = LockOptions::new().timeout(Duration::from_millis(200));
    let gave_up = quitter.acquire("order:5", &impatient).await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    // Its place is given up in the background.
    quitter.shutdown().await;
    assert!(!queued(&redis, "order:5"));
    let dropped = {
        let quitter = quitter.clone();
        let patient = LockOptions::new().timeout(Duration::from_secs(20));
        tokio::spawn(async move { quitter.acquire("order:5", &patient).await })
    };
    while !queued(&redis, "order:5") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    quitter.shutdown().await;
    assert!(
        !queued(&redis, "order:5"),
        "the dropped waiter stayed queued"
    );

    // Nobody waits now: the holder's renewal and release are the everyday ones.
    let commands = ["set", "evalsha"];
    let before = calls(&redis, &commands);
    guard.extend(Duration::from_secs(20)).await.unwrap();
    let renewal = u64::from(native_renewal);
    assert_eq!(
        ran_since(&redis, &commands, &before),
        [("set", renewal), ("evalsha", 1 - renewal)]
    );
    let lease_left = holder.lease_left("order:5").await.unwrap().unwrap();
    assert!(lease_left > Duration::from_secs(15), "{lease_left:?}");
    let before = calls(&redis, &commands);
    guard.release().await.unwrap();
    assert_eq!(
        ran_since(&redis, &commands, &before),
        [("set", 0), ("evalsha", u64::from(!native_release))],
        "one compare-and-delete, not a second request the long way"
    );
    assert_eq!(holder.lease_left("order:5").await.unwrap(), None);
}

/// Whether the server takes `SET … IFEQ` (Valkey 8.1, Redis 8.4).
fn has_set_ifeq(redis: &RedisServer) -> bool {
    redis::cmd("SET")
        .arg("probe")
        .arg("1")
        .arg("IFEQ")
        .arg("1")
        .query::<Option<String>>(&mut redis.connection())
        .is_ok()
}

/// `SET`s the server refused, from `INFO commandstats`.
fn refused_sets(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.connection())
        .unwrap();
    let line = info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_set:"))
        .unwrap_or_default();
    line.split(',')
        .filter_map(|field| field.split_once('='))
        .filter(|(name, _)| *name == "failed_calls" || *name == "rejected_calls")
        .map(|(_, count)| count.trim().parse::<u64>().unwrap())
        .sum()
}

#[tokio::test]
async fn a_renewal_of_a_lock_held_alone_needs_no_script_where_the_server_has_set_ifeq() {
    let redis = RedisServer::start();
    let native = has_set_ifeq(&redis);
    let refused = refused_sets(&redis);
    let client = LockClient::connect(&redis.url()).await.unwrap();
    assert_eq!(
        refused_sets(&redis) - refused,
        u64::from(!native),
        "one probe at connect, refused where the server lacks it"
    );
    let options = LockOptions::new().lease(Duration::from_secs(10));
    let guard = client.acquire("order:2", &options).await.unwrap();
    let commands = ["set", "evalsha", "pexpire"];
    let before = calls(&redis, &commands);
    for _ in 0..5 {
        guard.extend(Duration::from_secs(20)).await.unwrap();
    }
    let ran = ran_since(&redis, &commands, &before);
    let lease_left = client.lease_left("order:2").await.unwrap().unwrap();
    assert!(lease_left > Duration::from_secs(15), "{lease_left:?}");
    if native {
        assert_eq!(ran, [("set", 5), ("evalsha", 0), ("pexpire", 0)]);
    } else {
        // Found out at connect: no renewal tries it.
        assert_eq!(ran, [("set", 0), ("evalsha", 5), ("pexpire", 5)]);
    }
    guard.release().await.unwrap();

    // A stale token renews nothing, natively or not.
    let held = client.acquire("order:2", &options).await.unwrap();
    redis::cmd("SET")
        .arg("lock:{order:2}")
        .arg("someone-else")
        .query::<()>(&mut redis.connection())
        .unwrap();
    assert!(held.extend(Duration::from_secs(20)).await.is_err());
}

#[tokio::test]
async fn scripts_the_server_forgot_are_loaded_again() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    // Fencing takes the acquire script; the release is the script's compare-and-delete
    // on Redis 7, the server's own where it has one.
    let options = LockOptions::new()
        .lease(Duration::from_secs(10))
        .fencing(true);
    let first = client.acquire("order:3", &options).await.unwrap();
    let first_token = first.fencing_token().unwrap();
    first.release().await.unwrap();
    // As a restart, a failover or an operator leaves the server.
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut redis.connection())
        .unwrap();
    let loads = redis.calls("script|load");
    let guard = client.acquire("order:3", &options).await.unwrap();
    assert!(guard.fencing_token().unwrap() > first_token);
    guard.release().await.unwrap();
    assert_eq!(
        client.lease_left("order:3").await.unwrap(),
        None,
        "released"
    );
    let native = native_compare_and_delete(&redis).is_some();
    assert_eq!(
        redis.calls("script|load") - loads,
        2 - u64::from(native),
        "each script the server forgot is loaded once"
    );
}
