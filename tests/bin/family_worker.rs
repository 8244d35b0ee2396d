//! Runs critical sections of a semaphore or a read-write lock from a process of its
//! own, and checks from inside each, through counters in Redis, that it never shares
//! the key with more holders than the kind allows. Prints `sections=<n>
//! most_at_once=<m>` (the most holders seen inside together) and exits 0, or names
//! the overlap and exits 1.
//!
//! Usage: `family-worker <redis url> <key> <sections> <permits=N | read-write>`;
//! with `read-write`, every fourth section is exclusive and the others shared.

use std::time::Duration;

use lock_runtime::{LockClient, LockOptions};
use redis::AsyncCommands;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, sections, kind] = args.as_slice() else {
        eprintln!("usage: family-worker <redis url> <key> <sections> <permits=N | read-write>");
        std::process::exit(2);
    };
    let sections: usize = sections.parse().expect("sections, a number");
    let permits: Option<usize> = kind
        .strip_prefix("permits=")
        .map(|permits| permits.parse().expect("permits=N"));
    let client = LockClient::connect(url).await.expect("connect");
    let mut data = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("data connection");
    let waiting = LockOptions::new().timeout(Duration::from_secs(60));
    let mut most_at_once = 0;
    for section in 0..sections {
        let exclusive = permits.is_none() && section % 4 == 3;
        let options = match permits {
            Some(permits) => waiting.clone().permits(permits as u32),
            None => waiting.clone().shared(!exclusive),
        };
        let guard = client.acquire(key, &options).await.expect("acquire");
        // Each side counts itself in, then looks at the other: of two overlapping
        // sections, the later to count itself in sees the earlier.
        let (mine, theirs, allowed) = match (permits, exclusive) {
            (Some(permits), _) => ("inside", None, permits),
            (None, true) => ("writers", Some("readers"), 1),
            (None, false) => ("readers", Some("writers"), usize::MAX),
        };
        let at_once: usize = data.incr(mine, 1).await.unwrap();
        let others: usize = match theirs {
            Some(theirs) => data
                .get::<_, Option<usize>>(theirs)
                .await
                .unwrap()
                .unwrap_or(0),
            None => 0,
        };
        if at_once > allowed || others > 0 {
            println!("overlap: {at_once} {mine} with {others} {theirs:?} in section {section}");
            std::process::exit(1);
        }
        most_at_once = most_at_once.max(at_once);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let _: i64 = data.decr(mine, 1).await.unwrap();
        guard.release().await.expect("release");
    }
    println!("sections={sections} most_at_once={most_at_once}");
}
