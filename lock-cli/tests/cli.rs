//! `locks` run as an operator runs it, against real servers in which clients hold
//! and wait for locks of every kind.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockGuard, LockKey, LockOptions};
use lock_tests::{RedisCluster, RedisServer, SentinelGroup};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

/// Runs `locks` with `args`, answering `answer` if it asks, with no `REDIS_URL`.
async fn locks_answering(args: &[&str], answer: &str) -> Output {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_locks"))
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run locks");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(answer.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("locks ended within 20 s")
        .expect("locks ran");
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("panicked"),
        "locks {args:?} panicked: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

async fn locks(args: &[&str]) -> Output {
    locks_answering(args, "").await
}

/// The standard output of a run that must succeed.
async fn printed(args: &[&str]) -> String {
    let output = locks(args).await;
    assert!(
        output.status.success(),
        "locks {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

async fn printed_json(args: &[&str]) -> Value {
    serde_json::from_str(&printed(args).await).expect("JSON output")
}

/// The one line of error of a run that must fail.
fn refusal(output: &Output) -> String {
    assert!(!output.status.success(), "succeeded: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line of error: {stderr}");
    assert!(lines[0].starts_with("locks: "), "{stderr}");
    lines[0].to_owned()
}

/// A task of `client` that waits for `key` and holds it once it has it.
fn waiter(client: &LockClient, key: &str) -> JoinHandle<LockGuard> {
    let (client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move {
        let patient = LockOptions::new().timeout(Duration::from_secs(30));
        client
            .acquire(&key, &patient)
            .await
            .expect("the waiter gets the lock")
    })
}

fn query<T: redis::FromRedisValue>(redis: &RedisServer, command: &mut redis::Cmd) -> T {
    command
        .query(&mut redis.connection())
        .expect("a test query")
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn line_of<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find(|line| line.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no line for {key} in:\n{text}"))
}

fn entry<'a>(list: &'a Value, key: &str) -> &'a Value {
    list.as_array()
        .expect("an array")
        .iter()
        .find(|lock| lock["key"] == key)
        .unwrap_or_else(|| panic!("no {key} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_shows_and_unlocks_every_kind_of_lock() {
    let redis = RedisServer::start();
    let url = redis.url();
    let first = LockClient::connect(&url).await.unwrap();
    let second = LockClient::connect(&url).await.unwrap();
    let third = LockClient::connect(&url).await.unwrap();
    let plain = LockOptions::new();
    let shared = LockOptions::new().shared(true);
    let permits = LockOptions::new().permits(3);
    let escaped = LockKey::new("tenant").part("{eu}:x").into_string();
    let held = vec![
        first
            .acquire("order:42", &LockOptions::new().fencing(true))
            .await
            .unwrap(),
        first.acquire("catalog", &shared).await.unwrap(),
        second.acquire("catalog", &shared).await.unwrap(),
        first.acquire("exports", &permits).await.unwrap(),
        second.acquire("exports", &permits).await.unwrap(),
        third.acquire(&escaped, &plain).await.unwrap(),
        third.acquire("job:nightly", &plain).await.unwrap(),
    ];
    let next = waiter(&second, "order:42");
    let queue = "lock:{order:42}:queue";
    until("the second client never queued", || {
        query::<usize>(&redis, redis::cmd("ZCARD").arg(queue)) == 1
    })
    .await;
    let last = waiter(&third, "order:42");
    until("the third client never queued", || {
        query::<usize>(&redis, redis::cmd("ZCARD").arg(queue)) == 2
    })
    .await;
    // A companion key of another feature is no lock of its own.
    let () = query(
        &redis,
        redis::cmd("SET").arg("lock:{order:42}:synced").arg(1),
    );

    let listed = printed(&["--url", &url, "ls"]).await;
    assert_eq!(listed.lines().count(), 5, "{listed}");
    let order = line_of(&listed, "order:42");
    for told in ["lock", "2 waiting", "fence 1"] {
        assert!(order.contains(told), "{order}");
    }
    let renewed = ["lease 30.0s", "lease 29.", "lease 28."];
    assert!(renewed.iter().any(|lease| order.contains(lease)), "{order}");
    assert!(
        line_of(&listed, "catalog").contains("shared ×2  "),
        "{listed}"
    );
    assert!(
        line_of(&listed, "exports").contains("semaphore 2/3"),
        "{listed}"
    );
    assert!(line_of(&listed, &escaped).contains("0 waiting"), "{listed}");
    assert!(line_of(&listed, "catalog").contains("fence -"), "{listed}");
    let prefixed = printed(&["--url", &url, "ls", "order"]).await;
    assert_eq!(prefixed.lines().count(), 1, "{prefixed}");
    assert_eq!(printed(&["--url", &url, "ls", "none:"]).await, "");

    let list = printed_json(&["--url", &url, "ls", "--json"]).await;
    assert_eq!(list.as_array().unwrap().len(), 5, "{list}");
    let order = entry(&list, "order:42");
    assert_eq!(order["kind"], "lock");
    assert_eq!(order["holders"], 1);
    assert_eq!(order["waiters"], 2);
    assert_eq!(order["fence"], 1);
    let lease = order["lease_left_ms"].as_u64().unwrap();
    assert!((20_000..=30_000).contains(&lease), "{order}");
    let exports = entry(&list, "exports");
    assert_eq!(
        (&exports["kind"], &exports["permits"], &exports["holders"]),
        (&"semaphore".into(), &3.into(), &2.into())
    );
    let catalog = entry(&list, "catalog");
    assert_eq!(
        (&catalog["kind"], &catalog["holders"]),
        (&"shared".into(), &2.into())
    );
    assert_eq!(entry(&list, &escaped)["kind"], "lock");
    assert_eq!(
        entry(&list, "job:nightly")["fence"],
        Value::Null,
        "never fenced"
    );

    // `show` names the holder and the queue as Redis keeps them, in order; the
    // holder's token without the mark it carries while clients wait (holders.lua).
    let value: String = query(&redis, redis::cmd("GET").arg("lock:{order:42}"));
    let holder = value.strip_suffix("|queued").expect("marked: clients wait");
    let waiting: Vec<String> = query(&redis, redis::cmd("ZRANGE").arg(queue).arg(0).arg(-1));
    let shown = printed(&["--url", &url, "show", "order:42"]).await;
    let holder_line = shown.lines().position(|line| line.contains(holder));
    let places: Vec<Option<usize>> = waiting
        .iter()
        .map(|token| shown.lines().position(|line| line.contains(token.as_str())))
        .collect();
    assert!(holder_line.is_some(), "{shown}");
    assert!(places[0] < places[1] && places[0] > holder_line, "{shown}");
    assert!(shown.contains("fence    1\n"), "{shown}");
    let details = printed_json(&["--url", &url, "show", "order:42", "--json"]).await;
    assert_eq!(details["holders"][0]["token"], holder);
    let client = holder.split(':').next().unwrap();
    assert_eq!(details["holders"][0]["client"], client);
    assert_eq!(details["fence"], 1);
    let queued: Vec<&str> = details["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|waiter| waiter["token"].as_str().unwrap())
        .collect();
    assert_eq!(queued, waiting);
    let waited = |place: usize| details["queue"][place]["waited_ms"].as_u64().unwrap();
    assert!(waited(0) >= waited(1), "{details}");
    let catalog = printed_json(&["--url", &url, "show", "catalog", "--json"]).await;
    let holders = catalog["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2);
    assert_ne!(holders[0]["client"], holders[1]["client"]);
    assert!(
        holders
            .iter()
            .all(|h| h["lease_left_ms"].as_u64().unwrap() > 20_000)
    );

    // Unlocking asks first; no is no.
    let declined = locks_answering(&["--url", &url, "unlock", "order:42"], "n\n").await;
    assert!(!declined.status.success());
    let asked = String::from_utf8_lossy(&declined.stderr);
    assert!(
        asked.contains(holder),
        "the question does not show the holder: {asked}"
    );
    assert!(
        asked.contains("[y/N]") && asked.trim_end().ends_with("was left locked"),
        "{asked}"
    );
    let still: String = query(&redis, redis::cmd("GET").arg("lock:{order:42}"));
    assert_eq!(still, value, "a declined unlock changed the lock");
    assert!(!next.is_finished());
    // Yes passes the lock to the first in the queue, and only to it.
    let unlocked = locks_answering(&["--url", &url, "unlock", "order:42"], "y\n").await;
    assert!(unlocked.status.success(), "{unlocked:?}");
    let passed = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the first waiter got the freed lock")
        .unwrap();
    assert!(!last.is_finished(), "the second waiter got the lock too");
    passed.release().await.unwrap();
    last.await.unwrap().release().await.unwrap();

    let yes = printed(&["--url", &url, "unlock", "catalog", "--yes"]).await;
    assert!(yes.contains("unlocked `catalog`"), "{yes}");
    assert!(!first.is_locked("catalog").await.unwrap());
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_one_line_of_error() {
    let redis = RedisServer::start();
    let url = redis.url();
    let refused = refusal(&locks(&["--url", "not a url", "ls"]).await);
    assert!(refused.contains("check the URL"), "{refused}");
    let down = RedisServer::start();
    let down_url = down.url();
    drop(down);
    let started = Instant::now();
    let unreachable = refusal(&locks(&["--url", &down_url, "ls"]).await);
    assert!(unreachable.contains("reachable"), "{unreachable}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let unknown = refusal(&locks(&["--url", &url, "show", "order:7"]).await);
    assert!(
        unknown.contains("no lock is held on `order:7`"),
        "{unknown}"
    );
    let unknown = refusal(&locks(&["--url", &url, "unlock", "order:7", "--yes"]).await);
    assert!(
        unknown.contains("no lock is held on `order:7`"),
        "{unknown}"
    );
    let empty = refusal(&locks(&["--url", &url, "show", ""]).await);
    assert!(empty.contains("must not be empty"), "{empty}");
    let nowhere = refusal(&locks(&["ls"]).await);
    assert!(nowhere.contains("REDIS_URL"), "{nowhere}");
    let usage = locks(&["--url", &url, "lss"]).await;
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");
    let from_environment = tokio::process::Command::new(env!("CARGO_BIN_EXE_locks"))
        .arg("ls")
        .env("REDIS_URL", &url)
        .output()
        .await
        .unwrap();
    assert!(from_environment.status.success(), "{from_environment:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_every_primary_is_listed() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let client = LockClient::cluster(&urls).await.unwrap();
    let keys: Vec<String> = (0..12).map(|n| format!("shard-{n}")).collect();
    let mut held = Vec::new();
    for key in &keys {
        held.push(client.acquire(key, &LockOptions::new()).await.unwrap());
    }
    let holding = cluster
        .primaries()
        .into_iter()
        .filter(|primary| query::<usize>(primary, &mut redis::cmd("DBSIZE")) > 0)
        .count();
    assert!(holding >= 2, "the locks landed on one primary");
    let nodes = urls.join(",");
    let listed = printed_json(&["--cluster", &nodes, "ls", "--json"]).await;
    let mut found: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|lock| lock["key"].as_str().unwrap())
        .collect();
    found.sort();
    let mut expected: Vec<&str> = keys.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(found, expected);
    let shown = printed(&["--cluster", &urls[0], "show", "shard-3"]).await;
    assert!(shown.contains("holders  1"), "{shown}");
    printed(&["--cluster", &urls[1], "unlock", "shard-3", "--yes"]).await;
    assert!(!client.is_locked("shard-3").await.unwrap());
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_the_primary_is_listed() {
    let group = SentinelGroup::start(Duration::from_secs(5));
    let urls = group.sentinel_urls();
    let client = LockClient::sentinel(&urls, group.name).await.unwrap();
    let guard = client.acquire("report", &LockOptions::new()).await.unwrap();
    let mut args = Vec::new();
    for url in &urls {
        args.extend(["--sentinel", url.as_str()]);
    }
    args.extend(["--primary", group.name, "ls"]);
    let listed = printed(&args).await;
    assert!(line_of(&listed, "report").contains("lock"), "{listed}");
    let refused = locks(&["--sentinel", &urls[0], "ls"]).await;
    assert_eq!(
        refused.status.code(),
        Some(2),
        "--sentinel without --primary"
    );
    guard.release().await.unwrap();
}
