//! Takes a lock (or, given a number of permits, one permit of a semaphore) with a
//! fixed lease, says `held`, and waits to be killed: the crashed holder of the crash
//! tests.
//!
//! Usage: `lock-holder <redis url> <key> <lease ms> [permits]`

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, key, lease_ms, permits) = match args.as_slice() {
        [url, key, lease_ms] => (url, key, lease_ms, "1"),
        [url, key, lease_ms, permits] => (url, key, lease_ms, permits.as_str()),
        _ => {
            eprintln!("usage: lock-holder <redis url> <key> <lease ms> [permits]");
            std::process::exit(2);
        }
    };
    let lease = Duration::from_millis(lease_ms.parse().expect("lease in ms"));
    let permits = permits.parse().expect("permits, a number");
    let client = LockClient::connect(url).await.expect("connect");
    let guard = client
        .acquire(key, &LockOptions::new().lease(lease).permits(permits))
        .await
        .expect("acquire");
    println!("held");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    drop(guard);
}
