//! Moves 1 from one account to another, again and again, each time under
//! `acquire_all` on both accounts: reads both balances, pauses, writes both. The
//! balances live in the Redis that holds the locks, as `balance:<account>`.
//!
//! Usage: `transfer-worker <redis url> <from> <to> <transfers>`

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use redis::AsyncCommands;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, from, to, transfers] = args.as_slice() else {
        eprintln!("usage: transfer-worker <redis url> <from> <to> <transfers>");
        std::process::exit(2);
    };
    let transfers: u32 = transfers.parse().expect("a number of transfers");
    let locks = LockClient::connect(url).await.expect("connect");
    let mut data = redis::Client::open(url.as_str())
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a data connection");
    let options = LockOptions::new()
        .retry_wait(Duration::from_millis(5))
        .timeout(Duration::from_secs(30));
    let (from_key, to_key) = (format!("balance:{from}"), format!("balance:{to}"));
    for _ in 0..transfers {
        let guard = locks
            .acquire_all(
                [format!("account:{from}"), format!("account:{to}")],
                &options,
            )
            .await
            .expect("take both accounts");
        let from_balance: i64 = data.get(&from_key).await.expect("read");
        let to_balance: i64 = data.get(&to_key).await.expect("read");
        tokio::time::sleep(Duration::from_millis(1)).await;
        let () = data.set(&from_key, from_balance - 1).await.expect("write");
        let () = data.set(&to_key, to_balance + 1).await.expect("write");
        guard.release().await.expect("release both accounts");
    }
}
