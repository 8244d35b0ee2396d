//! Redlock under faults, on five real masters: what survives a minority failing,
//! what a majority restarting empty breaks (the documented case), and how AOF with
//! `appendfsync always` prevents it.

use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient, LockError, LockOptions};
use lock_tests::{RedisServer, TcpProxy};
use redis::Commands;
use tokio::time::Instant;

fn masters(args: &[&str]) -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::start_with(args)).collect()
}

async fn redlock(masters: &[RedisServer]) -> LockClient {
    LockClient::redlock(masters.iter().map(RedisServer::url))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_keeps_locking_and_a_majority_down_is_a_quorum_error() {
    let mut masters = masters(&[]);
    let client = redlock(&masters).await;
    masters[0].kill();
    masters[1].kill();
    let guard = client
        .acquire("payroll", &LockOptions::new())
        .await
        .expect("3 of 5 grant it");
    guard.release().await.unwrap();

    masters[2].kill();
    let started = Instant::now();
    let result = client.acquire("payroll", &LockOptions::new()).await;
    let elapsed = started.elapsed();
    match result {
        Err(LockError::Quorum {
            key,
            granted,
            needed,
            ..
        }) => {
            assert_eq!((key.as_str(), granted, needed), ("payroll", 2, 3));
        }
        other => panic!("expected a Quorum error, got {other:?}"),
    }
    assert!(
        elapsed < Duration::from_secs(1),
        "the error took {elapsed:?}"
    );
    let lingering: bool = masters[3].connection().exists("lock:{payroll}").unwrap();
    assert!(
        !lingering,
        "the failed attempt was undone on the nodes that granted it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_restarting_empty_lets_a_second_holder_in_but_tokens_still_order_them() {
    let mut masters = masters(&[]);
    let first = redlock(&masters).await;
    let options = LockOptions::new()
        .fencing(true)
        .lease(Duration::from_secs(10));
    let early = first.acquire("ledger", &options).await.unwrap();

    for master in &mut masters[..3] {
        master.restart();
    }
    let second = redlock(&masters).await;
    let late = second
        .acquire("ledger", &options.clone().spin(false))
        .await
        .expect("without persistence, three empty masters grant the lock again");
    assert!(
        early.is_held(),
        "the first holder cannot know: this is the documented unsafe case"
    );
    assert!(
        late.fencing_token() > early.fencing_token(),
        "the two surviving masters carry the first token forward: {:?} then {:?}",
        early.fencing_token(),
        late.fencing_token()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_aof_always_a_restarted_majority_keeps_the_lock() {
    let mut masters = masters(&["--appendonly", "yes", "--appendfsync", "always"]);
    let first = redlock(&masters).await;
    let options = LockOptions::new()
        .fencing(true)
        .lease(Duration::from_secs(10));
    let held = first.acquire("ledger", &options).await.unwrap();

    for master in &mut masters[..3] {
        master.restart();
    }
    let second = redlock(&masters).await;
    let busy = second
        .acquire("ledger", &LockOptions::new().spin(false))
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    assert!(held.is_held());
    let held_token = held.fencing_token();
    held.release().await.unwrap();
    let next = second.acquire("ledger", &options).await.unwrap();
    assert!(
        next.fencing_token() > held_token,
        "the counters survived the restart too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_reports_the_loss_when_a_majority_refuses_renewal() {
    let masters = masters(&[]);
    let client = redlock(&masters).await;
    let lease = Duration::from_millis(300);
    let guard = client
        .acquire("batch", &LockOptions::new().lease(lease).watchdog(true))
        .await
        .unwrap();
    for master in &masters[..3] {
        let () = master.connection().del("lock:{batch}").unwrap();
    }
    let deleted_at = Instant::now();
    guard.lost().await;
    let noticed = deleted_at.elapsed();
    assert!(
        noticed <= lease / 3 + Duration::from_millis(200),
        "noticed after {noticed:?}"
    );
}

/// Every master grants at once, and every answer comes back after the lease: the
/// majority is gathered too late to hold anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_gathered_after_the_lease_is_over_grants_nothing() {
    let masters = masters(&[]);
    let mut proxies = Vec::new();
    for master in &masters {
        proxies.push(TcpProxy::start(master.port()).await);
    }
    let patient = ClientConfig::new().command_timeout(Duration::from_secs(5));
    let client = LockClient::redlock_with(proxies.iter().map(TcpProxy::url), patient)
        .await
        .unwrap();
    let lease = Duration::from_millis(300);
    for proxy in &proxies {
        proxy.delay_answers(lease + Duration::from_millis(100));
    }
    let expired = LockOptions::new().lease(lease).spin(false);
    let result = client.acquire("flash", &expired).await;
    assert!(matches!(result, Err(LockError::Busy { .. })), "{result:?}");
    for proxy in &proxies {
        proxy.resume();
    }
    let fine = client.acquire("flash", &expired).await.unwrap();
    assert!(fine.is_held());
}

/// Two of five masters silent (their hosts gone without a word) cost each call
/// the 200 ms a master is given, once: a request is not sent again to a master that
/// did not answer in time. Locking goes on with the other three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_minority_costs_each_call_its_bound_and_locking_goes_on() {
    let masters = masters(&[]);
    masters[0].freeze();
    masters[1].freeze();
    let client = redlock(&masters).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        let guard = client.acquire("payroll", &LockOptions::new()).await;
        let released = guard.unwrap().release().await;
        slowest = slowest.max(started.elapsed());
        released.unwrap();
    }
    masters[0].thaw();
    masters[1].thaw();
    assert!(
        slowest < Duration::from_millis(600),
        "a lock taken and given back took {slowest:?} with two masters silent"
    );
}

/// Two of five masters grant the lock while three hold it for another: what the
/// two granted is given back, and every attempt after it asks under a new token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_too_few_masters_made_is_not_asked_for_again_under_its_token() {
    let masters = masters(&[]);
    let mut holders = Vec::new();
    for master in &masters[2..] {
        let other = LockClient::connect(&master.url()).await.unwrap();
        holders.push(other.acquire("payout", &LockOptions::new()).await.unwrap());
    }
    let client = redlock(&masters).await;
    let monitor = masters[0].monitor();
    let options = LockOptions::new().timeout(Duration::from_millis(1_500));
    let refused = client.acquire("payout", &options).await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );
    let tokens = monitor.stop_with_tokens_asked_for("lock:{payout}");

    crate::assert_each_token_asked_for_once(&tokens);
    for holder in holders {
        assert!(holder.is_held());
    }
}
