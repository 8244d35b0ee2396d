//! A holder process that dies blocks others for at most its lease.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockOptions};
use lock_tests::RedisServer;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_frees_the_lock_after_its_lease() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(1500);
    let mut holder = Command::new(env!("CARGO_BIN_EXE_lock-holder"))
        .args([&redis.url(), "nightly-job", &lease.as_millis().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the holder process");
    let mut said = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert_eq!(said.trim(), "held");
    let held_at = Instant::now();
    holder.kill().expect("SIGKILL the holder");
    holder.wait().unwrap();

    let client = LockClient::connect(&redis.url()).await.unwrap();
    let busy = client
        .acquire("nightly-job", &LockOptions::new().spin(false))
        .await;
    assert!(
        matches!(busy, Err(LockError::Busy { .. })),
        "the dead holder's lease still runs"
    );

    let guard = client
        .acquire(
            "nightly-job",
            &LockOptions::new()
                .retry_wait(Duration::from_millis(10))
                .timeout(lease * 2),
        )
        .await
        .expect("the lock frees when the lease ends");
    let waited = held_at.elapsed();
    assert!(
        waited >= lease - Duration::from_millis(100),
        "freed before the lease ended: {waited:?}"
    );
    assert!(
        waited <= lease + Duration::from_millis(300),
        "freed late: {waited:?}"
    );
    guard.release().await.unwrap();
}
