//! The load driver: many concurrent buyers over real HTTP on loopback, the way
//! `ab -n 2000 -c 1000` hammers a flash-sale endpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// What the buyers saw.
pub(crate) struct Outcome {
    pub(crate) sold: usize,
    pub(crate) sold_out: usize,
    pub(crate) failed: usize,
    pub(crate) elapsed: Duration,
    /// Sorted.
    pub(crate) latencies: Vec<Duration>,
}

impl Outcome {
    pub(crate) fn percentile(&self, percent: usize) -> Duration {
        let index =
            (self.latencies.len() * percent / 100).min(self.latencies.len().saturating_sub(1));
        self.latencies.get(index).copied().unwrap_or_default()
    }

    pub(crate) fn requests_per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Sends `requests` purchases of `sku`, `concurrency` at a time, spread over the
/// services at `bases` (`http://127.0.0.1:port`).
pub(crate) async fn drive(
    bases: &[String],
    sku: &str,
    requests: usize,
    concurrency: usize,
) -> Outcome {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(60))
        .build()
        .expect("an HTTP client");
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let buyers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (http, next) = (http.clone(), next.clone());
            let urls: Vec<String> = bases
                .iter()
                .map(|base| format!("{base}/purchase/{sku}"))
                .collect();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    let request = next.fetch_add(1, Ordering::Relaxed);
                    if request >= requests {
                        return seen;
                    }
                    let asked = Instant::now();
                    let status = http
                        .post(&urls[request % urls.len()])
                        .send()
                        .await
                        .map(|response| response.status().as_u16());
                    seen.push((status.ok(), asked.elapsed()));
                }
            })
        })
        .collect();
    let mut outcome = Outcome {
        sold: 0,
        sold_out: 0,
        failed: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::with_capacity(requests),
    };
    for buyer in buyers {
        for (status, latency) in buyer.await.expect("a buyer task") {
            match status {
                Some(201) => outcome.sold += 1,
                Some(409) => outcome.sold_out += 1,
                _ => outcome.failed += 1,
            }
            outcome.latencies.push(latency);
        }
    }
    outcome.elapsed = started.elapsed();
    outcome.latencies.sort();
    outcome
}
