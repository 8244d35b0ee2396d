//! Read-write locks (`shared(true)`): shared holders hold a key together, an
//! exclusive holder (a plain lock) holds it alone, and a waiting exclusive holder
//! keeps new shared holders out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions};
use lock_tests::RedisServer;
use tokio::time::Instant;

use crate::behaviour::{Fixture, on_every_backend};
use crate::semaphore::most_at_once_in_processes;

on_every_backend!(
    shared_holders_overlap_and_an_exclusive_holder_is_alone,
    readers_and_writers_of_many_clients_never_overlap,
    an_exclusive_waiter_is_served_while_shared_holders_keep_arriving,
    reentry_follows_the_ownership_rules,
    the_watchdog_renews_a_shared_hold,
    readers_behind_a_writer_that_left_get_in_at_once,
    a_stale_writer_releasing_beside_readers_is_told_it_holds_nothing,
);

fn shared() -> LockOptions {
    LockOptions::new().shared(true)
}

async fn shared_holders_overlap_and_an_exclusive_holder_is_alone(fixture: Fixture) {
    let here = fixture.client.acquire("catalog", &shared()).await.unwrap();
    let there = fixture
        .other
        .try_acquire("catalog", &shared())
        .await
        .unwrap();
    let there = there.expect("a second shared holder waits for the first");
    let third = fixture.connect().await;
    let writer = third.try_acquire("catalog", &LockOptions::new()).await;
    assert!(
        matches!(writer, Ok(None)),
        "a writer beside readers: {writer:?}"
    );
    here.release().await.unwrap();
    let writer = third.try_acquire("catalog", &LockOptions::new()).await;
    assert!(
        matches!(writer, Ok(None)),
        "a writer beside a reader: {writer:?}"
    );
    there.release().await.unwrap();

    let writer = third.acquire("catalog", &LockOptions::new()).await.unwrap();
    for client in [&fixture.client, &fixture.other] {
        let reader = client.try_acquire("catalog", &shared()).await.unwrap();
        assert!(reader.is_none(), "a reader beside the writer");
    }
    writer.release().await.unwrap();
    let reader = fixture
        .other
        .try_acquire("catalog", &shared())
        .await
        .unwrap();
    assert!(reader.is_some(), "the writer's release left the key taken");
}

async fn readers_and_writers_of_many_clients_never_overlap(fixture: Fixture) {
    let readers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let writing = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = fixture.connect().await;
        for task in 0..4 {
            let client = client.clone();
            let (readers, most_readers, writing) =
                (readers.clone(), most_readers.clone(), writing.clone());
            tasks.push(tokio::spawn(async move {
                for section in 0..12 {
                    let exclusive = (task + section) % 4 == 0;
                    let options = LockOptions::new()
                        .shared(!exclusive)
                        .timeout(Duration::from_secs(60));
                    let guard = client.acquire("catalog", &options).await.unwrap();
                    if exclusive {
                        assert!(!writing.swap(true, Ordering::SeqCst), "two writers");
                        assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer beside readers");
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        writing.store(false, Ordering::SeqCst);
                    } else {
                        let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        most_readers.fetch_max(now, Ordering::SeqCst);
                        assert!(!writing.load(Ordering::SeqCst), "a reader beside a writer");
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        readers.fetch_sub(1, Ordering::SeqCst);
                    }
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "shared holders never held the key together"
    );
}

async fn an_exclusive_waiter_is_served_while_shared_holders_keep_arriving(fixture: Fixture) {
    // Two clients take the key shared every 10 ms for 40 ms each: from the first on,
    // it is never free of readers unless new readers wait for the writer.
    let stop = Arc::new(AtomicBool::new(false));
    let mut streams = Vec::new();
    for client in [fixture.client.clone(), fixture.other.clone()] {
        let stop = stop.clone();
        streams.push(tokio::spawn(async move {
            let mut readers = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let client = client.clone();
                readers.push(tokio::spawn(async move {
                    let options = shared().timeout(Duration::from_secs(10));
                    let reader = client.acquire("catalog", &options).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    reader.release().await.unwrap();
                }));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for reader in readers {
                reader.await.unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let writer = fixture.connect().await;
    let asked = Instant::now();
    let exclusive = LockOptions::new().timeout(Duration::from_secs(3));
    let written = writer.acquire("catalog", &exclusive).await;
    let waited = asked.elapsed();
    stop.store(true, Ordering::SeqCst);
    let guard = written.expect("the writer starved behind a stream of readers");
    assert!(
        waited < Duration::from_secs(1),
        "the writer waited {waited:?}"
    );
    guard.release().await.unwrap();
    for stream in streams {
        stream.await.unwrap();
    }
}

async fn reentry_follows_the_ownership_rules(fixture: Fixture) {
    let locks = &fixture.client;
    let writer = locks.acquire("catalog", &LockOptions::new()).await.unwrap();
    writer
        .scope(async {
            let read = locks.try_acquire("catalog", &shared()).await.unwrap();
            read.expect("shared inside exclusive re-enters")
                .release()
                .await
        })
        .await
        .unwrap();
    writer.release().await.unwrap();

    let reader = locks.acquire("catalog", &shared()).await.unwrap();
    let upgraded = reader
        .scope(async {
            let options = LockOptions::new().timeout(Duration::from_secs(1));
            locks.acquire("catalog", &options).await
        })
        .await;
    match upgraded {
        Err(LockError::InvalidOptions { key, reason, .. }) => {
            assert_eq!(key, "catalog");
            assert!(reason.contains("shared"), "{reason}");
        }
        other => panic!("exclusive inside shared: {other:?}"),
    }
    // Outside the scope, the same task is another owner: it waits, here for nothing.
    let sibling = locks.try_acquire("catalog", &LockOptions::new()).await;
    assert!(matches!(sibling, Ok(None)), "{sibling:?}");
    reader.release().await.unwrap();
}

async fn the_watchdog_renews_a_shared_hold(fixture: Fixture) {
    let lease = Duration::from_millis(300);
    let renewed = shared().lease(lease).watchdog(true);
    let reader = fixture.client.acquire("catalog", &renewed).await.unwrap();
    tokio::time::sleep(lease * 3).await;
    assert!(reader.is_held(), "the watchdog let the shared hold go");
    let writer = fixture
        .other
        .try_acquire("catalog", &LockOptions::new())
        .await;
    assert!(
        matches!(writer, Ok(None)),
        "a writer beside a renewed reader: {writer:?}"
    );
    reader.release().await.unwrap();
}

/// The central claim across processes: three processes of readers and writers on
/// one key never see a writer beside anyone, and do see readers together.
#[test]
fn processes_of_readers_and_writers_never_overlap() {
    let redis = RedisServer::start();
    let most = most_at_once_in_processes(&redis, "catalog", "read-write");
    assert!(
        most >= 2,
        "readers of two processes never held the key together"
    );
}

/// Readers waiting behind a writer get in once the writer stops waiting, whether it
/// gave up or was cancelled, and not when their own pause ends.
async fn readers_behind_a_writer_that_left_get_in_at_once(fixture: Fixture) {
    let reading = fixture.client.acquire("catalog", &shared()).await.unwrap();
    for cancelled in [true, false] {
        let writer = fixture.connect().await;
        let patience = match cancelled {
            true => Duration::from_secs(20),
            false => Duration::from_millis(500),
        };
        let writing = tokio::spawn(async move {
            let exclusive = LockOptions::new().timeout(patience);
            writer.acquire("catalog", &exclusive).await
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut readers = Vec::new();
        for _ in 0..2 {
            let reader = fixture.connect().await;
            readers.push(tokio::spawn(async move {
                let patient = shared()
                    .retry_wait(Duration::from_secs(5))
                    .timeout(Duration::from_secs(20));
                let guard = reader.acquire("catalog", &patient).await.unwrap();
                (Instant::now(), guard)
            }));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            readers.iter().all(|reader| !reader.is_finished()),
            "a reader went past the waiting writer"
        );
        let left_at = match cancelled {
            true => {
                writing.abort();
                Instant::now()
            }
            false => {
                let gave_up = writing.await.unwrap();
                assert!(
                    matches!(gave_up, Err(LockError::Timeout { .. })),
                    "{gave_up:?}"
                );
                Instant::now()
            }
        };
        for reader in readers {
            let (got_at, guard) = reader.await.unwrap();
            let waited = got_at.saturating_duration_since(left_at);
            assert!(
                waited < Duration::from_secs(1),
                "a reader got in {waited:?} after the writer left (cancelled: {cancelled})"
            );
            guard.release().await.unwrap();
        }
    }
    reading.release().await.unwrap();
}

/// A writer whose lease ran out, releasing beside the readers that took the key since:
/// told it no longer holds it, on every server (Redis 8.6's native compare-and-delete
/// refuses a key that is no string with an error of its own), and the readers keep it.
async fn a_stale_writer_releasing_beside_readers_is_told_it_holds_nothing(fixture: Fixture) {
    let lease = Duration::from_millis(100);
    let stale = fixture
        .client
        .acquire("catalog", &LockOptions::new().lease(lease))
        .await
        .unwrap();
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    let reader = fixture.other.acquire("catalog", &shared()).await.unwrap();

    let released = stale.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld { ref key, .. }) if key == "catalog"),
        "{released:?}"
    );
    assert!(reader.is_held());
    let writer = fixture
        .connect()
        .await
        .try_acquire("catalog", &LockOptions::new())
        .await;
    assert!(
        matches!(writer, Ok(None)),
        "the readers' key was freed: {writer:?}"
    );
}
