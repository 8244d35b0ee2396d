//! Who holds a lock in async Rust: one acquisition, owned by its guard. Sibling
//! futures, stale guards, moved guards and cancelled acquires never share a lock;
//! code inside a hold re-enters it, one section at a time.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockOptions};
use lock_tests::RedisServer;
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::attribute::Overlap;
use crate::behaviour::{Fixture, on_every_backend};
use crate::data;

on_every_backend!(
    sibling_futures_take_turns,
    a_stale_guard_cannot_touch_a_later_lock,
    a_moved_guard_takes_the_lock_along,
    cancelled_acquires_leave_no_lock,
    a_dropped_release_still_releases,
    shutdown_waits_for_background_releases,
    reentry_inside_a_scope,
    sections_inside_one_scope_take_turns,
    reentry_that_cannot_honour_its_options_is_refused,
    a_reentered_guard_ends_with_its_hold,
    a_task_spawned_inside_a_hold_times_out,
);

async fn sibling_futures_take_turns(fixture: Fixture) {
    let overlap = Overlap::default();
    let options = LockOptions::new().timeout(Duration::from_secs(10));
    let section = || async {
        let guard = fixture.client.acquire("basket", &options).await.unwrap();
        overlap.section(Duration::from_millis(30)).await;
        guard.release().await.unwrap();
    };
    tokio::join!(section(), section(), section());
    assert_eq!(
        overlap.most(),
        1,
        "futures joined in one task shared the lock"
    );
}

async fn a_stale_guard_cannot_touch_a_later_lock(fixture: Fixture) {
    let lease = Duration::from_millis(100);
    let fixed = LockOptions::new().lease(lease);
    for drop_it in [false, true] {
        let stale = fixture.client.acquire("invoice", &fixed).await.unwrap();
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        assert!(!stale.is_held());
        let fresh = fixture
            .client
            .acquire("invoice", &LockOptions::new())
            .await
            .unwrap();
        if drop_it {
            drop(stale);
            tokio::time::sleep(Duration::from_millis(50)).await;
        } else {
            let released = stale.release().await;
            assert!(
                matches!(released, Err(LockError::NotHeld { .. })),
                "{released:?}"
            );
        }
        assert!(fresh.is_held());
        assert!(
            !fixture.free_elsewhere("invoice").await,
            "the stale guard freed the same task's later lock"
        );
        fresh.release().await.unwrap();
    }
}

async fn a_moved_guard_takes_the_lock_along(fixture: Fixture) {
    let guard = fixture
        .client
        .acquire("parcel", &LockOptions::new())
        .await
        .unwrap();
    let (moved, moved_in) = tokio::sync::oneshot::channel();
    let (done, release) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        let guard = guard;
        moved.send(()).unwrap();
        release.await.unwrap();
        guard.release().await
    });
    moved_in.await.unwrap();
    let again = fixture
        .client
        .try_acquire("parcel", &LockOptions::new())
        .await
        .unwrap();
    assert!(
        again.is_none(),
        "the task that gave its guard away still held the lock"
    );
    done.send(()).unwrap();
    holder.await.unwrap().unwrap();
    assert!(fixture.free_elsewhere("parcel").await);
}

/// Polls `future` `polls` times, letting the runtime run in between, then drops it.
async fn drop_after_polls<F: Future>(future: F, polls: usize) {
    let mut future = std::pin::pin!(future);
    for _ in 0..polls {
        let polled = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
        if polled.is_ready() {
            return;
        }
        tokio::task::yield_now().await;
    }
}

async fn cancelled_acquires_leave_no_lock(fixture: Fixture) {
    let options = LockOptions::new();
    let cuts = (0..20)
        .map(|polls| (polls, Duration::ZERO))
        .chain((0..20).map(|millis| (usize::MAX, Duration::from_micros(millis * 250))));
    for (polls, after) in cuts {
        let acquiring = fixture.client.acquire("ticket", &options);
        if after.is_zero() {
            drop_after_polls(acquiring, polls).await;
        } else if let Ok(guard) = tokio::time::timeout(after, acquiring).await {
            drop(guard);
        }
        // The lease is 30 s: a key free this soon was cleaned up, not expired.
        fixture
            .time_until_free("ticket", Duration::from_millis(500))
            .await;
    }
}

async fn a_dropped_release_still_releases(fixture: Fixture) {
    for polls in [0, 1, 2] {
        let guard = fixture
            .client
            .acquire("voucher", &LockOptions::new())
            .await
            .unwrap();
        drop_after_polls(guard.release(), polls).await;
        fixture
            .time_until_free("voucher", Duration::from_millis(500))
            .await;
    }
}

async fn shutdown_waits_for_background_releases(fixture: Fixture) {
    let keys: Vec<String> = (0..100).map(|n| format!("shutdown:{n}")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            fixture
                .client
                .acquire(key, &LockOptions::new())
                .await
                .unwrap(),
        );
    }
    drop(guards);
    fixture.client.shutdown().await;
    // The last dropped first: its release is the one most likely still on its way.
    for key in keys.iter().rev() {
        assert!(
            fixture.free_elsewhere(key).await,
            "`{key}` was still held after shutdown returned"
        );
    }
}

async fn reentry_inside_a_scope(fixture: Fixture) {
    let client = &fixture.client;
    let options = LockOptions::new().fencing(true);
    let outer = client.acquire("cart", &options).await.unwrap();
    let trips = fixture.round_trips();
    outer
        .scope(async {
            let inner = client.acquire("cart", &options).await.unwrap();
            assert_eq!(inner.fencing_token(), outer.fencing_token());
            inner
                .scope(async {
                    let innermost = client.acquire("cart", &options).await.unwrap();
                    assert_eq!(innermost.fencing_token(), outer.fencing_token());
                    innermost.release().await.unwrap();
                })
                .await;
            inner.release().await.unwrap();
        })
        .await;
    if fixture.counts_round_trips() {
        assert_eq!(fixture.round_trips(), trips, "re-entry asks Redis nothing");
    }
    assert!(
        !fixture.free_elsewhere("cart").await,
        "inner releases keep the lock"
    );
    outer.release().await.unwrap();
    assert!(
        fixture.free_elsewhere("cart").await,
        "the outer release frees it"
    );
}

async fn sections_inside_one_scope_take_turns(fixture: Fixture) {
    let client = &fixture.client;
    let options = LockOptions::new();
    let outer = client.acquire("ledger", &options).await.unwrap();
    let overlap = Overlap::default();
    let section = || async {
        let guard = client.acquire("ledger", &options).await.unwrap();
        overlap.section(Duration::from_millis(30)).await;
        guard.release().await.unwrap();
    };
    outer
        .scope(async { tokio::join!(section(), section(), section()) })
        .await;
    assert_eq!(overlap.most(), 1, "re-entering sections ran at once");
    outer.release().await.unwrap();
}

async fn reentry_that_cannot_honour_its_options_is_refused(fixture: Fixture) {
    let client = &fixture.client;
    let outer = client.acquire("batch", &LockOptions::new()).await.unwrap();
    outer
        .scope(async {
            let fenced = client
                .acquire("batch", &LockOptions::new().fencing(true))
                .await;
            match fenced {
                Err(LockError::InvalidOptions { key, reason, .. }) => {
                    assert_eq!(key, "batch");
                    assert!(reason.contains("fencing"), "{reason}");
                }
                other => panic!("expected InvalidOptions, got {other:?}"),
            }
            let started = Instant::now();
            let nested = client
                .acquire("batch", &LockOptions::new().reentrant(false))
                .await;
            assert!(
                matches!(nested, Err(LockError::Reentered { ref key, .. }) if key == "batch"),
                "{nested:?}"
            );
            assert!(started.elapsed() < Duration::from_millis(200), "at once");
        })
        .await;
    outer.release().await.unwrap();
}

async fn a_reentered_guard_ends_with_its_hold(fixture: Fixture) {
    let client = &fixture.client;
    let outer = client.acquire("shelf", &LockOptions::new()).await.unwrap();
    let inner = outer
        .scope(client.acquire("shelf", &LockOptions::new()))
        .await
        .unwrap();
    assert!(inner.is_held());
    let extended = inner.extend(Duration::from_secs(60)).await;
    assert!(
        matches!(extended, Err(LockError::InvalidOptions { .. })),
        "a view cannot extend its hold: {extended:?}"
    );
    outer.release().await.unwrap();
    assert!(!inner.is_held(), "the view outlived its hold");
    tokio::time::timeout(Duration::from_secs(1), inner.lost())
        .await
        .expect("the view learns its hold ended");
    assert!(fixture.free_elsewhere("shelf").await);
    let released = inner.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld { .. })),
        "{released:?}"
    );
}

async fn a_task_spawned_inside_a_hold_times_out(fixture: Fixture) {
    let client = fixture.client.clone();
    let outer = client
        .acquire("nightly", &LockOptions::new())
        .await
        .unwrap();
    let budget = Duration::from_millis(300);
    let child = outer
        .scope(async {
            let client = client.clone();
            tokio::spawn(async move {
                let options = LockOptions::new().timeout(budget);
                client.acquire("nightly", &options).await.map(drop)
            })
            .await
            .unwrap()
        })
        .await;
    assert!(
        matches!(child, Err(LockError::Timeout { .. })),
        "a spawned task is another owner: {child:?}"
    );
    outer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_is_final_even_when_a_late_renewal_succeeds() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let lease = Duration::from_millis(300);
    let guard = client
        .acquire("stock", &LockOptions::new().lease(lease).watchdog(true))
        .await
        .unwrap();
    // The first renewal, due at lease/3, is answered only after the lease ran out
    // here. The key outlives the pause on the server, so that renewal succeeds.
    let _: bool = data(&redis)
        .await
        .pexpire("lock:{stock}", 60_000)
        .await
        .unwrap();
    redis.pause(lease * 2);
    tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("the lease ran out while Redis was paused");
    tokio::time::sleep(lease * 2).await;
    assert!(!guard.is_held(), "a late renewal revived a lost guard");
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld { .. })),
        "{released:?}"
    );
    let exists: bool = data(&redis).await.exists("lock:{stock}").await.unwrap();
    assert!(
        !exists,
        "the release deleted what the late renewal left under its token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_stays_within_its_budget_while_releases_keep_waking_it() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let mut data = data(&redis).await;
    let () = data
        .set_options(
            "lock:{churn}",
            "someone else",
            redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(60_000)),
        )
        .await
        .unwrap();
    let publishing = tokio::spawn(async move {
        for _ in 0..1_000 {
            let _: i64 = data.publish("lock:{churn}:released", "").await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let started = Instant::now();
    let waited = client.acquire("churn", &LockOptions::new()).await;
    let elapsed = started.elapsed();
    publishing.abort();
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    // 20 retries at 50 ms: about a second, however often it was woken.
    assert!(elapsed < Duration::from_secs(3), "waited {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_subscription_behind() {
    let redis = RedisServer::start();
    let holder = LockClient::connect(&redis.url()).await.unwrap();
    let waiters = LockClient::connect(&redis.url()).await.unwrap();
    let mut data = data(&redis).await;
    for round in 0..10u64 {
        let guard = holder.acquire("queue", &LockOptions::new()).await.unwrap();
        let mut waiting = Vec::new();
        for waiter in 0..4u64 {
            let waiters = waiters.clone();
            // Cut at different points, some while the holder's release is on its way.
            let cut = Duration::from_millis(20 + (round * 4 + waiter) % 15);
            waiting.push(tokio::spawn(async move {
                let options = LockOptions::new();
                let acquiring = waiters.acquire("queue", &options);
                tokio::time::timeout(cut, acquiring).await.map(drop).ok()
            }));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
        guard.release().await.unwrap();
        for waiter in waiting {
            waiter.await.unwrap();
        }
    }
    let started = Instant::now();
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(&mut data)
            .await
            .unwrap();
        if channels.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "still subscribed to {channels:?} with no one waiting"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_left_by_the_previous_version_is_respected() {
    let redis = RedisServer::start();
    let client = LockClient::connect(&redis.url()).await.unwrap();
    let mut data = data(&redis).await;
    // The previous data model: a hash of owner -> hold count, with a lease.
    let () = data
        .hset("lock:{legacy}", "old-client:task-7", 1)
        .await
        .unwrap();
    let _: bool = data.pexpire("lock:{legacy}", 400).await.unwrap();
    let started = Instant::now();
    let busy = client
        .try_acquire("legacy", &LockOptions::new())
        .await
        .unwrap();
    assert!(busy.is_none(), "the old holder's lock was taken over");
    let guard = client
        .acquire(
            "legacy",
            &LockOptions::new().timeout(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "got in before the old lease ended: {:?}",
        started.elapsed()
    );
    guard.release().await.unwrap();
}
