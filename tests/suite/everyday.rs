//! The everyday path: a lock nobody else wants costs Redis what the raw protocol
//! does, and newer servers renew it with a native command instead of a script.

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use lock_tests::RedisServer;

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

#[tokio::test]
async fn an_uncontended_release_is_a_plain_compare_and_delete() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new().lease(Duration::from_secs(10));
    let commands = [
        "set", "evalsha", "get", "zcard", "del", "zrange", "time", "type",
    ];
    let before = calls(&redis, &commands);
    for _ in 0..10 {
        let guard = client.acquire("order:1", &options).await.unwrap();
        guard.release().await.unwrap();
    }
    // The acquire is a `SET NX`; the release one script that reads the lock, finds
    // no queue and deletes it, and defines none of the functions waiters need.
    assert_eq!(
        ran_since(&redis, &commands, &before),
        [
            ("set", 10),
            ("evalsha", 10),
            ("get", 10),
            ("zcard", 10),
            ("del", 10),
            ("zrange", 0),
            ("time", 0),
            ("type", 0),
        ]
    );
    assert_eq!(client.lease_left("order:1").await.unwrap(), None);
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
