//! Hand-off within a client: a lock passes from task to task with no round trip,
//! within the client's bounds, keeps one owner at a time, and keeps fencing tokens
//! growing along the chain.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use lock_runtime::history::History;
use lock_runtime::{ClientConfig, LockClient, LockError, LockGuard, LockOptions};
use lock_tests::RedisServer;

async fn client_with(redis: &RedisServer, most: u16, within: Duration) -> LockClient {
    let config = ClientConfig::new().hand_off(most, within);
    LockClient::connect_with(&redis.url(), config)
        .await
        .unwrap()
}

/// Queues `tasks` tasks of `client` behind `first`, then lets `first` go; each task
/// holds the lock briefly. Returns the history of their holdings.
async fn queue_behind(
    client: &LockClient,
    first: LockGuard,
    tasks: usize,
    options: &LockOptions,
) -> Arc<History> {
    let history = Arc::new(History::new());
    let mut waiting = Vec::new();
    for task in 0..tasks {
        let (client, options, history) = (client.clone(), options.clone(), history.clone());
        let (started, started_rx) = tokio::sync::oneshot::channel();
        waiting.push(tokio::spawn(async move {
            let _ = started.send(());
            let guard = client.acquire("press", &options).await.unwrap();
            let from = SystemTime::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert!(guard.is_held());
            history.record_guard(format!("task {task}"), &guard, from);
            guard.release().await.unwrap();
        }));
        // In line, each behind the one before, before the next one starts.
        started_rx.await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.release().await.unwrap();
    for task in waiting {
        task.await.unwrap();
    }
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_hand_offs_asks_redis_nothing_and_tokens_keep_growing() {
    let redis = RedisServer::start();
    let client = client_with(&redis, 32, Duration::from_secs(10)).await;
    let options = LockOptions::new().fencing(true);
    let first = client.acquire("press", &options).await.unwrap();
    let first_token = first.fencing_token().unwrap();
    let calls = redis.lock_calls();
    let history = queue_behind(&client, first, 10, &options).await;
    assert_eq!(
        redis.lock_calls() - calls,
        1,
        "ten hand-offs, then one release to Redis"
    );
    assert_eq!(
        history.check(),
        Ok(10),
        "holders overlapped or tokens went back"
    );

    let next = client.acquire("press", &options).await.unwrap();
    assert!(
        next.fencing_token().unwrap() > first_token + 10,
        "the next acquisition's token is above every token of the chain"
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_past_its_bound_stays_in_the_client_while_no_other_client_waits() {
    let redis = RedisServer::start();
    let client = client_with(&redis, 4, Duration::from_secs(10)).await;
    let other = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new().fencing(true);
    for another_gave_up in [false, true] {
        let first = client.acquire("press", &options).await.unwrap();
        let first_token = first.fencing_token().unwrap();
        if another_gave_up {
            // It joined the queue behind `first` and left it: nobody waits again.
            let impatient = LockOptions::new().timeout(Duration::from_millis(100));
            let gave_up = other.acquire("press", &impatient).await;
            assert!(matches!(gave_up, Err(LockError::Timeout { .. })));
            other.shutdown().await;
        }
        let (calls, reads) = (redis.lock_calls(), redis.calls("get"));
        let history = queue_behind(&client, first, 10, &options).await;
        assert_eq!(history.check(), Ok(10));
        assert_eq!(
            redis.lock_calls() - calls,
            1,
            "ten hand-offs in chains of at most four, each found with nobody else \
             waiting: no acquisition but the first, and one release (another client \
             came and gave up first: {another_gave_up})"
        );
        // One check halfway through each chain of four, and a read in the release
        // script where the server has no compare-and-delete of its own.
        let checks = redis.calls("get") - reads;
        assert!(
            (1..=6).contains(&checks),
            "{checks} checks for ten hand-offs"
        );

        let next = client.acquire("press", &options).await.unwrap();
        assert!(next.fencing_token().unwrap() > first_token + 10);
        next.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_queued_in_redis_gets_the_lock_within_the_hand_off_bound() {
    let redis = RedisServer::start();
    let most = 4;
    let holder = client_with(&redis, most, Duration::from_secs(10)).await;
    let other = client_with(&redis, most, Duration::from_secs(10)).await;
    let options = LockOptions::new();
    let first = holder.acquire("press", &options).await.unwrap();
    let sections = Arc::new(AtomicUsize::new(0));
    let waiting = {
        let (options, sections) = (options.clone(), sections.clone());
        tokio::spawn(async move {
            let guard = other.acquire("press", &options).await.unwrap();
            let before = sections.load(Ordering::SeqCst);
            guard.release().await.unwrap();
            before
        })
    };
    // In Redis's queue before the holder's chain starts.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut chain = Vec::new();
    for _ in 0..12 {
        let (holder, options, sections) = (holder.clone(), options.clone(), sections.clone());
        let (started, started_rx) = tokio::sync::oneshot::channel();
        chain.push(tokio::spawn(async move {
            let _ = started.send(());
            let guard = holder.acquire("press", &options).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
            sections.fetch_add(1, Ordering::SeqCst);
            guard.release().await.unwrap();
        }));
        started_rx.await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.release().await.unwrap();
    let before = waiting.await.unwrap();
    for task in chain {
        task.await.unwrap();
    }
    assert!(
        before <= usize::from(most),
        "{before} sections of the holder's chain ran while another client waited in Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_needs_more_than_the_hold_gives_goes_to_redis() {
    let redis = RedisServer::start();
    let client = client_with(&redis, 32, Duration::from_secs(10)).await;
    let first = client.acquire("press", &LockOptions::new()).await.unwrap();
    let calls = redis.lock_calls();
    let fenced = LockOptions::new().fencing(true);
    let history = queue_behind(&client, first, 1, &fenced).await;
    assert_eq!(history.check(), Ok(1));
    // The unfenced acquisition is released, the waiter takes a fenced one, and
    // releases it: a script that sets (counted twice), and two releases.
    assert_eq!(redis.lock_calls() - calls, 1 + 2 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_that_handed_its_lock_on_holds_nothing() {
    let redis = RedisServer::start();
    let client = client_with(&redis, 32, Duration::from_secs(10)).await;
    let other = LockClient::connect(&redis.url()).await.unwrap();
    let options = LockOptions::new();
    let first = client.acquire("press", &options).await.unwrap();
    let view = first
        .scope(client.acquire("press", &options))
        .await
        .unwrap();
    let next = tokio::spawn({
        let client = client.clone();
        let options = options.clone();
        async move { client.acquire("press", &options).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.release().await.unwrap();
    let next = next.await.unwrap().unwrap();
    assert!(next.is_held());
    assert!(!view.is_held(), "a view of the first hold outlived it");
    assert!(
        matches!(view.release().await, Err(LockError::NotHeld { .. })),
        "the first hold's view cannot end the next hold"
    );
    assert!(next.is_held());
    assert!(
        other
            .try_acquire("press", &options)
            .await
            .unwrap()
            .is_none(),
        "the lock stayed held across the hand-off"
    );
    next.release().await.unwrap();
    assert!(
        other
            .try_acquire("press", &options)
            .await
            .unwrap()
            .is_some(),
        "the last holder released it to Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_is_handed_on_and_renewed_only_for_a_taker_that_outlives_it() {
    let redis = RedisServer::start();
    let client = client_with(&redis, 32, Duration::from_secs(10)).await;
    let lease = Duration::from_millis(1500);
    let options = LockOptions::new().lease(lease).fencing(true);
    let first = client.acquire("press", &options).await.unwrap();
    let first_token = first.fencing_token().unwrap();
    let calls = redis.lock_calls();
    let history = Arc::new(History::new());
    let mut waiting = Vec::new();
    for task in 0..5 {
        // The last one holds until well past the end of the lease it is handed.
        let hold = match task {
            4 => Duration::from_millis(1200),
            _ => Duration::from_millis(1),
        };
        let (client, options, history) = (client.clone(), options.clone(), history.clone());
        let (started, started_rx) = tokio::sync::oneshot::channel();
        waiting.push(tokio::spawn(async move {
            let _ = started.send(());
            let guard = client.acquire("press", &options).await.unwrap();
            let from = SystemTime::now();
            tokio::time::sleep(hold).await;
            assert!(guard.is_held(), "task {task} lost the lease it was owed");
            let left = client.lease_left("press").await.unwrap();
            assert!(left.is_some(), "task {task} holds a lock Redis let go");
            history.record_guard(format!("task {task}"), &guard, from);
            guard.release().await.unwrap();
        }));
        started_rx.await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Long enough that the lease handed on ends during the last task's section.
    tokio::time::sleep(Duration::from_millis(800)).await;
    first.release().await.unwrap();
    for task in waiting {
        task.await.unwrap();
    }
    assert_eq!(
        history.check(),
        Ok(5),
        "holders overlapped or tokens went back"
    );
    // One renewal, for the task that outlived the lease it was handed, and one
    // release. Renewing at every take-over would cost five.
    assert_eq!(
        redis.lock_calls() - calls,
        1 + 1,
        "requests for five sections"
    );
    let next = client.acquire("press", &options).await.unwrap();
    assert!(next.fencing_token().unwrap() > first_token + 5);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_handing_fixed_leases_on_never_overlap() {
    let redis = RedisServer::start();
    let options = LockOptions::new()
        .lease(Duration::from_secs(5))
        .fencing(true);
    let history = Arc::new(History::new());
    let mut tasks = Vec::new();
    for number in 0..2 {
        let client = client_with(&redis, 32, Duration::from_secs(10)).await;
        for task in 0..16 {
            let (client, options, history) = (client.clone(), options.clone(), history.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = client.acquire("press", &options).await.unwrap();
                    let from = SystemTime::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    history.record_guard(format!("client {number} task {task}"), &guard, from);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(history.check(), Ok(2 * 16 * 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taker_of_a_fixed_lease_deleted_behind_its_back_learns_it_at_its_renewal() {
    let redis = RedisServer::start();
    let client = client_with(&redis, 32, Duration::from_secs(10)).await;
    let other = LockClient::connect(&redis.url()).await.unwrap();
    let lease = Duration::from_millis(900);
    let options = LockOptions::new().lease(lease).fencing(true);
    let first = client.acquire("press", &options).await.unwrap();
    let next = tokio::spawn({
        let (client, options) = (client.clone(), options.clone());
        async move { client.acquire("press", &options).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The lock is gone behind the holder's back, as an operator's unlock would do,
    // and another client takes it.
    let () = redis::cmd("DEL")
        .arg("lock:{press}")
        .query(&mut redis.connection())
        .unwrap();
    let theirs = other.try_acquire("press", &options).await.unwrap().unwrap();
    first.release().await.unwrap();
    let next = next.await.unwrap().unwrap();
    // As with a watchdog lease, the taker learns it at its next renewal, once a
    // third of the lease it was handed is left (here about 600 ms after the first
    // acquire); until then fencing tokens order the two holders.
    assert!(theirs.fencing_token().unwrap() > next.fencing_token().unwrap());
    tokio::time::timeout(lease * 3 / 4, next.lost())
        .await
        .expect("the taker never learned that it lost the lock");
    assert!(!next.is_held());
    assert!(theirs.is_held());
    theirs.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taker_that_extends_a_fixed_lease_keeps_the_lease_it_extended_to() {
    let redis = RedisServer::start();
    let client = client_with(&redis, 32, Duration::from_secs(10)).await;
    let options = LockOptions::new().lease(Duration::from_millis(1500));
    let first = client.acquire("press", &options).await.unwrap();
    let next = tokio::spawn({
        let (client, options) = (client.clone(), options.clone());
        async move { client.acquire("press", &options).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await.unwrap();
    let next = next.await.unwrap().unwrap();
    // Shorter than the 1.5 s owed to the taker, and longer than the keeper waits
    // before it would renew the lease handed on.
    next.extend(Duration::from_millis(1000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1250)).await;
    assert!(!next.is_held());
    assert_eq!(
        client.lease_left("press").await.unwrap(),
        None,
        "the lock outlived the lease its holder asked for"
    );
}
