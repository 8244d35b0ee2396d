//! The client's own connection to Redis: many callers share it, each gets its own
//! answer, also for requests the socket could not take at once; an answer longer
//! than one read arrives whole, and it reaches a server over a Unix socket and in
//! another database as it does over TCP.

use std::collections::BTreeSet;
use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockInspector, LockOptions};
use lock_tests::{RedisServer, TcpProxy};

/// Keys whose leases differ by a minute from one to the next, so that an answer
/// given to the wrong caller shows however slowly the test runs.
const KEYS: u64 = 64;

fn lease_of(key: u64) -> Duration {
    Duration::from_secs(60 * (key + 1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_reach_whoever_asked_among_many_callers() {
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let mut guards = Vec::new();
    for key in 0..KEYS {
        let options = LockOptions::new().lease(lease_of(key)).watchdog(false);
        guards.push(
            holder
                .acquire(&format!("answers:{key}"), &options)
                .await
                .unwrap(),
        );
    }
    let asker = LockClient::connect(&redis.url()).await.unwrap();
    let callers = (0..KEYS).map(|key| {
        let asker = asker.clone();
        tokio::spawn(async move {
            let (held, free) = (format!("answers:{key}"), format!("answers:free:{key}"));
            for _ in 0..50 {
                let (left, free) = tokio::join!(asker.lease_left(&held), asker.is_locked(&free));
                let left = left.unwrap().expect("the lock is held");
                assert!(
                    left <= lease_of(key) && left > lease_of(key) - Duration::from_secs(30),
                    "key {key} was told {left:?} left of its {:?} lease",
                    lease_of(key)
                );
                assert!(!free.unwrap(), "{key}: a lock nobody holds was said held");
            }
        })
    });
    for caller in callers.collect::<Vec<_>>() {
        caller.await.unwrap();
    }
    drop(guards);
}

/// Callers write their own requests onto the socket; what it does not take, and
/// every request behind that, the connection's task sends once the socket drains. A
/// stalled peer fills the socket: megabytes of requests wait, one of them partly
/// written, and each answer still goes to whoever asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_socket_could_not_take_at_once_are_answered_each_to_its_caller() {
    const CALLERS: u64 = 200;
    // 200 requests of 60 KB are more than the sockets on the way buffer.
    let key = |n: u64| format!("backlog:{n}:{}", "k".repeat(60_000));
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let mut guards = Vec::new();
    for n in 0..CALLERS {
        let options = LockOptions::new().lease(lease_of(n)).watchdog(false);
        guards.push(holder.acquire(&key(n), &options).await.unwrap());
    }
    let proxy = TcpProxy::start(redis.port()).await;
    // A bound far past the stall, even on a slow machine: it is not what this tests.
    let patient = ClientConfig::new().command_timeout(Duration::from_secs(20));
    let asker = LockClient::connect_with(&proxy.url(), patient)
        .await
        .unwrap();
    // Connected before the stall.
    assert!(!asker.is_locked("backlog:free").await.unwrap());

    proxy.stall();
    let callers: Vec<_> = (0..CALLERS)
        .map(|n| {
            let (asker, key) = (asker.clone(), key(n));
            tokio::spawn(async move { asker.lease_left(&key).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.resume();
    for (n, caller) in (0..).zip(callers) {
        // Not `unwrap`: its debug form would print the whole key.
        let left = caller
            .await
            .unwrap()
            .unwrap_or_else(|error| panic!("key {n}: {error}"))
            .expect("the lock is held");
        assert!(
            left <= lease_of(n) && left > lease_of(n) - Duration::from_secs(30),
            "key {n} was told {left:?} left of its {:?} lease",
            lease_of(n)
        );
    }
    drop(guards);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_and_another_database_lock_as_tcp_does() {
    let socket = std::env::temp_dir().join(format!("lock-tests-{}.sock", std::process::id()));
    let path = socket.to_str().unwrap();
    let redis = RedisServer::start_with(&["--unixsocket", path, "--unixsocketperm", "700"]);
    let url = format!("redis+unix://{path}?db=3");
    let first = LockClient::connect(&url).await.unwrap();
    let second = LockClient::connect(&url).await.unwrap();
    let options = LockOptions::new()
        .lease(Duration::from_secs(10))
        .watchdog(false);

    let held = first.acquire("unix:order", &options).await.unwrap();
    assert!(
        second
            .try_acquire("unix:order", &options)
            .await
            .unwrap()
            .is_none(),
        "a second client got a lock the first holds"
    );
    let mut admin = redis.connection();
    let in_db_3: bool = redis::cmd("SELECT")
        .arg(3)
        .query::<()>(&mut admin)
        .and_then(|()| {
            redis::cmd("EXISTS")
                .arg("lock:{unix:order}")
                .query(&mut admin)
        })
        .unwrap();
    assert!(in_db_3, "the lock is not in the URL's database");

    held.release().await.unwrap();
    let taken = second.try_acquire("unix:order", &options).await.unwrap();
    assert!(taken.is_some(), "the lock was not free after its release");
    let _ = std::fs::remove_file(&socket);
}

/// A semaphore's thousand holders, listed in one answer tens of kilobytes long:
/// several reads' worth, more than the connection's first buffer (16 KB) holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_longer_than_a_read_arrives_whole() {
    const PERMITS: u32 = 1000;
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new()
        .permits(PERMITS)
        .lease(Duration::from_secs(60))
        .watchdog(false);
    let mut guards = Vec::new();
    for _ in 0..PERMITS {
        guards.push(client.acquire("long:jobs", &options).await.unwrap());
    }
    let inspector = LockInspector::connect(&redis.url()).await.unwrap();
    let listed = tokio::time::timeout(Duration::from_secs(10), inspector.lock("long:jobs"))
        .await
        .expect("the answer never came whole")
        .unwrap()
        .expect("the semaphore is held");
    let tokens: BTreeSet<_> = listed.holders.iter().map(|holder| &holder.token).collect();
    assert_eq!(
        tokens.len(),
        PERMITS as usize,
        "holders listed: {}",
        listed.holders.len()
    );
    assert!(
        listed
            .holders
            .iter()
            .all(|holder| holder.lease_left.is_some()),
        "a holder was listed without its lease"
    );
}

/// A `redis::Client` built with TCP settings has them on the connection the lock
/// client sends its requests over, as on redis-rs' own connections: a keepalive
/// that keeps an idle connection through a firewall that forgets quiet flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_tcp_settings_apply_to_its_connections() {
    let redis = RedisServer::start();
    let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(77));
    let info = redis::IntoConnectionInfo::into_connection_info(redis.url().as_str())
        .unwrap()
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_keepalive(keepalive));
    let client = LockClient::from_client(redis::Client::open(info).unwrap())
        .await
        .unwrap();
    let guard = client
        .acquire("invoice", &LockOptions::new())
        .await
        .unwrap();

    let listed = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established", "dst"])
        .arg(format!("127.0.0.1:{}", redis.port()))
        .output()
        .expect("ss, of iproute2");
    let connections = String::from_utf8_lossy(&listed.stdout).into_owned();
    guard.release().await.unwrap();
    assert!(!connections.trim().is_empty(), "no connection listed");
    for connection in connections.lines() {
        assert!(
            connection.contains("timer:(keepalive,"),
            "a connection without the client's keepalive: {connection}"
        );
    }
}
