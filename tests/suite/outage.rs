//! With Redis down, calls fail within the client's bound, and the client connects
//! again at a pace, not once per call; when Redis is back, the same client works.

use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockGuard, LockOptions};
use lock_tests::{RedisServer, TcpProxy};
use tokio::time::Instant;

use crate::{acquire_once_back, acquire_while_down, queued_once};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_an_error_in_bound_and_up_again_works() {
    let mut redis = RedisServer::start();
    let bound = Duration::from_millis(500);
    let config = ClientConfig::new()
        .command_timeout(bound)
        .connect_timeout(bound);
    let client = LockClient::connect_with(&redis.url(), config)
        .await
        .unwrap();
    lock_once(&client, "invoice", &LockOptions::new()).await;

    redis.kill();
    for _ in 0..3 {
        let started = Instant::now();
        let result = client.acquire("invoice", &LockOptions::new()).await;
        let elapsed = started.elapsed();
        match result {
            Err(error @ LockError::Backend { .. }) => {
                assert_eq!(error.key(), Some("invoice"));
                assert!(error.to_string().contains("reachable"), "{error}");
            }
            other => panic!("expected a Backend error, got {other:?}"),
        }
        assert!(
            elapsed <= bound + Duration::from_millis(250),
            "took {elapsed:?}"
        );
    }

    redis.restart();
    acquire_once_back(&client, "invoice", &LockOptions::new()).await;
}

/// While Redis is down, a client called all the time connects at a pace, not once
/// per call: here its port is taken by a listener that closes what it accepts, as a
/// server that is starting up or overloaded may. Each call still fails within the
/// bound, naming the key, and once Redis is back the client works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_redis_is_down_connects_at_a_pace() {
    let mut redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new();
    lock_once(&client, "invoice", &options).await;
    redis.kill();
    let listener = std::net::TcpListener::bind(("127.0.0.1", redis.port())).unwrap();
    listener.set_nonblocking(true).unwrap();
    let closing = std::thread::spawn(move || {
        let mut accepted = 0;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(1200) {
            match listener.accept() {
                Ok(_closed_at_once) => accepted += 1,
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        accepted
    });
    let calls = acquire_while_down(&client, "invoice", &options).await;
    let made = closing.join().unwrap();
    assert!(made <= 20, "{calls} calls in 1 s made {made} connections");

    redis.restart();
    acquire_once_back(&client, "invoice", &options).await;
}

#[tokio::test]
async fn connecting_to_nothing_fails_in_bound() {
    let bound = Duration::from_millis(500);
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let result = LockClient::connect_with(
        &format!("redis://127.0.0.1:{port}"),
        ClientConfig::new().connect_timeout(bound),
    )
    .await;
    assert!(
        matches!(result, Err(LockError::Backend { key: None, .. })),
        "{result:?}"
    );
    assert!(started.elapsed() <= bound + Duration::from_millis(250));
    let bad_url = LockClient::connect("not a url").await;
    assert!(
        matches!(bad_url, Err(LockError::Backend { .. })),
        "{bad_url:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_between_calls_costs_the_next_acquire_nothing() {
    let (redis, proxy, client) = connected_through_a_proxy(ClientConfig::new()).await;
    let other = LockClient::connect(&redis.url()).await.unwrap();
    for (way, options) in plain_and_fenced() {
        // As a load balancer's idle timeout or a Redis restart does.
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let guard = client
            .acquire("invoice", &options)
            .await
            .unwrap_or_else(|error| panic!("{way}: the acquire after the cut failed: {error}"));
        let busy = other
            .acquire("invoice", &LockOptions::new().spin(false))
            .await;
        assert!(
            matches!(busy, Err(LockError::Busy { .. })),
            "{way}: {busy:?}"
        );
        guard.release().await.unwrap();
    }
    other
        .acquire("invoice", &LockOptions::new())
        .await
        .expect("released")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_answer_was_lost_with_its_connection_holds_the_lock() {
    let (redis, proxy, mut client) = connected_through_a_proxy(ClientConfig::new()).await;
    let operator = LockClient::connect(&redis.url()).await.unwrap();
    for (way, options) in plain_and_fenced() {
        let fail_fast = options.clone().spin(false);
        proxy.stall_answers();
        let acquiring = tokio::spawn(async move {
            let guard = client.acquire("invoice", &fail_fast).await;
            (client, guard)
        });
        let asked = Instant::now();
        while operator.lease_left("invoice").await.unwrap().is_none() {
            assert!(
                asked.elapsed() < Duration::from_secs(10),
                "{way}: the request never reached Redis"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // It ran; its answer goes with the connection.
        proxy.cut();
        proxy.resume();
        let guard;
        (client, guard) = acquiring.await.unwrap();
        let guard = guard.unwrap_or_else(|error| {
            panic!("{way}: sent again, it finds its own token, and the lock is its own: {error}")
        });
        assert!(guard.is_held());
        let other = operator
            .acquire("invoice", &options.clone().spin(false))
            .await;
        assert!(
            matches!(other, Err(LockError::Busy { .. })),
            "{way}: {other:?}"
        );
        let fence = guard.fencing_token();
        assert_eq!(fence.is_some(), way == "fenced", "{way}");
        guard.release().await.unwrap();
        let next = operator
            .acquire("invoice", &options.clone().spin(false))
            .await
            .expect("released at once");
        if let Some(fence) = fence {
            let next_fence = next.fencing_token().expect("fenced");
            assert!(next_fence > fence, "{way}: {next_fence} after {fence}");
        }
        next.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_place_in_the_queue_was_answered_on_a_lost_connection_keeps_it() {
    let (redis, proxy, client) = connected_through_a_proxy(ClientConfig::new()).await;
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let later = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new()
        .lease(Duration::from_secs(10))
        .timeout(Duration::from_secs(10));
    let held = holder.acquire("invoice", &options).await.unwrap();

    proxy.stall_answers_after("join");
    let first = waiting_for(&client, &options);
    queued_once(&redis, "invoice", 1).await;
    let second = waiting_for(&later, &options);
    queued_once(&redis, "invoice", 2).await;
    let listening = listening_connections(&redis);
    assert_eq!(listening.len(), 2, "both waiters listen for their grants");
    // Its place was taken; the answer goes with the connection.
    proxy.cut();
    proxy.resume();
    // Sent again, the join keeps the place ahead of the later waiter. Once the
    // client listens for its grants again, it is let in first.
    let cut_at = Instant::now();
    loop {
        if first.is_finished() {
            panic!("the first waiter gave up: {:?}", first.await.unwrap());
        }
        let now = listening_connections(&redis);
        if now.len() == 2 && !listening.iter().all(|id| now.contains(id)) {
            break;
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(5),
            "never listened again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    let guard = first
        .await
        .unwrap()
        .expect("the first waiter is let in after the lost answer");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!second.is_finished(), "the later waiter went first");
    guard.release().await.unwrap();
    second.await.unwrap().unwrap().release().await.unwrap();
}

/// `client` acquiring `invoice` in a task of its own.
fn waiting_for(
    client: &LockClient,
    options: &LockOptions,
) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    let (client, options) = (client.clone(), options.clone());
    tokio::spawn(async move { client.acquire("invoice", &options).await })
}

/// The ids of the connections subscribed to a channel.
fn listening_connections(redis: &RedisServer) -> Vec<u64> {
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut redis.connection())
        .unwrap();
    let field = |line: &str, name: &str| {
        line.split(' ')
            .find_map(|field| field.strip_prefix(name)?.parse::<u64>().ok())
    };
    clients
        .lines()
        .filter(|line| field(line, "sub=").is_some_and(|channels| channels > 0))
        .filter_map(|line| field(line, "id="))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_replaced() {
    let bound = Duration::from_millis(300);
    let config = ClientConfig::new().command_timeout(bound);
    let (_redis, proxy, client) = connected_through_a_proxy(config).await;
    let options = LockOptions::new().spin(false);

    proxy.silence();
    let silenced = Instant::now();
    // Its request is given up on after the bound, within the quarter more the
    // connection's watcher takes to look (later on a loaded machine), and is not sent
    // again: a server gone silent would only double the wait.
    let unanswered = tokio::time::timeout(4 * bound, client.acquire("invoice", &options)).await;
    let waited = silenced.elapsed();
    assert!(
        matches!(unanswered, Ok(Err(LockError::Backend { .. }))),
        "{unanswered:?}"
    );
    assert!(waited >= bound, "{waited:?}");
    assert!(waited < 2 * bound, "the call was sent again: {waited:?}");
    // Once a probe has gone unanswered for the bound too, calls take a new connection.
    loop {
        match client.acquire("invoice", &options).await {
            Ok(guard) => break guard.release().await.unwrap(),
            Err(LockError::Backend { .. }) if silenced.elapsed() < 10 * bound => {}
            Err(error) => panic!("the client kept its silent connection: {error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_on_a_silent_connection_has_it_replaced() {
    let bound = Duration::from_millis(300);
    let config = ClientConfig::new().command_timeout(bound);
    let (_redis, proxy, client) = connected_through_a_proxy(config).await;
    let options = LockOptions::new().spin(false);

    proxy.silence();
    let dropped = tokio::time::timeout(bound / 10, client.acquire("invoice", &options)).await;
    assert!(dropped.is_err(), "{dropped:?}");
    // Dropping the call sent a probe, which goes unanswered for the bound: the
    // connection is forgotten, and the next call makes a new one.
    tokio::time::sleep(2 * bound).await;
    let started = Instant::now();
    lock_once(&client, "invoice", &options).await;
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_connection_is_not_taken_for_a_silent_one() {
    let redis = RedisServer::start();
    let bound = Duration::from_millis(300);
    let config = ClientConfig::new().command_timeout(bound);
    let client = LockClient::connect_with(&redis.url(), config)
        .await
        .unwrap();
    let options = LockOptions::new().lease(Duration::from_secs(10));
    // Some request always waits on the connection, for many times the bound.
    let until = Instant::now() + 5 * bound;
    let tasks: Vec<_> = (0..32)
        .map(|n| {
            let (client, options) = (client.clone(), options.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let guard = client.acquire(&format!("order:{n}"), &options).await?;
                    guard.release().await?;
                }
                Ok::<(), LockError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_a_silent_connection_fails_in_bound() {
    let bound = Duration::from_millis(300);
    let config = ClientConfig::new().command_timeout(bound);
    let (_redis, proxy, client) = connected_through_a_proxy(config).await;
    let options = LockOptions::new().lease(Duration::from_secs(10));
    let guard = client.acquire("invoice", &options).await.unwrap();

    proxy.silence();
    let silenced = Instant::now();
    let released = tokio::time::timeout(4 * bound, guard.release()).await;
    assert!(
        matches!(released, Ok(Err(LockError::Backend { .. }))),
        "{released:?}"
    );
    assert!(silenced.elapsed() >= bound, "{:?}", silenced.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_answers_late_is_kept() {
    let bound = Duration::from_secs(1);
    let config = ClientConfig::new().command_timeout(bound);
    let (redis, proxy, client) = connected_through_a_proxy(config).await;
    let options = LockOptions::new().spin(false);
    let before = redis.connections_received();

    proxy.stall_answers();
    let acquiring = {
        let (client, options) = (client.clone(), options.clone());
        tokio::spawn(async move { client.acquire("invoice", &options).await })
    };
    // The acquire gives up on its request after the bound and sends a probe, which
    // has the bound to be answered: the answers come halfway.
    tokio::time::sleep(bound + bound / 2).await;
    proxy.resume();
    let _ = acquiring.await.unwrap();
    tokio::time::sleep(bound).await;
    lock_once(&client, "order", &options).await;
    // Less the connection that took this count.
    let made = redis.connections_received() - before - 1;
    assert_eq!(made, 0, "the client connected again {made} times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cut_off_together_make_one_new_connection() {
    let (redis, proxy, client) = connected_through_a_proxy(ClientConfig::new()).await;
    let options = LockOptions::new().lease(Duration::from_secs(10));
    let before = redis.connections_received();

    proxy.stall();
    let acquiring: Vec<_> = (0..64)
        .map(|n| {
            let (client, options) = (client.clone(), options.clone());
            tokio::spawn(async move { client.acquire(&format!("order:{n}"), &options).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.cut();
    proxy.resume();
    for acquiring in acquiring {
        acquiring.await.unwrap().unwrap().release().await.unwrap();
    }
    // Less the connection that took this count.
    let made = redis.connections_received() - before - 1;
    assert_eq!(made, 1, "the client connected {made} times for one cut");
}

/// A primary an operator demoted (`REPLICAOF`) refuses writes on the connections it
/// keeps: the client lets go of the one that heard the refusal, so that the next call
/// connects again, to the primary Sentinel names now where there is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_to_a_demoted_primary_is_made_again() {
    let redis = RedisServer::start();
    let elsewhere = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new()
        .lease(Duration::from_secs(10))
        .spin(false);
    let replica_of = |host: &str, port: &str| {
        let () = redis::cmd("REPLICAOF")
            .arg(host)
            .arg(port)
            .query(&mut redis.connection())
            .unwrap();
    };
    lock_once(&client, "ledger", &options).await;
    let before = redis.connections_received();

    replica_of("127.0.0.1", &elsewhere.port().to_string());
    let refused = client.acquire("ledger", &options).await;
    assert!(
        matches!(&refused, Err(LockError::Backend { .. })),
        "a demoted primary granted the lock: {refused:?}"
    );
    // The refused acquire's withdrawal, sent in the background, connects again and
    // is refused in turn.
    client.shutdown().await;
    replica_of("NO", "ONE");
    lock_once(&client, "ledger", &options).await;
    // Less the connections that took the counts, and the two `replica_of` made.
    let made = redis.connections_received() - before - 3;
    assert_eq!(
        made, 2,
        "the client made {made} connections: fewer means it kept one refused"
    );
}

/// A server, a proxy in front of it, and a client through the proxy, set up with
/// `config`, whose connection is up: it has taken and released a lock.
async fn connected_through_a_proxy(config: ClientConfig) -> (RedisServer, TcpProxy, LockClient) {
    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port()).await;
    let client = LockClient::connect_with(&proxy.url(), config)
        .await
        .unwrap();
    lock_once(&client, "warm", &LockOptions::new()).await;
    (redis, proxy, client)
}

/// Takes `key` and lets it go, which has the client's connection up.
async fn lock_once(client: &LockClient, key: &str, options: &LockOptions) {
    client
        .acquire(key, options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// The two ways an acquire asks Redis: a plain lock by `SET NX`, a fenced one by the
/// acquire script.
fn plain_and_fenced() -> [(&'static str, LockOptions); 2] {
    let plain = LockOptions::new().lease(Duration::from_secs(10));
    [("plain", plain.clone()), ("fenced", plain.fencing(true))]
}
