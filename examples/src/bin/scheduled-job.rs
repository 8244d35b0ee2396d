//! A job scheduled on three replicas runs once per window: each replica fires every
//! 200 ms, and the one that gets the lock keeps it for at least a second, so the
//! others skip their turn with `Busy` (the pattern ShedLock is known for).
//!
//! `cargo run -p lock-examples --bin scheduled-job` runs the replicas in this
//! process, on process memory; with `REDIS_URL` set, on that Redis, where replicas
//! in other processes would take part too.

use std::time::Duration;

use lock_runtime::{LockClient, LockError, distributed_lock};
use tokio::time::Instant;

#[distributed_lock(
    client = "locks",
    prefix = "nightly-report",
    spin = false,
    hold_at_least_ms = 1_000
)]
async fn send_report(locks: &LockClient, replica: usize, since: Instant) -> Result<(), LockError> {
    println!(
        "{:>5} ms: replica {replica} sends the report",
        since.elapsed().as_millis()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let first = match std::env::var("REDIS_URL") {
        Ok(url) => LockClient::connect(&url).await?,
        Err(_) => LockClient::memory(),
    };
    let since = Instant::now();
    let mut replicas = Vec::new();
    for replica in 0..3 {
        // Each replica is a client of its own, as a process of its own would be.
        let locks = first.peer();
        replicas.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(200));
            while since.elapsed() < Duration::from_secs(5) {
                ticks.tick().await;
                match send_report(&locks, replica, since).await {
                    Ok(()) | Err(LockError::Busy { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(())
        }));
    }
    for replica in replicas {
        replica.await.expect("a replica panicked")?;
    }
    Ok(())
}
