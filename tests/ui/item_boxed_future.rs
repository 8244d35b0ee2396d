//! A fn that returns a boxed future by hand is not `#[async_trait]`'s: the attribute
//! could not tell which part of it is the body, so it refuses it.
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, distributed_lock};

#[distributed_lock(client = "locks", keys(id), spin = false)]
fn run<'a>(
    locks: &'a LockClient,
    id: u64,
) -> Pin<Box<dyn Future<Output = Result<u64, LockError>> + Send + 'a>> {
    Box::pin(async move {
        let _ = locks;
        let checked: Result<u64, LockError> = { Ok(id) };
        tokio::time::sleep(Duration::from_millis(200)).await;
        checked
    })
}

#[distributed_lock(client = "locks", keys(id))]
fn doubled<'a>(
    locks: &'a LockClient,
    id: u64,
) -> Pin<Box<dyn Future<Output = Result<u64, LockError>> + Send + 'a>> {
    Box::pin(async move {
        let _ = locks;
        let doubled = { id * 2 };
        Ok(doubled)
    })
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[distributed_lock(client = "locks", keys(id))]
fn aliased(locks: &LockClient, id: u64) -> BoxFuture<'_, Result<u64, LockError>> {
    Box::pin(async move {
        let _ = locks;
        let checked: Result<u64, LockError> = { Ok(id) };
        checked
    })
}

fn main() {}
