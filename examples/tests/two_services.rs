//! Two processes of the flash-sale service against one Redis sell exactly the stock.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_tests::RedisServer;
use redis::Commands;

struct Service {
    process: Child,
    base: String,
}

impl Service {
    fn start(redis: &RedisServer) -> Service {
        let mut process = Command::new(env!("CARGO_BIN_EXE_flash-sale"))
            .arg("serve")
            .env("REDIS_URL", redis.url())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the flash-sale service");
        let mut lines = BufReader::new(process.stdout.take().unwrap()).lines();
        let base = lines
            .find_map(|line| line.ok()?.strip_prefix("listening on ").map(str::to_owned))
            .expect("the service says where it listens");
        Service { process, base }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_on_one_redis_sell_exactly_the_stock() {
    const STOCK: i64 = 50;
    const REQUESTS: usize = 400;
    let redis = RedisServer::start();
    let () = redis
        .connection()
        .set("flash-sale:stock:sku-1", STOCK)
        .unwrap();
    let services = [Service::start(&redis), Service::start(&redis)];
    let urls: Arc<Vec<String>> = Arc::new(
        services
            .iter()
            .map(|service| format!("{}/purchase/sku-1", service.base))
            .collect(),
    );

    let http = reqwest::Client::new();
    let (next, sold, sold_out) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let buyers: Vec<_> = (0..100)
        .map(|_| {
            let (http, urls, next, sold, sold_out) = (
                http.clone(),
                urls.clone(),
                next.clone(),
                sold.clone(),
                sold_out.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let request = next.fetch_add(1, Ordering::Relaxed);
                    if request >= REQUESTS {
                        return;
                    }
                    let response = http
                        .post(&urls[request % 2])
                        .send()
                        .await
                        .expect("the service answers");
                    match response.status().as_u16() {
                        201 => sold.fetch_add(1, Ordering::Relaxed),
                        409 => sold_out.fetch_add(1, Ordering::Relaxed),
                        other => panic!("unexpected status {other}: {:?}", response.text().await),
                    };
                }
            })
        })
        .collect();
    for buyer in buyers {
        buyer.await.unwrap();
    }

    let left: i64 = redis.connection().get("flash-sale:stock:sku-1").unwrap();
    let sold = sold.load(Ordering::Relaxed) as i64;
    assert_eq!(sold + left, STOCK, "sold {sold} and {left} left");
    assert_eq!(left, 0, "demand exceeded the stock, so all of it sold");
    assert_eq!(sold_out.load(Ordering::Relaxed), REQUESTS - STOCK as usize);

    let mut acquired = 0;
    for service in &services {
        let metrics = http
            .get(format!("{}/metrics", service.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        acquired += metrics
            .lines()
            .find_map(|line| {
                line.strip_prefix(r#"distributed_lock_acquired_total{backend="redis"} "#)
            })
            .expect("the service counts its locks")
            .parse::<usize>()
            .unwrap();
    }
    assert_eq!(
        acquired, REQUESTS,
        "one lock per purchase, counted at /metrics"
    );
}
