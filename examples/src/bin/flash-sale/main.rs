//! A flash sale: 2,000 purchase requests, 1,000 at a time, over HTTP on loopback,
//! for 100 items. Each purchase reads the stock and then writes it back, so without
//! the lock the shop would oversell.
//!
//! `flash-sale` runs the service and the buyers in one process and reports.
//! `flash-sale serve` only serves (several such processes can share one Redis).
//! With `REDIS_URL` set, locks and stock live in that Redis; otherwise in memory.
//! `STOCK_IN_MEMORY=1` keeps the stock in this process while the locks go to Redis,
//! to show what the locks cost by themselves; `LOCAL_MUTEX=1` has the sales take
//! turns on a mutex of this process instead of the lock, to show what a lock that
//! cost nothing would give. Both work in one process only: a `serve` process
//! refuses them. `STOCK`, `REQUESTS` and `CONCURRENCY` change the numbers.
//! `GET /metrics` serves the lock metrics in Prometheus text.

mod load;
mod shop;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lock_runtime::{LockClient, LockError};
use metrics_exporter_prometheus::PrometheusBuilder;
use redis::AsyncCommands;
use shop::{Locking, Shop, Stock};

const SKU: &str = "sku-1";

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let serve_only = std::env::args().nth(1).as_deref() == Some("serve");
    let stock = setting("STOCK", 100) as i64;
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only metrics recorder");
    let stock_in_memory = std::env::var_os("STOCK_IN_MEMORY").is_some();
    let local_mutex = std::env::var_os("LOCAL_MUTEX").is_some();
    for (setting, set) in [
        ("STOCK_IN_MEMORY", stock_in_memory),
        ("LOCAL_MUTEX", local_mutex),
    ] {
        if set && serve_only {
            eprintln!(
                "flash-sale: {setting} works within this process, which `serve` \
                 processes cannot share: run the sale without `serve`"
            );
            std::process::exit(2);
        }
    }
    let shop = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("backend: Redis at {url}");
            let stock = match stock_in_memory {
                true => {
                    println!("stock: process memory (STOCK_IN_MEMORY)");
                    in_memory(stock)
                }
                false => Stock::Redis(stock_in_redis(&url, stock, serve_only).await?),
            };
            Shop {
                locks: LockClient::connect(&url).await?,
                stock,
                metrics,
            }
        }
        Err(_) => {
            println!("backend: process memory (set REDIS_URL=redis://127.0.0.1:6379 to use Redis)");
            Shop {
                locks: LockClient::memory(),
                metrics,
                stock: in_memory(stock),
            }
        }
    };
    let locking = match local_mutex {
        true => {
            println!("locking: a mutex of this process (LOCAL_MUTEX), not the distributed lock");
            Locking::LocalMutex
        }
        false => Locking::Distributed,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    let locks = shop.locks.clone();
    let serving = tokio::spawn(async move {
        let interrupted = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        axum::serve(listener, shop::router(shop, locking))
            .with_graceful_shutdown(interrupted)
            .await
    });
    if serve_only {
        println!("listening on {base}");
        let served = serving.await;
        // Requests cut short by the shutdown may have left releases running.
        locks.shutdown().await;
        return match served {
            Ok(Ok(())) => Ok(()),
            _ => std::process::exit(1),
        };
    }

    let (requests, concurrency) = (setting("REQUESTS", 2000), setting("CONCURRENCY", 1000));
    println!("{requests} purchase requests, {concurrency} at a time, for {stock} items of {SKU}");
    let outcome = load::drive(std::slice::from_ref(&base), SKU, requests, concurrency).await;
    let left: i64 = reqwest::get(format!("{base}/stock/{SKU}"))
        .await
        .and_then(|response| response.error_for_status())
        .expect("read the stock")
        .json()
        .await
        .expect("a stock count");

    println!(
        "sold {}, sold out {}, failed {}, stock left {left}",
        outcome.sold, outcome.sold_out, outcome.failed
    );
    println!(
        "{:.0} requests/s, latency p50 {:.1} ms, p99 {:.1} ms",
        outcome.requests_per_second(),
        outcome.percentile(50).as_secs_f64() * 1000.0,
        outcome.percentile(99).as_secs_f64() * 1000.0
    );
    if outcome.sold as i64 + left != stock || left < 0 {
        println!(
            "OVERSOLD: {} sold + {left} left is not {stock}",
            outcome.sold
        );
        std::process::exit(1);
    }
    println!("sold + left = {stock}: nothing oversold");
    Ok(())
}

fn in_memory(stock: i64) -> Stock {
    Stock::Memory(Arc::new(Mutex::new(HashMap::from([(
        SKU.to_owned(),
        stock,
    )]))))
}

/// A connection for the stock in Redis, which a sale (not a `serve` process) starts
/// with `stock` items.
async fn stock_in_redis(
    url: &str,
    stock: i64,
    serve_only: bool,
) -> Result<redis::aio::MultiplexedConnection, LockError> {
    let backend = LockError::from;
    let redis = redis::Client::open(url).map_err(backend)?;
    let mut data = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(backend)?;
    if !serve_only {
        let () = data
            .set(format!("flash-sale:stock:{SKU}"), stock)
            .await
            .map_err(backend)?;
    }
    Ok(data)
}
