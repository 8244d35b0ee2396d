//! Takes a lock with a fixed lease, says `held`, and waits to be killed: the crashed
//! holder of the crash tests.
//!
//! Usage: `lock-holder <redis url> <key> <lease ms>`

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, lease_ms] = args.as_slice() else {
        eprintln!("usage: lock-holder <redis url> <key> <lease ms>");
        std::process::exit(2);
    };
    let lease = Duration::from_millis(lease_ms.parse().expect("lease in ms"));
    let client = LockClient::connect(url).await.expect("connect");
    let guard = client
        .acquire(key, &LockOptions::new().lease(lease))
        .await
        .expect("acquire");
    println!("held");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    drop(guard);
}
