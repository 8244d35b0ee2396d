//! One run per window (`hold_at_least`): a release inside the window leaves the lock
//! held by nobody until the window ends, so a job scheduled on several replicas runs
//! once per window and the others skip it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockOptions};
use lock_tests::RedisServer;
use tokio::time::{Instant, MissedTickBehavior};

use crate::behaviour::{Fixture, on_every_backend};

const WINDOW: Duration = Duration::from_millis(500);

on_every_backend!(a_release_inside_the_window_keeps_the_lock_until_it_ends);

async fn a_release_inside_the_window_keeps_the_lock_until_it_ends(fixture: Fixture) {
    let once = LockOptions::new().spin(false).hold_at_least(WINDOW);
    let taken_at = Instant::now();
    let run = fixture.client.acquire("report", &once).await.unwrap();
    run.release().await.unwrap();
    let skipped = fixture.other.acquire("report", &once).await;
    assert!(
        matches!(skipped, Err(LockError::Busy { .. })),
        "another replica ran inside the window: {skipped:?}"
    );
    let own_again = fixture.client.try_acquire("report", &once).await.unwrap();
    assert!(own_again.is_none(), "the same client ran inside the window");

    let waiting = LockOptions::new().timeout(Duration::from_secs(5));
    let next = fixture.other.acquire("report", &waiting).await.unwrap();
    let waited = taken_at.elapsed();
    assert!(waited >= WINDOW, "the window ended after only {waited:?}");
    assert!(
        waited < WINDOW + Duration::from_millis(400),
        "the lock stayed held {waited:?} after the window"
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_run_a_job_once_per_window() {
    const RUN_FOR: Duration = Duration::from_secs(6);
    const TICK: Duration = Duration::from_millis(100);
    let redis = RedisServer::start();
    // When each run asked for the lock and when it got it.
    let runs = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let started = Instant::now();
    let mut replicas = Vec::new();
    for replica in 0..3u64 {
        let client = LockClient::connect(&redis.url()).await.unwrap();
        let runs = runs.clone();
        replicas.push(tokio::spawn(async move {
            tokio::time::sleep(TICK * replica as u32 / 3).await;
            let mut ticks = tokio::time::interval(TICK);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let once = LockOptions::new().spin(false).hold_at_least(WINDOW);
            while started.elapsed() < RUN_FOR {
                ticks.tick().await;
                let asked = Instant::now();
                match client.acquire("nightly-report", &once).await {
                    Ok(run) => {
                        runs.lock().unwrap().push((asked, Instant::now()));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        run.release().await.unwrap();
                    }
                    Err(LockError::Busy { .. }) => {}
                    Err(error) => panic!("replica {replica}: {error}"),
                }
            }
        }));
    }
    for replica in replicas {
        replica.await.unwrap();
    }
    let mut runs = runs.lock().unwrap().clone();
    runs.sort();
    for pair in runs.windows(2) {
        let ((asked, _), (_, next_got)) = (pair[0], pair[1]);
        assert!(
            next_got.duration_since(asked) >= WINDOW,
            "two runs within one window: {:?} apart",
            next_got.duration_since(asked)
        );
    }
    // A window and at most one tick before some replica asks again.
    let windows = RUN_FOR.as_millis() / (WINDOW + TICK).as_millis();
    assert!(
        runs.len() as u128 * 10 >= windows * 9,
        "{} runs in {windows} windows",
        runs.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_cannot_be_added_by_re_entering() {
    let locks = LockClient::memory();
    let guard = locks.acquire("report", &LockOptions::new()).await.unwrap();
    let inner = guard
        .scope(locks.acquire("report", &LockOptions::new().hold_at_least(WINDOW)))
        .await;
    assert!(
        matches!(inner, Err(LockError::InvalidOptions { ref reason, .. }) if reason.contains("hold_at_least")),
        "{inner:?}"
    );
    guard.release().await.unwrap();
}
