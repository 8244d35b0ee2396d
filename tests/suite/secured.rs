//! Redis as production runs it: a password, an ACL user allowed only what the
//! library needs (one server, a Cluster, Sentinel), TLS with a private CA (one
//! server, a Cluster, Sentinel, Redlock, a client certificate), and the
//! application's own `redis::Client` or `ConnectionManager`. On each, two clients
//! exclude each other and a release wakes the other client's waiter at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockInspector, LockOptions};
use lock_tests::{RedisCluster, RedisServer, SentinelGroup};
use tokio::time::Instant;

use crate::attribute::Overlap;
use crate::cluster::follows_a_silent_primary;

/// What the library's ACL user may do, as the README shows it after
/// `ACL SETUSER locks on >password`: its keys and channels, and its commands.
const LOCK_USER_RULES: &str = "resetkeys ~lock:* resetchannels &lock:* -@all \
+select +client|setinfo +role \
+set +get +mget +del +pexpire +pttl +incr +time +type \
+pexpireat +pexpiretime \
+zadd +zrem +zrange +zcard +zscore +zremrangebyscore \
+evalsha +script|load +wait +waitaof +delifeq +delex \
+publish +spublish +subscribe +unsubscribe +ssubscribe +sunsubscribe";

/// The rules that name commands only newer servers have, which a server without
/// them refuses in `ACL SETUSER`: the README says to leave those out.
const NEWER_SERVER_RULES: &str = "+client|setinfo +waitaof +delifeq +delex";

/// What the ACL user needs in addition on a Cluster, as the README says.
const LOCK_USER_CLUSTER_RULES: &str = "+cluster|slots +cluster|shards +ping";

/// What the ACL user needs in addition for the operator's reads (`LockInspector`,
/// `locks ls`), as the README says.
const INSPECTOR_RULES: &str = "+scan";

/// What the Sentinels' ACL user needs, as the README says.
const SENTINEL_USER_RULES: &str =
    "-@all +sentinel|master +sentinel|replicas +client|setinfo +subscribe &+switch-master";

/// `rules` as `server` takes them: without the rules for commands it does not have.
fn rules_for<'a>(server: &RedisServer, rules: &'a str) -> Vec<&'a str> {
    assert_eq!(
        server.has_command("client|setinfo"),
        server.version().number >= (7, 2, 0),
        "CLIENT SETINFO came with Redis 7.2 (and Valkey 8)"
    );
    let newer: Vec<&str> = NEWER_SERVER_RULES.split_whitespace().collect();
    rules
        .split_whitespace()
        .filter(|rule| !newer.contains(rule) || server.has_command(&rule[1..]))
        .collect()
}

const RETRY_WAIT: Duration = Duration::from_secs(5);

/// Workers of both clients take turns on one key with fencing; then each client
/// in turn waits for a lock the other holds and is woken by its release. `servers`
/// are where the locks live, to see when a waiter listens.
async fn exclude_and_wake(first: &LockClient, second: &LockClient, servers: &[&RedisServer]) {
    let overlap = Arc::new(Overlap::default());
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let options = LockOptions::new()
        .fencing(true)
        .retry_wait(Duration::from_millis(20))
        .timeout(Duration::from_secs(20));
    let workers: Vec<_> = [first, second, first, second]
        .into_iter()
        .map(|client| {
            let (client, options) = (client.clone(), options.clone());
            let (overlap, tokens) = (overlap.clone(), tokens.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = client.acquire("ledger", &options).await.unwrap();
                    tokens.lock().unwrap().push(guard.fencing_token().unwrap());
                    overlap.section(Duration::from_millis(2)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(overlap.most(), 1, "two holders were inside at once");
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 40);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "fencing tokens out of order: {tokens:?}"
    );

    wakes(first, second, "seat-1", servers).await;
    wakes(second, first, "seat-2", servers).await;
    share(first, second).await;
}

/// The two clients share a semaphore's permits (but on Redlock, which refuses
/// semaphores) and a key taken shared, which go through the scripts' other paths.
async fn share(first: &LockClient, second: &LockClient) {
    let two = LockOptions::new().permits(2);
    match first.acquire("exports", &two).await {
        Err(LockError::InvalidOptions { reason, .. }) if reason.contains("Redlock") => {}
        permit => {
            let permits = [
                permit.unwrap(),
                second.acquire("exports", &two).await.unwrap(),
            ];
            assert!(first.try_acquire("exports", &two).await.unwrap().is_none());
            for permit in permits {
                permit.release().await.unwrap();
            }
        }
    }
    let shared = LockOptions::new().shared(true);
    let readers = [
        first.acquire("catalog", &shared).await.unwrap(),
        second.acquire("catalog", &shared).await.unwrap(),
    ];
    let writer = second.try_acquire("catalog", &LockOptions::new()).await;
    assert!(
        matches!(writer, Ok(None)),
        "a writer beside readers: {writer:?}"
    );
    for reader in readers {
        reader.release().await.unwrap();
    }
}

/// `waiter` waits for the lock on `key` that `holder` holds, and gets it well before
/// its pause between attempts would have ended: it was woken, not polling.
async fn wakes(
    holder: &LockClient,
    waiter: &LockClient,
    key: &'static str,
    servers: &[&RedisServer],
) {
    let guard = holder.acquire(key, &LockOptions::new()).await.unwrap();
    let waiter = waiter.clone();
    let waiting = tokio::spawn(async move {
        let patient = LockOptions::new()
            .retry_wait(RETRY_WAIT)
            .timeout(Duration::from_secs(20));
        waiter.acquire(key, &patient).await
    });
    // The waiter's first wait opens its subscriber connection, which takes a while
    // over TLS and through Sentinel: measure from when it listens for its turn.
    let channels = format!("lock:{{{key}}}:*");
    let started = Instant::now();
    while listeners(servers, &channels) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the waiter never listened for releases"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let taken = waiting.await.unwrap().expect("the waiter gets the lock");
    let handed_over = released_at.elapsed();
    assert!(
        handed_over < RETRY_WAIT / 10,
        "the waiter polled instead of being woken: {handed_over:?}"
    );
    taken.release().await.unwrap();
}

/// The channels matching `pattern` that some connection listens on, on `servers`,
/// by either kind of pub/sub.
fn listeners(servers: &[&RedisServer], pattern: &str) -> usize {
    let count = |server: &RedisServer, kind: &str| {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg(kind)
            .arg(pattern)
            .query(&mut server.connection())
            .expect("PUBSUB");
        channels.len()
    };
    servers
        .iter()
        .map(|server| count(server, "CHANNELS") + count(server, "SHARDCHANNELS"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_url_opens_a_protected_redis() {
    let redis = RedisServer::start_with_password("s3cret", &[]);
    assert!(redis.url().contains(":s3cret@"));
    let first = LockClient::connect(&redis.url()).await.unwrap();
    let second = LockClient::connect(&redis.url()).await.unwrap();
    exclude_and_wake(&first, &second, &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_password_fails_at_connect() {
    let redis = RedisServer::start_with_password("s3cret", &[]);
    for url in [
        redis.url_as("", "wrong"),
        format!("redis://127.0.0.1:{}", redis.port()),
    ] {
        let started = Instant::now();
        let refused = LockClient::connect(&url).await;
        let took = started.elapsed();
        let Err(LockError::Backend {
            key: None, source, ..
        }) = &refused
        else {
            panic!("{url}: expected a backend error, got {refused:?}");
        };
        assert!(
            took < Duration::from_secs(3),
            "{url}: refused only after {took:?}"
        );
        let message = source.to_string();
        let named = ["auth", "noauth", "wrongpass", "password"]
            .iter()
            .any(|word| message.to_lowercase().contains(word));
        assert!(
            named,
            "{url}: the error does not say authentication failed: {refused:?}"
        );
    }
}

/// Adds the README's ACL user `locks`, with `rules` besides; returns its URL.
fn add_lock_user(redis: &RedisServer, rules: &str) -> String {
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locks")
        .arg("on")
        .arg(">locks-pass")
        .arg(rules_for(redis, LOCK_USER_RULES))
        .arg(rules_for(redis, rules))
        .query(&mut redis.connection())
        .expect("ACL SETUSER with the README's rules");
    redis.url_as("locks", "locks-pass")
}

fn assert_nothing_denied(redis: &RedisServer, who: &str) {
    let denied = denied(redis);
    assert!(
        denied.is_empty(),
        "{who} used commands, keys or channels its user's ACL rules do not allow: {denied:?}"
    );
}

/// The commands, keys and channels the server refused to anyone since it started,
/// but for `CONFIG GET`: the client's check of the eviction policy may be refused.
fn denied(redis: &RedisServer) -> Vec<redis::Value> {
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query(&mut redis.connection())
        .expect("ACL LOG");
    let config_get = redis::Value::BulkString(b"config|get".to_vec());
    log.into_iter()
        .filter(
            |entry| !matches!(entry, redis::Value::Array(fields) if fields.contains(&config_get)),
        )
        .collect()
}

#[test]
fn the_readme_gives_the_tested_acl_line() {
    let readme = include_str!("../../README.md");
    let line = format!("ACL SETUSER locks on >CHANGE-ME {LOCK_USER_RULES}");
    assert!(
        readme.contains(&line),
        "the README's ACL line differs from the tested one:\n{line}"
    );
    let older = format!("On Redis 7.0, leave out `{NEWER_SERVER_RULES}`");
    let valkey = "on Valkey 9, leave out `+delex`".to_owned();
    let cluster = format!("On a Cluster, add `{LOCK_USER_CLUSTER_RULES}`");
    let inspector = format!("`locks ls`) add `{INSPECTOR_RULES}`");
    let sentinels = format!("`ACL SETUSER locks on >CHANGE-ME {SENTINEL_USER_RULES}`");
    for told in [older, valkey, cluster, inspector, sentinels] {
        assert!(readme.contains(&told), "the README does not say {told}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_only_the_needed_commands_does_everything() {
    let redis = RedisServer::start_with_password("admin-pass", &[]);
    let url = format!("{}/3", add_lock_user(&redis, ""));
    let first = LockClient::connect(&url).await.unwrap();
    let second = LockClient::connect(&url).await.unwrap();
    exclude_and_wake(&first, &second, &[&redis]).await;

    // Lease renewal (`extend`), and a stale holder's release refused.
    let options = LockOptions::new().lease(Duration::from_millis(300));
    let guard = first.acquire("report", &options).await.unwrap();
    guard.extend(Duration::from_secs(10)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(guard.is_held(), "the extended lease ran out");
    let busy = second.try_acquire("report", &options).await.unwrap();
    assert!(busy.is_none(), "a second holder got a held lock");
    guard.release().await.unwrap();

    // The watchdog, whose renewals go together in one script.
    let watched = LockOptions::new()
        .lease(Duration::from_millis(600))
        .watchdog(true);
    let guard = first.acquire("payout", &watched).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(guard.is_held(), "the watchdog let the lease run out");
    let busy = second.try_acquire("payout", &watched).await.unwrap();
    assert!(busy.is_none(), "a second holder got a watched lock");
    guard.release().await.unwrap();

    let stale = first.acquire("audit", &options).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let successor = second.acquire("audit", &options).await.unwrap();
    let refused = stale.release().await;
    assert!(
        matches!(refused, Err(LockError::NotHeld { .. })),
        "{refused:?}"
    );
    assert!(successor.is_held());
    successor.release().await.unwrap();

    assert_nothing_denied(&redis, "the library");
    let mut admin = redis.connection();
    // The locks live in the URL's database, and the user is limited as meant.
    let fence_in = |db: i64, admin: &mut redis::Connection| -> Option<u64> {
        let () = redis::cmd("SELECT").arg(db).query(admin).unwrap();
        redis::cmd("GET")
            .arg("lock:{ledger}:fence")
            .query(admin)
            .unwrap()
    };
    assert!(
        fence_in(3, &mut admin).is_some(),
        "no fencing counter in database 3"
    );
    assert_eq!(
        fence_in(0, &mut admin),
        None,
        "a fencing counter in database 0"
    );
    let mut user = redis.client_for(&url).get_connection().unwrap();
    let outside = redis::cmd("GET")
        .arg("orders")
        .query::<Option<String>>(&mut user);
    assert!(outside.is_err(), "the ACL user reads keys outside `lock:*`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_reads_and_unlocks_as_the_acl_user() {
    let redis = RedisServer::start_with_password("admin-pass", &[]);
    let url = add_lock_user(&redis, INSPECTOR_RULES);
    let holder = LockClient::connect(&url).await.unwrap();
    let waiter = LockClient::connect(&url).await.unwrap();
    let inspector = LockInspector::connect(&url).await.unwrap();
    let options = LockOptions::new()
        .fencing(true)
        .lease(Duration::from_secs(10));
    let _held = holder.acquire("order:9", &options).await.unwrap();
    let waiting = {
        let options = options.clone().timeout(Duration::from_secs(20));
        tokio::spawn(async move { waiter.acquire("order:9", &options).await })
    };
    let queued_by = Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let listed = inspector.locks("order:").await.unwrap();
        if listed.first().is_some_and(|lock| lock.queue.len() == 1) {
            break listed;
        }
        assert!(
            Instant::now() < queued_by,
            "the waiter never queued: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key, "order:9");
    let shown = inspector.lock("order:9").await.unwrap().unwrap();
    assert_eq!(shown.holders.len(), 1, "{shown:?}");
    assert_eq!(
        shown.fence,
        Some(1),
        "the first fenced grant's counter: {shown:?}"
    );
    // `locks unlock`: the waiter is let in.
    assert!(holder.force_unlock("order:9").await.unwrap());
    let taken = waiting.await.unwrap().unwrap();
    assert!(taken.is_held());
    taken.release().await.unwrap();
    assert_nothing_denied(&redis, "the operator's reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_missing_a_command_fails_at_connect() {
    let redis = RedisServer::start_with_password("admin-pass", &[]);
    let url = add_lock_user(&redis, "");
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locks")
        .arg("-script|load")
        .query(&mut redis.connection())
        .unwrap();
    let refused = LockClient::connect(&url).await;
    let Err(LockError::InvalidOptions { reason, .. }) = refused else {
        panic!("expected the client to say what the user lacks: {refused:?}");
    };
    assert!(
        reason.contains("no permissions") && reason.contains("allow `script|load`"),
        "the error does not name the missing permission: {reason}"
    );
}

/// A client whose ACL user may not subscribe, and one of the default user.
async fn deaf_and_holder(redis: &RedisServer) -> (LockClient, LockClient) {
    let deaf = LockClient::connect(&add_lock_user(redis, "-subscribe -ssubscribe"))
        .await
        .unwrap();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    (deaf, holder)
}

/// A waiter whose `SUBSCRIBE` is refused polls, and still queues in Redis: a key
/// another client keeps handing on between its own tasks comes to it within the
/// hand-off bound and a poll, not after the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_subscribe_still_gets_a_key_handed_on_in_another_client() {
    let redis = RedisServer::start_with_password("admin-pass", &[]);
    let (deaf, holder) = deaf_and_holder(&redis).await;
    let chain_runs = Arc::new(AtomicBool::new(true));
    let chain: Vec<_> = (0..4)
        .map(|_| {
            let (holder, chain_runs) = (holder.clone(), chain_runs.clone());
            tokio::spawn(async move {
                while chain_runs.load(Ordering::SeqCst) {
                    let guard = holder.acquire("press", &LockOptions::new()).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    let patient = LockOptions::new().timeout(Duration::from_secs(10));
    let taken = deaf.acquire("press", &patient).await;
    let waited = asked.elapsed();
    chain_runs.store(false, Ordering::SeqCst);
    taken
        .expect("the waiter that polls gets the key")
        .release()
        .await
        .unwrap();
    for task in chain {
        task.await.unwrap();
    }
    assert!(
        waited < Duration::from_secs(2),
        "the waiter that polls waited {waited:?} for a key handed on in another client"
    );
}

/// A waiter that polls from Redis's queue asks more often than `retry_wait`, yet
/// gives up within its budget (`retries` x `retry_wait`) and leaves its place, which
/// a subscribed waiter behind it keeps alive. It asks to subscribe once, not at
/// every poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_subscribe_gives_up_in_its_budget_and_leaves_the_queue() {
    let redis = RedisServer::start_with_password("admin-pass", &[]);
    let (deaf, holder) = deaf_and_holder(&redis).await;
    let listening = LockClient::connect(&redis.url()).await.unwrap();
    let queued = || -> u64 {
        redis::cmd("ZCARD")
            .arg("lock:{press}:queue")
            .query(&mut redis.connection())
            .unwrap()
    };
    let until_queued = async |count: u64, what: &str| {
        let started = Instant::now();
        while queued() != count {
            assert!(started.elapsed() < Duration::from_secs(5), "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let guard = holder.acquire("press", &LockOptions::new()).await.unwrap();
    let waiting = tokio::spawn(async move {
        let patient = LockOptions::new().timeout(Duration::from_secs(20));
        listening.acquire("press", &patient).await
    });
    until_queued(1, "the subscribed waiter never queued").await;
    let asked = Instant::now();
    let brief = LockOptions::new()
        .retries(2)
        .retry_wait(Duration::from_millis(300));
    let polling = tokio::spawn(async move { deaf.acquire("press", &brief).await });
    until_queued(2, "the waiter that polls never queued").await;
    let refused = polling.await.unwrap();
    let waited = asked.elapsed();
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );
    assert!(
        waited >= Duration::from_millis(600) && waited < Duration::from_secs(3),
        "2 retries of 300 ms took {waited:?}"
    );
    until_queued(1, "the waiter that gave up kept its place in the queue").await;
    assert_eq!(
        refused_subscribes(&redis),
        1,
        "the waiter that polls asked to subscribe again"
    );
    guard.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
}

/// How many `SUBSCRIBE`s and `SSUBSCRIBE`s `redis` refused, by the counts in its
/// `ACL LOG`.
fn refused_subscribes(redis: &RedisServer) -> i64 {
    let field = |fields: &[redis::Value], name: &str| {
        fields
            .chunks(2)
            .find(|pair| pair[0] == redis::Value::BulkString(name.as_bytes().to_vec()))
            .map(|pair| pair[1].clone())
    };
    denied(redis)
        .iter()
        .filter_map(|entry| match entry {
            redis::Value::Array(fields) => Some(fields),
            _ => None,
        })
        .filter(|fields| {
            matches!(
                field(fields, "object"),
                Some(redis::Value::BulkString(object))
                    if object == b"subscribe" || object == b"ssubscribe"
            )
        })
        .map(|fields| match field(fields, "count") {
            Some(redis::Value::Int(count)) => count,
            other => panic!("an ACL LOG entry without a count: {other:?}"),
        })
        .sum()
}

/// A user set up by an older README, without `cluster|shards`: the client counts
/// the replicas by `CLUSTER SLOTS` instead, so a grant still waits for the slot's
/// replica, and locks once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_user_that_may_not_list_shards_still_waits_for_replicas() {
    let cluster = RedisCluster::start_with_password("admin-pass");
    let urls = cluster_lock_user(&cluster, "+cluster|slots +ping");
    let config = ClientConfig::new().replica_timeout(Duration::from_millis(100));
    let client = crate::once_settled(|| LockClient::cluster_with(&urls, config.clone()))
        .await
        .unwrap();
    let key = "invoice:old-acl";
    let replica = &cluster.servers[cluster.shard_for(cluster.slot_of(key)).replica];
    replica.freeze();
    let once = LockOptions::new().spin(false);
    let unconfirmed = client.acquire(key, &once).await;
    replica.thaw();
    assert!(
        matches!(unconfirmed, Err(LockError::Replication { required: 1, .. })),
        "granted without its replica: {unconfirmed:?}"
    );
    let patient = LockOptions::new().timeout(Duration::from_secs(5));
    let guard = client.acquire(key, &patient).await;
    guard.unwrap().release().await.unwrap();
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_takes_the_acl_user_from_its_urls() {
    let cluster = RedisCluster::start_with_password("admin-pass");
    let urls = cluster_lock_user(&cluster, LOCK_USER_CLUSTER_RULES);
    let first = LockClient::cluster(&urls).await.unwrap();
    let second = LockClient::cluster(&urls).await.unwrap();
    exclude_and_wake(&first, &second, &cluster.servers.iter().collect::<Vec<_>>()).await;
    for server in &cluster.servers {
        assert_nothing_denied(server, "the library on a Cluster node");
    }
}

/// A failover from a silent primary is followed as the ACL user the URLs name: the
/// connections made anew from the primaries the nodes list log in as it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_follows_a_silent_primary_as_the_acl_user() {
    let cluster = RedisCluster::start_with_password("admin-pass");
    let urls = cluster_lock_user(&cluster, LOCK_USER_CLUSTER_RULES);
    // The replica promoted has none of its own to confirm grants with.
    let config = ClientConfig::new().replicas(0);
    follows_a_silent_primary(&cluster, &urls, config, "invoice:silent").await;
    for server in &cluster.servers {
        assert_nothing_denied(server, "the library on a Cluster node");
    }
}

/// The lock user with the README's rules and `rules` on every node of `cluster`; the
/// nodes' URLs as that user.
fn cluster_lock_user(cluster: &RedisCluster, rules: &str) -> Vec<String> {
    cluster
        .servers
        .iter()
        .map(|server| add_lock_user(server, rules))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_client_locks_on_the_apps_client() {
    let redis = RedisServer::start_with_password("s3cret", &[]);
    let app_client = redis::Client::open(redis.url()).unwrap();
    let reused = LockClient::from_client(app_client).await.unwrap();
    let other = LockClient::connect(&redis.url()).await.unwrap();
    exclude_and_wake(&reused, &other, &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_connection_manager_locks_over_the_apps_connection() {
    let redis = RedisServer::start_with_password("s3cret", &[]);
    let mut admin = redis.connection();
    let mut connections = || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
        list.lines().count()
    };
    let app_client = redis::Client::open(redis.url()).unwrap();
    let manager = redis::aio::ConnectionManager::new(app_client.clone())
        .await
        .unwrap();
    let before = connections();
    let reused = LockClient::from_connection_manager(manager, app_client)
        .await
        .unwrap();
    assert!(
        reused
            .try_acquire("probe", &LockOptions::new())
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        connections(),
        before,
        "the lock client opened a connection of its own for commands"
    );
    let other = LockClient::connect(&redis.url()).await.unwrap();
    exclude_and_wake(&reused, &other, &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_acl_users() {
    let group = SentinelGroup::start_with_password(Duration::from_secs(1), "admin-pass");
    let urls = sentinel_lock_users(&group, SENTINEL_USER_RULES);
    let first = LockClient::sentinel(&urls, group.name).await.unwrap();
    let second = LockClient::sentinel(&urls, group.name).await.unwrap();
    exclude_and_wake(&first, &second, &[&group.primary]).await;
    for server in group
        .sentinels
        .iter()
        .chain([&group.primary, &group.replica])
    {
        assert_nothing_denied(server, "the library on a server or Sentinel");
    }
}

/// A Sentinel user set up before the client listened for switches of primary, which
/// may not subscribe: locking works as before, and each Sentinel is asked once per
/// client, not again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_user_that_may_not_subscribe_still_locks() {
    let group = SentinelGroup::start_with_password(Duration::from_secs(1), "admin-pass");
    let without = SENTINEL_USER_RULES.replace(" +subscribe &+switch-master", "");
    let urls = sentinel_lock_users(&group, &without);
    let first = LockClient::sentinel(&urls, group.name).await.unwrap();
    let second = LockClient::sentinel(&urls, group.name).await.unwrap();
    exclude_and_wake(&first, &second, &[&group.primary]).await;
    for sentinel in &group.sentinels {
        let refusals: i64 = denied(sentinel)
            .iter()
            .map(|entry| {
                let fields: Vec<redis::Value> = redis::from_redis_value(entry.clone()).unwrap();
                let count = fields
                    .iter()
                    .position(|field| *field == redis::Value::BulkString(b"count".to_vec()))
                    .expect("an ACL LOG entry's count");
                redis::from_redis_value::<i64>(fields[count + 1].clone()).unwrap()
            })
            .sum();
        assert_eq!(refusals, 2, "one refused SUBSCRIBE per client");
    }
}

/// A Sentinel user that may not ask `SENTINEL MASTER`, by which each confirmation
/// checks that the primary is still the Sentinels', is told so at connect, not at
/// every grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_user_without_sentinel_master_is_told_at_connect() {
    let group = SentinelGroup::start_with_password(Duration::from_secs(1), "admin-pass");
    let without = SENTINEL_USER_RULES.replace(" +sentinel|master ", " ");
    let urls = sentinel_lock_users(&group, &without);
    let refused = LockClient::sentinel(&urls, group.name).await;
    let Err(LockError::InvalidOptions { reason, .. }) = refused else {
        panic!("expected the client to say what the user lacks: {refused:?}");
    };
    assert!(reason.contains("`sentinel|master`"), "{reason}");
}

/// The lock user, with the README's rules on the group's servers and `rules` on its
/// Sentinels: the Sentinels' URLs as that user.
fn sentinel_lock_users(group: &SentinelGroup, rules: &str) -> Vec<String> {
    for server in [&group.primary, &group.replica] {
        add_lock_user(server, "");
    }
    group
        .sentinels
        .iter()
        .map(|sentinel| {
            let () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg("locks")
                .arg("on")
                .arg(">locks-pass")
                .arg(rules_for(sentinel, rules))
                .query(&mut sentinel.connection())
                .expect("ACL SETUSER on a Sentinel");
            sentinel.url_as("locks", "locks-pass")
        })
        .collect()
}

/// Over TLS with a private CA. Their names contain `tls::`, by which scripts/test
/// leaves them out on a server binary built without TLS.
mod tls {
    use lock_runtime::ClientConfig;
    use lock_tests::TestCa;

    use super::*;

    /// Trusts `ca` alone, instead of the system's roots.
    fn trusting(ca: &TestCa) -> ClientConfig {
        ClientConfig::new().tls_certificates(ca.certificates())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_private_ca() {
        let ca = Arc::new(TestCa::new());
        let redis = RedisServer::start_with_tls(&ca, &[]);
        assert!(redis.url().starts_with("rediss://"));
        let configured = LockClient::connect_with(&redis.url(), trusting(&ca))
            .await
            .unwrap();
        let built = LockClient::from_client(redis.client_for(&redis.url()))
            .await
            .unwrap();
        exclude_and_wake(&configured, &built, &[&redis]).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_certificate_where_the_server_asks_for_one() {
        let ca = Arc::new(TestCa::new());
        let redis = RedisServer::start_with_tls(&ca, &["--tls-auth-clients", "yes"]);
        let showing = || ClientConfig::new().tls_certificates(ca.client_certificates());
        let first = LockClient::connect_with(&redis.url(), showing())
            .await
            .unwrap();
        let second = LockClient::connect_with(&redis.url(), showing())
            .await
            .unwrap();
        exclude_and_wake(&first, &second, &[&redis]).await;
        let refused = LockClient::connect_with(&redis.url(), trusting(&ca)).await;
        assert!(
            matches!(refused, Err(LockError::Backend { .. })),
            "connected without the certificate the server asks for: {refused:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refuses_a_server_it_does_not_trust() {
        let redis = RedisServer::start_with_tls(&Arc::new(TestCa::new()), &[]);
        let another_ca = TestCa::new();
        // `connect` trusts the system's roots, which do not hold the test CA.
        for config in [ClientConfig::new(), trusting(&another_ca)] {
            let started = Instant::now();
            let refused = LockClient::connect_with(&redis.url(), config).await;
            assert!(
                matches!(refused, Err(LockError::Backend { .. })),
                "connected to an untrusted server: {refused:?}"
            );
            assert!(started.elapsed() < Duration::from_secs(3));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster() {
        let ca = Arc::new(TestCa::new());
        let cluster = RedisCluster::start_with_tls(&ca);
        assert!(cluster.urls()[0].starts_with("rediss://"));
        let first = LockClient::cluster_with(cluster.urls(), trusting(&ca))
            .await
            .unwrap();
        let second = LockClient::cluster_with(cluster.urls(), trusting(&ca))
            .await
            .unwrap();
        exclude_and_wake(&first, &second, &cluster.servers.iter().collect::<Vec<_>>()).await;
    }

    /// The connections made anew from the primaries the nodes list speak TLS too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_follows_a_silent_primary() {
        let ca = Arc::new(TestCa::new());
        let cluster = RedisCluster::start_with_tls(&ca);
        // The replica promoted has none of its own to confirm grants with.
        let config = trusting(&ca).replicas(0);
        follows_a_silent_primary(&cluster, &cluster.urls(), config, "invoice:silent").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redlock_masters() {
        let ca = Arc::new(TestCa::new());
        let masters: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_with_tls(&ca, &[]))
            .collect();
        let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
        let first = LockClient::redlock_with(&urls, trusting(&ca))
            .await
            .unwrap();
        let second = LockClient::redlock_with(&urls, trusting(&ca))
            .await
            .unwrap();
        exclude_and_wake(&first, &second, &masters.iter().collect::<Vec<_>>()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sentinel() {
        let ca = Arc::new(TestCa::new());
        let group = SentinelGroup::start_with_tls(Duration::from_secs(1), &ca);
        assert!(group.sentinel_urls()[0].starts_with("rediss://"));
        let connect =
            || LockClient::sentinel_with(group.sentinel_urls(), group.name, trusting(&ca));
        let first = connect().await.unwrap();
        let second = connect().await.unwrap();
        exclude_and_wake(&first, &second, &[&group.primary]).await;
        for sentinel in &group.sentinels {
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query(&mut sentinel.connection())
                .unwrap();
            let listening = clients.lines().filter(|client| client.contains(" sub=1 "));
            assert_eq!(
                listening.count(),
                2,
                "each client listens for switches of primary over TLS: {clients}"
            );
        }
    }
}
