//! A flash sale: 1,000 buyers race for 100 items, each purchase a non-atomic read
//! then write of the stock, made safe by a distributed lock.
//!
//! With `REDIS_URL` set, the lock and the stock live in that Redis; otherwise both
//! live in this process's memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockKey, LockOptions};
use redis::AsyncCommands;
use tokio::time::Instant;

const STOCK: i64 = 100;
const BUYERS: usize = 1000;

/// Where the stock lives: read and written separately, so only the lock keeps two
/// buyers from selling the same item.
#[derive(Clone)]
enum Stock {
    Redis(redis::aio::MultiplexedConnection),
    Memory(Arc<AtomicI64>),
}

impl Stock {
    async fn read(&mut self) -> i64 {
        match self {
            Stock::Redis(redis) => redis.get("flash-sale:stock").await.expect("read stock"),
            Stock::Memory(stock) => stock.load(Ordering::SeqCst),
        }
    }

    async fn write(&mut self, value: i64) {
        match self {
            Stock::Redis(redis) => redis
                .set("flash-sale:stock", value)
                .await
                .expect("write stock"),
            Stock::Memory(stock) => {
                tokio::task::yield_now().await;
                stock.store(value, Ordering::SeqCst)
            }
        }
    }
}

async fn buy(locks: &LockClient, stock: &mut Stock) -> Result<bool, LockError> {
    let key = LockKey::new("flash-sale").part("sku-1");
    let options = LockOptions::new()
        .retry_wait(Duration::from_millis(5))
        .timeout(Duration::from_secs(30));
    let guard = locks.acquire(&key, &options).await?;
    let left = stock.read().await;
    if left > 0 {
        stock.write(left - 1).await;
    }
    guard.release().await?;
    Ok(left > 0)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let (locks, mut stock) = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("backend: Redis at {url}");
            let locks = LockClient::connect(&url).await?;
            let backend = |source| LockError::Backend { key: None, source };
            let mut data = redis::Client::open(url.as_str())
                .map_err(backend)?
                .get_multiplexed_async_connection()
                .await
                .map_err(backend)?;
            let () = data.set("flash-sale:stock", STOCK).await.map_err(backend)?;
            (locks, Stock::Redis(data))
        }
        Err(_) => {
            println!("backend: process memory (set REDIS_URL=redis://127.0.0.1:6379 to use Redis)");
            (
                LockClient::memory(),
                Stock::Memory(Arc::new(AtomicI64::new(STOCK))),
            )
        }
    };
    println!("{BUYERS} buyers race for {STOCK} items");

    let started = Instant::now();
    let buyers: Vec<_> = (0..BUYERS)
        .map(|_| {
            let locks = locks.clone();
            let mut stock = stock.clone();
            tokio::spawn(async move {
                let asked = Instant::now();
                let bought = buy(&locks, &mut stock).await;
                (bought, asked.elapsed())
            })
        })
        .collect();
    let (mut sold, mut sold_out, mut failed, mut latencies) = (0, 0, 0, Vec::new());
    for buyer in buyers {
        let (bought, latency) = buyer.await.expect("buyer task");
        latencies.push(latency);
        match bought {
            Ok(true) => sold += 1,
            Ok(false) => sold_out += 1,
            Err(error) => {
                failed += 1;
                eprintln!("purchase failed: {error}");
            }
        }
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let left = stock.read().await;
    println!("sold {sold}, sold out {sold_out}, failed {failed}, stock left {left}");
    println!(
        "{:.0} purchases/s, latency p50 {:?}, p99 {:?}",
        BUYERS as f64 / elapsed.as_secs_f64(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100]
    );
    if sold + left != STOCK {
        eprintln!("OVERSOLD: {sold} sold + {left} left != {STOCK}");
        std::process::exit(1);
    }
    println!("sold + left = {STOCK}: no oversell");
    Ok(())
}
