//! Bank transfers between accounts, each under the locks of both its accounts:
//! `#[distributed_lock(..., multi = true)]` makes each key expression a lock of its
//! own and takes them together, as `LockClient::acquire_all` does. Four tellers move
//! money in crossing directions (A to B while B to A, B to C, C to A): taking the two
//! locks one after the other in the order each transfer names them could deadlock;
//! they are taken in one global order, all or none. Each transfer reads both
//! balances, pauses, then writes both, so without the locks money would appear or
//! vanish.
//!
//! `cargo run -p lock-examples --bin bank-transfer` runs the tellers in this process,
//! on process memory; with `REDIS_URL` set, the locks live in that Redis (the
//! balances stay in this process).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, distributed_lock};

const ACCOUNTS: [&str; 3] = ["A", "B", "C"];
const OPENING_BALANCE: i64 = 1_000;
const TRANSFERS_PER_TELLER: usize = 50;

type Balances = Arc<Mutex<HashMap<&'static str, i64>>>;

/// Moves `amount` from one account to another if the first has it; returns whether
/// it did. Excludes every other transfer that touches either account.
#[distributed_lock(
    client = "locks",
    prefix = "account",
    keys(from, to),
    multi = true,
    timeout_ms = 10_000
)]
async fn transfer(
    locks: &LockClient,
    balances: &Balances,
    from: &'static str,
    to: &'static str,
    amount: i64,
) -> Result<bool, LockError> {
    let read = |account| balances.lock().unwrap()[account];
    let (from_balance, to_balance) = (read(from), read(to));
    if from_balance < amount {
        return Ok(false);
    }
    // A slow ledger: the balances were read, the writes come later.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut balances = balances.lock().unwrap();
    balances.insert(from, from_balance - amount);
    balances.insert(to, to_balance + amount);
    Ok(true)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let first = match std::env::var("REDIS_URL") {
        Ok(url) => LockClient::connect(&url).await?,
        Err(_) => LockClient::memory(),
    };
    let balances: Balances = Arc::new(Mutex::new(
        ACCOUNTS.map(|account| (account, OPENING_BALANCE)).into(),
    ));
    let mut tellers = Vec::new();
    for (from, to) in [("A", "B"), ("B", "A"), ("B", "C"), ("C", "A")] {
        // Each teller is a client of its own, as a process of its own would be.
        let (locks, balances) = (first.peer(), balances.clone());
        tellers.push(tokio::spawn(async move {
            let mut done = 0;
            for _ in 0..TRANSFERS_PER_TELLER {
                if transfer(&locks, &balances, from, to, 10).await? {
                    done += 1;
                }
            }
            println!("teller {from} -> {to}: {done} transfers of 10");
            Ok::<_, LockError>(())
        }));
    }
    for teller in tellers {
        teller.await.expect("a teller panicked")?;
    }
    let balances = balances.lock().unwrap().clone();
    let total: i64 = balances.values().sum();
    for account in ACCOUNTS {
        println!("account {account}: {}", balances[account]);
    }
    println!(
        "total: {total} (opened with {})",
        OPENING_BALANCE * ACCOUNTS.len() as i64
    );
    assert_eq!(
        total,
        OPENING_BALANCE * ACCOUNTS.len() as i64,
        "money appeared or vanished"
    );
    Ok(())
}
