//! Semaphores (`permits(n)`): up to n holders of a key at once, across clients and
//! processes, each with a lease of its own; refused on Redlock.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockGuard, LockOptions};
use lock_tests::{RedisServer, TcpProxy};
use tokio::time::Instant;

use crate::behaviour::{Fixture, Topology, on_every_backend};

on_every_backend!(
    a_semaphore_never_has_more_holders_than_permits,
    every_holder_of_a_key_must_agree_on_its_kind,
    a_released_permit_wakes_a_waiting_client,
    a_permit_whose_lease_ends_is_lost_and_returns,
    the_watchdog_renews_a_permit,
    operators_see_the_permits_still_held,
);

/// Holders in a section now, and the most seen at once.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Inside {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn refused_on_redlock(result: Result<impl std::fmt::Debug, LockError>) {
    match result {
        Err(LockError::InvalidOptions { reason, .. }) => assert!(reason.contains("Redlock")),
        other => panic!("a semaphore on Redlock: {other:?}"),
    }
}

async fn a_semaphore_never_has_more_holders_than_permits(fixture: Fixture) {
    const PERMITS: u32 = 3;
    let options = LockOptions::new()
        .permits(PERMITS)
        .timeout(Duration::from_secs(60));
    if fixture.topology == Topology::Redlock {
        return refused_on_redlock(fixture.client.acquire("exports", &options).await);
    }
    let inside = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = fixture.connect().await;
        for _ in 0..4 {
            let (client, inside, options) = (client.clone(), inside.clone(), options.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..15 {
                    let permit = client.acquire("exports", &options).await.unwrap();
                    inside.enter();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.leave();
                    permit.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let most = inside.most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "{most} holders of {PERMITS} permits"
    );
    assert_eq!(most, PERMITS as usize, "the permits were never all in use");
}

async fn every_holder_of_a_key_must_agree_on_its_kind(fixture: Fixture) {
    let three = LockOptions::new().permits(3);
    if fixture.topology == Topology::Redlock {
        return refused_on_redlock(fixture.client.try_acquire("jobs", &three).await);
    }
    let permit = fixture.client.acquire("jobs", &three).await.unwrap();
    let reason = |result: Result<Option<_>, LockError>| match result {
        Err(LockError::InvalidOptions { key, reason, .. }) => {
            assert_eq!(key, "jobs");
            reason
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    };
    for client in [&fixture.client, &fixture.other] {
        let two = reason(
            client
                .try_acquire("jobs", &LockOptions::new().permits(2))
                .await,
        );
        assert!(
            two.contains("3 permits") && two.contains("2 permits"),
            "{two}"
        );
        let lock = reason(client.try_acquire("jobs", &LockOptions::new()).await);
        assert!(
            lock.contains("3 permits") && lock.contains("a lock"),
            "{lock}"
        );
        let shared = LockOptions::new().shared(true);
        let shared = reason(client.try_acquire("jobs", &shared).await);
        assert!(shared.contains("a shared lock"), "{shared}");
    }
    permit.release().await.unwrap();

    let lock = fixture.hold_elsewhere("jobs", LockOptions::new()).await;
    let spinning = LockOptions::new()
        .permits(3)
        .timeout(Duration::from_secs(1));
    let semaphore = reason(fixture.client.acquire("jobs", &spinning).await.map(Some));
    assert!(semaphore.contains("held as a lock"), "{semaphore}");
    lock.release().await.unwrap();
    let once_free = fixture.client.try_acquire("jobs", &three).await.unwrap();
    assert!(
        once_free.is_some(),
        "n lives in the store only while someone holds it"
    );
}

async fn a_released_permit_wakes_a_waiting_client(fixture: Fixture) {
    if fixture.topology == Topology::Redlock {
        return;
    }
    let two = LockOptions::new().permits(2);
    let first = fixture.client.acquire("slots", &two).await.unwrap();
    let second = fixture.client.acquire("slots", &two).await.unwrap();
    // Woken by the release, not by a pause between attempts.
    let patient = two
        .clone()
        .retry_wait(Duration::from_secs(5))
        .timeout(Duration::from_secs(8));
    let other = fixture.other.clone();
    let waiter = tokio::spawn(async move {
        let permit = other.acquire("slots", &patient).await.unwrap();
        (Instant::now(), permit)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "a third holder of two permits");
    let released_at = Instant::now();
    first.release().await.unwrap();
    let (got_at, third) = waiter.await.unwrap();
    let waited = got_at - released_at;
    assert!(
        waited < Duration::from_secs(1),
        "woken {waited:?} after the release"
    );
    second.release().await.unwrap();
    third.release().await.unwrap();
}

async fn a_permit_whose_lease_ends_is_lost_and_returns(fixture: Fixture) {
    if fixture.topology == Topology::Redlock {
        return;
    }
    let lease = Duration::from_millis(300);
    let two = LockOptions::new().permits(2);
    let expiring = fixture
        .client
        .acquire("slots", &two.clone().lease(lease))
        .await
        .unwrap();
    let kept = fixture.client.acquire("slots", &two).await.unwrap();
    assert!(
        fixture
            .other
            .try_acquire("slots", &two)
            .await
            .unwrap()
            .is_none()
    );
    tokio::time::timeout(lease * 2, expiring.lost())
        .await
        .expect("lost() completes when the lease ends");
    assert!(!expiring.is_held());
    // The guard counts itself lost a drift allowance before the store's lease ends.
    let returned = two.retry_wait(Duration::from_millis(5)).timeout(lease);
    let returned = fixture.other.acquire("slots", &returned).await;
    assert!(
        returned.is_ok(),
        "the expired permit did not come back: {returned:?}"
    );
    assert!(kept.is_held(), "the other permit went with it");
    assert!(matches!(
        expiring.release().await,
        Err(LockError::NotHeld { .. })
    ));
    kept.release().await.unwrap();
}

async fn the_watchdog_renews_a_permit(fixture: Fixture) {
    if fixture.topology == Topology::Redlock {
        return;
    }
    let lease = Duration::from_millis(300);
    let two = LockOptions::new().permits(2);
    let renewed = two.clone().lease(lease).watchdog(true);
    let permit = fixture.client.acquire("slots", &renewed).await.unwrap();
    tokio::time::sleep(lease * 3).await;
    assert!(permit.is_held(), "the watchdog let the permit go");
    let second = fixture.other.try_acquire("slots", &two).await.unwrap();
    let third = fixture.other.try_acquire("slots", &two).await.unwrap();
    assert!(second.is_some(), "the renewed permit took both");
    assert!(
        third.is_none(),
        "the renewed permit was not held in the store"
    );
    permit.release().await.unwrap();
    second.unwrap().release().await.unwrap();
}

async fn operators_see_the_permits_still_held(fixture: Fixture) {
    if fixture.topology == Topology::Redlock {
        return;
    }
    let two = LockOptions::new().permits(2);
    let long = fixture
        .client
        .acquire("slots", &two.clone().lease(Duration::from_secs(30)))
        .await
        .unwrap();
    let short = fixture
        .other
        .acquire("slots", &two.lease(Duration::from_millis(400)))
        .await
        .unwrap();
    long.release().await.unwrap();
    let left = fixture.client.lease_left("slots").await.unwrap();
    assert!(
        left.is_some_and(|left| left <= Duration::from_millis(400)),
        "the lease left is the released permit's: {left:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!fixture.client.is_locked("slots").await.unwrap());
    drop(short);
}

/// Permits pass from task to task of one client with no round trip, each chain
/// holding one permit, as a lock does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_handed_between_tasks_of_a_client() {
    let redis = RedisServer::start();
    let config = ClientConfig::new().hand_off(32, Duration::from_secs(10));
    let client = LockClient::connect_with(&redis.url(), config)
        .await
        .unwrap();
    let two = LockOptions::new().permits(2);
    let first = client.acquire("slots", &two).await.unwrap();
    let second = client.acquire("slots", &two).await.unwrap();
    let inside = Arc::new(Inside::default());
    let mut waiting = Vec::new();
    for _ in 0..6 {
        let (client, two, inside) = (client.clone(), two.clone(), inside.clone());
        waiting.push(tokio::spawn(async move {
            let permit = client.acquire("slots", &two).await.unwrap();
            inside.enter();
            tokio::time::sleep(Duration::from_millis(2)).await;
            inside.leave();
            permit.release().await.unwrap();
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let calls = redis.lock_calls();
    first.release().await.unwrap();
    second.release().await.unwrap();
    for task in waiting {
        task.await.unwrap();
    }
    assert!(inside.most.load(Ordering::SeqCst) <= 2);
    // The two chains end with one release each.
    assert_eq!(redis.lock_calls() - calls, 2, "a hand-off went to Redis");
}

/// The central claim across processes: three processes taking turns with two
/// permits never have three holders inside, and do have two.
#[test]
fn processes_never_hold_more_permits_than_there_are() {
    let redis = RedisServer::start();
    let most = most_at_once_in_processes(&redis, "exports", "permits=2");
    assert_eq!(most, 2, "two processes never held the two permits at once");
}

/// Runs three `family-worker` processes of 60 sections each on `key` (a third of
/// `LOCK_CHAOS_SECTIONS` each when it is set, for `scripts/chaos`), taken as `kind`
/// says, and returns the most holders any of them saw inside at once. Fails when
/// any saw more than the kind allows.
pub(crate) fn most_at_once_in_processes(redis: &RedisServer, key: &str, kind: &str) -> usize {
    let sections = std::env::var("LOCK_CHAOS_SECTIONS")
        .ok()
        .and_then(|sections| sections.parse::<usize>().ok())
        .map_or(60, |sections| sections.div_ceil(3));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_family-worker"))
                .args([&redis.url(), key, &sections.to_string(), kind])
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a worker")
        })
        .collect();
    let mut most = 0;
    for worker in workers {
        let output = worker.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "a worker saw an overlap: {said}");
        let at_once = said.trim().rsplit('=').next().unwrap();
        most = most.max(at_once.parse::<usize>().unwrap());
    }
    eprintln!(
        "family {kind}: {} sections in 3 processes, at most {most} inside at once; \
         violations: 0",
        sections * 3
    );
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permit_returns_after_its_lease() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(1500);
    let hold = || {
        let mut holder = Command::new(env!("CARGO_BIN_EXE_lock-holder"))
            .args([&redis.url(), "exports", &lease.as_millis().to_string(), "2"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a holder process");
        let mut said = String::new();
        BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut said)
            .unwrap();
        assert_eq!(said.trim(), "held");
        holder
    };
    // The first permit's lease runs from its grant, which is after this and before
    // the second holder starts: a slow start of the second must not count.
    let first_asked_at = Instant::now();
    let mut holders = [hold(), hold()];
    let killed_at = Instant::now();
    for holder in &mut holders {
        holder.kill().expect("SIGKILL a holder");
        holder.wait().unwrap();
    }
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let two = LockOptions::new().permits(2);
    assert!(
        client.try_acquire("exports", &two).await.unwrap().is_none(),
        "the dead holders' leases still run"
    );
    let waiting = two.retry_wait(Duration::from_millis(10)).timeout(lease * 2);
    let permit = client.acquire("exports", &waiting).await.unwrap();
    let since_asked = first_asked_at.elapsed();
    assert!(
        since_asked >= lease - Duration::from_millis(200),
        "a permit came back before its lease ended: {since_asked:?}"
    );
    let waited = killed_at.elapsed();
    assert!(
        waited <= lease + Duration::from_millis(500),
        "a permit came back late: {waited:?}"
    );
    permit.release().await.unwrap();
}

/// A permit handed on to a task of the client that is gone before it runs goes on
/// to the next task, or back to Redis, at once; it is never left held by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_handed_to_a_task_that_was_cancelled_goes_back_at_once() {
    let redis = RedisServer::start();
    let config = ClientConfig::new().hand_off(32, Duration::from_secs(10));
    let client = LockClient::connect_with(&redis.url(), config)
        .await
        .unwrap();
    let other = LockClient::connect(&redis.url()).await.unwrap();
    let three = LockOptions::new().permits(3);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(client.acquire("exports", &three).await.unwrap());
    }
    let patient = three.clone().timeout(Duration::from_secs(10));
    let mut waiting = Box::pin(client.acquire("exports", &patient));
    let waited = tokio::time::timeout(Duration::from_millis(100), waiting.as_mut()).await;
    assert!(waited.is_err(), "a fourth holder of three permits");

    // The release hands the permit to the waiting task, which is cancelled before
    // it runs again.
    held.pop().unwrap().release().await.unwrap();
    drop(waiting);

    let asked_at = Instant::now();
    let elsewhere = other
        .acquire("exports", &three.clone().timeout(Duration::from_secs(2)))
        .await;
    let elsewhere = elsewhere.expect("the permit of the cancelled task was held by nobody");
    assert!(
        asked_at.elapsed() < Duration::from_millis(500),
        "the permit came back only after {:?}",
        asked_at.elapsed()
    );
    assert!(held.iter().all(LockGuard::is_held));
    for permit in held {
        permit.release().await.unwrap();
    }
    elsewhere.release().await.unwrap();
}

/// A request that clashes with the kind of the waiter that Redis lets in as it asks
/// learns so from that answer, not from one after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clash_with_the_waiter_let_in_is_refused_at_once() {
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let lease = Duration::from_millis(400);
    let three = LockOptions::new().permits(3);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            holder
                .acquire("jobs", &three.clone().lease(lease))
                .await
                .unwrap(),
        );
    }
    // A client waits in Redis's queue for a permit, then its traffic stops: it does
    // not take the lock up itself when the leases end.
    let proxy = TcpProxy::start(redis.port()).await;
    let frozen = LockClient::connect(&proxy.url()).await.unwrap();
    let patient = three.clone().timeout(Duration::from_secs(20));
    let frozen = tokio::spawn(async move { frozen.acquire("jobs", &patient).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    proxy.stall();
    for permit in &held {
        permit.lost().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;

    let newcomer = LockClient::connect(&redis.url()).await.unwrap();
    let reading = newcomer
        .try_acquire("jobs", &LockOptions::new().shared(true))
        .await;
    match reading {
        Err(LockError::InvalidOptions { key, reason, .. }) => {
            assert_eq!(key, "jobs");
            assert!(reason.contains("3 permits"), "{reason}");
        }
        other => panic!("a shared hold beside a semaphore's waiter: {other:?}"),
    }
    frozen.abort();
    proxy.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_handed_to_a_task_that_was_cancelled_goes_on_to_the_next_task() {
    let redis = RedisServer::start();
    let config = ClientConfig::new().hand_off(32, Duration::from_secs(10));
    let client = LockClient::connect_with(&redis.url(), config)
        .await
        .unwrap();
    let three = LockOptions::new().permits(3);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(client.acquire("exports", &three).await.unwrap());
    }
    let patient = three.clone().timeout(Duration::from_secs(10));
    let mut cancelled = Box::pin(client.acquire("exports", &patient));
    let waited = tokio::time::timeout(Duration::from_millis(100), cancelled.as_mut()).await;
    assert!(waited.is_err(), "a fourth holder of three permits");
    let next = tokio::spawn({
        let (client, patient) = (client.clone(), patient.clone());
        async move { client.acquire("exports", &patient).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let calls = redis.lock_calls();
    held.pop().unwrap().release().await.unwrap();
    drop(cancelled);
    let next = next.await.unwrap().expect("the next task gets the permit");
    assert_eq!(
        redis.lock_calls(),
        calls,
        "the permit went back to Redis with a task waiting for it"
    );
    held.push(next);
    for permit in held {
        permit.release().await.unwrap();
    }
}
