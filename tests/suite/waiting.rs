//! Waiting without polling: a release passes the lock to the first waiting client
//! and wakes only that one, one client's tasks queue locally in order, a waiter that
//! died costs a short claim window, and a lost notification costs at most one pause.
//! Hand-off is off where it counts requests, so that each section goes to Redis
//! (`hand_off.rs` has it on).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockOptions};
use lock_tests::{CountingProxy, RedisServer, TcpProxy};
use tokio::time::Instant;

/// A client that releases every lock to Redis, however many of its tasks wait.
async fn without_hand_off(url: &str) -> LockClient {
    let config = ClientConfig::new().hand_off(0, Duration::ZERO);
    LockClient::connect_with(url, config).await.unwrap()
}

fn patient(retry_wait: Duration) -> LockOptions {
    LockOptions::new()
        .retry_wait(retry_wait)
        .timeout(Duration::from_secs(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_long_before_its_pause_ends() {
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let waiter = LockClient::connect(&redis.url()).await.unwrap();
    let guard = holder
        .acquire("seat-12", &LockOptions::new())
        .await
        .unwrap();
    let retry_wait = Duration::from_secs(5);
    let waiting =
        tokio::spawn(async move { waiter.acquire("seat-12", &patient(retry_wait)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let handed_to = waiting.await.unwrap().expect("the waiter gets the lock");
    let handed_over = released_at.elapsed();
    assert!(handed_to.is_held());
    assert!(
        handed_over < retry_wait / 10,
        "the waiter polled instead of being woken: {handed_over:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_client_queue_locally_in_order() {
    let redis = RedisServer::start();
    let client = without_hand_off(&redis.url()).await;
    let first = client
        .acquire("printer", &LockOptions::new())
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for task in 0..10 {
        let (client, order) = (client.clone(), order.clone());
        let (started, started_rx) = tokio::sync::oneshot::channel();
        waiters.push(tokio::spawn(async move {
            let _ = started.send(());
            let guard = client
                .acquire("printer", &patient(Duration::from_millis(50)))
                .await
                .unwrap();
            order.lock().unwrap().push(task);
            guard.release().await.unwrap();
        }));
        // Queued in this order: each task is in line before the next one starts.
        started_rx.await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let trips_before = redis.lock_calls();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        redis.lock_calls(),
        trips_before,
        "queued tasks asked Redis while the lock was held"
    );
    first.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        (0..10).collect::<Vec<_>>(),
        "first come, first served"
    );
    // The first release, then one acquire and one release per queued task.
    assert_eq!(redis.lock_calls() - trips_before, 1 + 2 * 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_notification_costs_at_most_one_pause() {
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let waiter = LockClient::connect(&redis.url()).await.unwrap();
    let guard = holder
        .acquire("locker-7", &LockOptions::new())
        .await
        .unwrap();
    let retry_wait = Duration::from_millis(400);
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire("locker-7", &patient(retry_wait)).await;
        guard.unwrap().release().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        redis.calls("subscribe"),
        1,
        "the waiter listens for the release"
    );

    let _killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query(&mut redis.connection())
        .unwrap();
    let released_at = Instant::now();
    guard.release().await.unwrap();
    waiting.await.unwrap();
    let handed_over = released_at.elapsed();
    assert!(
        handed_over <= retry_wait + Duration::from_millis(200),
        "took {handed_over:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sees_one_waiter_per_client() {
    let redis = RedisServer::start();
    let client = without_hand_off(&redis.url()).await;
    // What connecting asked (a probe of the server's commands) is not a section's.
    let connected = redis.lock_calls();
    const TASKS: u64 = 16;
    const SECTIONS: u64 = 20;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                for _ in 0..SECTIONS {
                    let guard = client
                        .acquire("hot", &patient(Duration::from_millis(50)))
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let sections = TASKS * SECTIONS;
    assert_eq!(
        redis.lock_calls() - connected,
        2 * sections,
        "one acquire and one release per section"
    );
}

/// Starts `clients` clients, each with one task waiting for `key` in this order, each
/// in Redis's queue before the next starts. Each holds the lock for `work` and notes
/// its number.
async fn waiting_clients(
    url: &str,
    key: &'static str,
    clients: usize,
    order: &Arc<Mutex<Vec<usize>>>,
    work: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut waiting = Vec::new();
    for number in 0..clients {
        let client = without_hand_off(url).await;
        let order = order.clone();
        waiting.push(tokio::spawn(async move {
            let guard = client
                .acquire(key, &patient(Duration::from_secs(5)))
                .await
                .unwrap();
            order.lock().unwrap().push(number);
            tokio::time::sleep(work).await;
            guard.release().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    waiting
}

/// The requests that take or free a lock: scripts, `SET`, and the server's own
/// compare-and-delete where it has one.
fn asked(requests: &lock_tests::CommandCounts) -> u64 {
    requests.get("EVALSHA") + requests.get("SET") + requests.native_compare_and_deletes()
}

/// A section shorter than the claim window.
const MOMENT: Duration = Duration::from_millis(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_passes_the_lock_to_one_waiting_client_at_a_time() {
    let redis = RedisServer::start();
    let proxy = CountingProxy::start(redis.port()).await;
    let holder = without_hand_off(&proxy.url()).await;
    let guard = holder
        .acquire("ticket-desk", &LockOptions::new())
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiting = waiting_clients(&proxy.url(), "ticket-desk", 3, &order, MOMENT).await;
    let _before = proxy.take();
    let released_at = Instant::now();
    guard.release().await.unwrap();
    for waiter in waiting {
        waiter.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        [0, 1, 2],
        "first come, first served"
    );
    // The holder's release, then each waiter's claim and release, and a second
    // request for each release that let a waiter in: no waiter asked again for a
    // lock that went to another.
    let requests = proxy.take();
    assert_eq!(asked(&requests), 1 + 2 * 3 + 3, "{requests:?}");
    assert!(
        released_at.elapsed() < Duration::from_secs(2),
        "the waiters polled at their 5 s pause instead of being told"
    );
}

/// Each waiter that the lock is passed to tells the next in the queue, which was
/// told to look again in case the claim never came, that it need not: with sections
/// longer than the claim window, no waiter asks Redis more than once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_told_to_look_again_asks_nothing_when_the_claim_comes_in_time() {
    let redis = RedisServer::start();
    let proxy = CountingProxy::start(redis.port()).await;
    let holder = without_hand_off(&proxy.url()).await;
    let guard = holder
        .acquire("ticket-desk", &LockOptions::new())
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let longer_than_the_claim_window = Duration::from_millis(250);
    let waiting = waiting_clients(
        &proxy.url(),
        "ticket-desk",
        4,
        &order,
        longer_than_the_claim_window,
    )
    .await;
    let _before = proxy.take();
    guard.release().await.unwrap();
    for waiter in waiting {
        waiter.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
    let requests = proxy.take();
    assert_eq!(
        asked(&requests),
        1 + 2 * 4 + 4,
        "a waiter looked again although the one ahead claimed the lock: {requests:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lock_goes_to_the_waiter_not_to_a_newcomer() {
    let redis = RedisServer::start();
    let holder = without_hand_off(&redis.url()).await;
    let newcomer = without_hand_off(&redis.url()).await;
    for _ in 0..5 {
        let guard = holder
            .acquire("last-seat", &LockOptions::new())
            .await
            .unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiting = waiting_clients(&redis.url(), "last-seat", 1, &order, MOMENT).await;
        guard.release().await.unwrap();
        let barged = newcomer
            .try_acquire("last-seat", &LockOptions::new())
            .await
            .unwrap();
        assert!(barged.is_none(), "a newcomer took the lock from the waiter");
        for waiter in waiting {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_died_holds_the_lock_only_for_a_moment() {
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let guard = holder
        .acquire("night-batch", &LockOptions::new())
        .await
        .unwrap();
    // A process that waits for the lock, first in line, then dies.
    let mut dead = Command::new(env!("CARGO_BIN_EXE_lock-holder"))
        .args([&redis.url(), "night-batch", "30000"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the waiting process");
    tokio::time::sleep(Duration::from_millis(300)).await;
    dead.kill().expect("SIGKILL the waiter");
    dead.wait().unwrap();

    let waiter = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(40));
    let waiting = tokio::spawn(async move { waiter.acquire("night-batch", &options).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let next = waiting
        .await
        .unwrap()
        .expect("the live waiter gets the lock");
    let waited = released_at.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "the dead waiter kept the lock for {waited:?}"
    );
    let mut said = String::new();
    BufReader::new(dead.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert_eq!(said, "", "the dead waiter never held the lock");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_or_is_dropped_leaves_the_queue() {
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let quitter = LockClient::connect(&redis.url()).await.unwrap();
    let newcomer = LockClient::connect(&redis.url()).await.unwrap();
    for dropped in [false, true] {
        let guard = holder
            .acquire("gift-card", &LockOptions::new())
            .await
            .unwrap();
        let waiting = {
            let quitter = quitter.clone();
            let impatient = LockOptions::new().timeout(Duration::from_millis(200));
            tokio::spawn(async move { quitter.acquire("gift-card", &impatient).await })
        };
        if dropped {
            tokio::time::sleep(Duration::from_millis(100)).await;
            waiting.abort();
        } else {
            let gave_up = waiting.await.unwrap();
            assert!(
                matches!(gave_up, Err(LockError::Timeout { .. })),
                "{gave_up:?}"
            );
        }
        quitter.shutdown().await;
        guard.release().await.unwrap();
        let next = newcomer
            .try_acquire("gift-card", &LockOptions::new())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the lock went to a waiter that left (dropped: {dropped})"));
        next.release().await.unwrap();
    }
}

/// A lock held on one client, with a waiting client first in Redis's queue whose
/// traffic then stops (it will never claim the lock passed to it), and `behind`
/// waiting clients after it, each in the queue before the next. Each of those notes
/// when it got the lock, and holds it until the guard is dropped.
struct BehindFrozenWaiter {
    guard: lock_runtime::LockGuard,
    proxy: TcpProxy,
    frozen: tokio::task::JoinHandle<Result<lock_runtime::LockGuard, LockError>>,
    behind: Vec<tokio::task::JoinHandle<(Instant, lock_runtime::LockGuard)>>,
}

async fn behind_a_frozen_waiter(
    redis: &RedisServer,
    key: &'static str,
    behind: usize,
) -> BehindFrozenWaiter {
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let guard = holder.acquire(key, &LockOptions::new()).await.unwrap();
    let proxy = TcpProxy::start(redis.port()).await;
    let frozen = LockClient::connect(&proxy.url()).await.unwrap();
    let frozen =
        tokio::spawn(async move { frozen.acquire(key, &patient(Duration::from_secs(10))).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut waiting = Vec::new();
    for _ in 0..behind {
        let waiter = LockClient::connect(&redis.url()).await.unwrap();
        waiting.push(tokio::spawn(async move {
            let guard = waiter
                .acquire(key, &patient(Duration::from_secs(5)))
                .await
                .unwrap();
            (Instant::now(), guard)
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    proxy.stall();
    BehindFrozenWaiter {
        guard,
        proxy,
        frozen,
        behind: waiting,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_never_claims_costs_the_next_one_the_claim_window() {
    let redis = RedisServer::start();
    let queue = behind_a_frozen_waiter(&redis, "night-batch", 1).await;
    let released_at = Instant::now();
    queue.guard.release().await.unwrap();
    for next in queue.behind {
        let (got_at, guard) = next.await.unwrap();
        let waited = got_at - released_at;
        assert!(
            waited < Duration::from_secs(1),
            "the lock passed to a frozen waiter reached the next one after {waited:?}"
        );
        guard.release().await.unwrap();
    }
    queue.frozen.abort();
    queue.proxy.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_waiter_looks_again_when_the_one_told_to_leaves_the_queue() {
    let redis = RedisServer::start();
    let mut queue = behind_a_frozen_waiter(&redis, "night-batch", 2).await;
    let released_at = Instant::now();
    queue.guard.release().await.unwrap();
    // The one told to look again after the frozen waiter's claim window leaves.
    queue.behind.remove(0).abort();
    let (got_at, guard) = queue.behind.remove(0).await.unwrap();
    let waited = got_at - released_at;
    assert!(
        waited < Duration::from_secs(1),
        "the last waiter got the lock {waited:?} after the release"
    );
    guard.release().await.unwrap();
    queue.frozen.abort();
    queue.proxy.resume();
}

/// On a hot key, telling the next waiter to look again in case those let in ahead of
/// it do not claim the lock costs no request: a section costs one acquire to claim
/// the lock, one for the next task to join the queue, and the release: a
/// compare-and-delete, then the script that lets the queue in when a waiter is
/// queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_costs_two_acquires_and_a_release_per_section() {
    let (sections, requests) = hot_key(3, 2, 25, Duration::from_millis(1)).await;
    let script = |name: &str| {
        let hashes = lock_runtime::__script_hashes();
        hashes
            .into_iter()
            .find(|(script, _)| *script == name)
            .unwrap()
            .1
    };
    let compare_and_delete =
        requests.script(script("release_alone")) + requests.native_compare_and_deletes();
    assert_eq!(compare_and_delete, sections);
    assert!(requests.script(script("release")) <= sections);
    let acquires = requests.script(script("acquire")) + requests.get("SET");
    // A claim that came too late to stop a look, under load, is not what this
    // counts; a look per section is.
    assert!(
        acquires <= 2 * sections + sections / 10,
        "{acquires} acquires for {sections} sections: {requests:?}"
    );
}

/// Runs `clients` clients of `tasks` tasks each, every task taking the key for
/// `work` `sections` times, all through a counting proxy; returns the sections and
/// the requests they cost.
async fn hot_key(
    clients: usize,
    tasks: usize,
    sections: usize,
    work: Duration,
) -> (u64, lock_tests::CommandCounts) {
    let redis = RedisServer::start();
    let proxy = CountingProxy::start(redis.port()).await;
    let mut connected = Vec::new();
    for _ in 0..clients {
        connected.push(without_hand_off(&proxy.url()).await);
    }
    let _connecting = proxy.take();
    let mut running = Vec::new();
    for client in &connected {
        for _ in 0..tasks {
            let client = client.clone();
            running.push(tokio::spawn(async move {
                for _ in 0..sections {
                    let guard = client
                        .acquire("hot", &patient(Duration::from_secs(5)))
                        .await
                        .unwrap();
                    tokio::time::sleep(work).await;
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in running {
        task.await.unwrap();
    }
    ((clients * tasks * sections) as u64, proxy.take())
}
