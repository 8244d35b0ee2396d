//! The shop: one Axum route that sells an item with a read-then-write of its stock,
//! made safe by `#[distributed_lock]`, and the lock metrics in Prometheus text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_runtime::{LockClient, LockError, distributed_lock};
use metrics_exporter_prometheus::PrometheusHandle;
use redis::AsyncCommands;

#[derive(Clone)]
pub(crate) struct Shop {
    pub(crate) locks: LockClient,
    pub(crate) stock: Stock,
    pub(crate) metrics: PrometheusHandle,
}

/// What keeps two sales of an item apart.
#[derive(Clone, Copy)]
pub(crate) enum Locking {
    /// `#[distributed_lock]`, as a service with several processes needs.
    Distributed,
    /// One mutex of this process for every item (the sale has one): what a lock
    /// that cost nothing would give, to compare with (one process only).
    LocalMutex,
}

/// Where the stock lives. Reads and writes are separate steps on purpose: only the
/// lock keeps two buyers from selling the same item.
#[derive(Clone)]
pub(crate) enum Stock {
    Redis(redis::aio::MultiplexedConnection),
    Memory(Arc<Mutex<HashMap<String, i64>>>),
}

impl Stock {
    pub(crate) async fn read(&self, sku: &str) -> Result<i64, ShopError> {
        match self {
            Stock::Redis(redis) => Ok(redis
                .clone()
                .get::<_, Option<i64>>(stock_key(sku))
                .await?
                .unwrap_or(0)),
            Stock::Memory(stock) => Ok(stock.lock().unwrap().get(sku).copied().unwrap_or(0)),
        }
    }

    pub(crate) async fn write(&self, sku: &str, left: i64) -> Result<(), ShopError> {
        match self {
            Stock::Redis(redis) => Ok(redis.clone().set(stock_key(sku), left).await?),
            Stock::Memory(stock) => {
                tokio::task::yield_now().await;
                stock.lock().unwrap().insert(sku.to_owned(), left);
                Ok(())
            }
        }
    }
}

fn stock_key(sku: &str) -> String {
    format!("flash-sale:stock:{sku}")
}

pub(crate) fn router(shop: Shop, locking: Locking) -> Router {
    let purchase = match locking {
        Locking::Distributed => post(purchase),
        Locking::LocalMutex => post(purchase_under_local_mutex),
    };
    Router::new()
        .route("/purchase/{sku}", purchase)
        .route("/stock/{sku}", get(stock))
        .route("/metrics", get(metrics))
        .with_state(shop)
}

/// Sells one item if any is left: `201` sold, `409` sold out, `423` when the lock
/// stayed busy, `503` when Redis failed.
#[distributed_lock(
    prefix = "flash-sale",
    keys = "sku",
    client = "shop.locks",
    wait_ms = 50,
    timeout_ms = 20_000
)]
async fn purchase(
    State(shop): State<Shop>,
    Path(sku): Path<String>,
) -> Result<Response, ShopError> {
    sell(&shop.stock, &sku).await
}

async fn purchase_under_local_mutex(
    State(shop): State<Shop>,
    Path(sku): Path<String>,
) -> Result<Response, ShopError> {
    static ONE_SALE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_SALE_AT_A_TIME.lock().await;
    sell(&shop.stock, &sku).await
}

async fn sell(stock: &Stock, sku: &str) -> Result<Response, ShopError> {
    let left = stock.read(sku).await?;
    if left <= 0 {
        return Ok((StatusCode::CONFLICT, "sold out").into_response());
    }
    stock.write(sku, left - 1).await?;
    Ok((StatusCode::CREATED, Json(left - 1)).into_response())
}

async fn stock(State(shop): State<Shop>, Path(sku): Path<String>) -> Result<Json<i64>, ShopError> {
    Ok(Json(shop.stock.read(&sku).await?))
}

async fn metrics(State(shop): State<Shop>) -> String {
    shop.metrics.render()
}

pub(crate) enum ShopError {
    Lock(LockError),
    Stock(redis::RedisError),
}

impl From<LockError> for ShopError {
    fn from(error: LockError) -> Self {
        ShopError::Lock(error)
    }
}

impl From<redis::RedisError> for ShopError {
    fn from(error: redis::RedisError) -> Self {
        ShopError::Stock(error)
    }
}

impl IntoResponse for ShopError {
    fn into_response(self) -> Response {
        match self {
            ShopError::Lock(error) => {
                eprintln!("flash-sale: {error}");
                error.into_response()
            }
            ShopError::Stock(error) => {
                // Redis's error text names hosts: it goes to the log, not to the buyer.
                eprintln!("flash-sale: the stock store failed: {error}");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the stock store is unavailable",
                )
                    .into_response()
            }
        }
    }
}
