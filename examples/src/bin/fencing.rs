//! Why fencing tokens: a holder pauses past its lease, a second holder takes the
//! lock and writes, and the first holder's late write is refused.
//!
//! Needs a Redis: `REDIS_URL=redis://127.0.0.1:6379 cargo run -p lock-examples --bin fencing`

use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockOptions, fenced_set};
use redis::AsyncCommands;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!("set REDIS_URL, e.g. REDIS_URL=redis://127.0.0.1:6379");
        std::process::exit(2);
    };
    let backend = LockError::from;
    let locks = LockClient::connect(&url).await?;
    let mut store = redis::Client::open(url.as_str())
        .map_err(backend)?
        .get_multiplexed_async_connection()
        .await
        .map_err(backend)?;
    let lease = Duration::from_millis(200);
    let options = LockOptions::new().fencing(true).lease(lease);

    let slow = locks.acquire("fencing-demo", &options).await?;
    let slow_token = slow.fencing_token().expect("fencing is on");
    println!("holder A has the lock with token {slow_token}, then pauses past its {lease:?} lease");
    tokio::time::sleep(lease * 2).await;
    println!(
        "does holder A still hold it? is_held() = {}",
        slow.is_held()
    );

    let fast = tokio::spawn({
        let locks = locks.clone();
        let options = options.clone();
        async move { locks.acquire("fencing-demo", &options).await }
    })
    .await
    .expect("holder B's task")?;
    let fast_token = fast.fencing_token().expect("fencing is on");
    let wrote = fenced_set(
        &mut store,
        "fencing-demo:balance",
        "written by B",
        fast_token,
    )
    .await?;
    println!("holder B took over with token {fast_token} and wrote: {wrote}");

    let wrote = fenced_set(
        &mut store,
        "fencing-demo:balance",
        "written by A",
        slow_token,
    )
    .await?;
    println!("holder A wakes up and writes with token {slow_token}: {wrote} (refused)");
    let stored: String = store
        .hget("fencing-demo:balance", "value")
        .await
        .map_err(backend)?;
    println!("the store holds: {stored:?}");

    fast.release().await?;
    let _ = slow.release().await;
    assert_eq!(stored, "written by B");
    Ok(())
}
