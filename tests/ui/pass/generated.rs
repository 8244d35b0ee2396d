//! Locked fns written by `macro_rules!`, their options passed in as fragments, which
//! reach the attribute wrapped in invisible groups; and keys under a crate that
//! denies `trivial_casts`.

#![deny(trivial_casts)]

use lock_runtime::{LockClient, LockError, distributed_lock};

macro_rules! locked_by_literals {
    ($name:ident, $prefix:literal, $key:literal, $timeout:literal, $spin:literal) => {
        #[distributed_lock(prefix = $prefix, keys = $key, timeout_ms = $timeout, spin = $spin, guard = lock)]
        async fn $name(id: u64) -> Result<String, LockError> {
            Ok(lock.key().to_owned())
        }
    };
}

macro_rules! locked_by_exprs {
    ($name:ident, $prefix:expr, $keys:expr, $wait:expr) => {
        #[distributed_lock(prefix = $prefix, keys = $keys, wait_ms = $wait, guard = lock)]
        async fn $name(id: u64, region: &str) -> Result<String, LockError> {
            Ok(lock.key().to_owned())
        }
    };
}

macro_rules! locked_by_array_items {
    ($name:ident, $first:literal, $second:literal) => {
        #[distributed_lock(prefix = "items", keys = [$first, $second], guard = lock)]
        async fn $name(id: u64, region: &str) -> Result<String, LockError> {
            Ok(lock.key().to_owned())
        }
    };
}

locked_by_literals!(refund, "refund", "id", 2_000, true);
locked_by_exprs!(ship, "ship", ["region", "id"], 20);
locked_by_array_items!(stock, "id", "region");

#[distributed_lock(prefix = "cast", keys(id, region), guard = lock)]
async fn strict(id: u64, region: &str) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    lock_runtime::set_default_client(LockClient::memory());
    assert_eq!(refund(7).await.unwrap(), "refund:7");
    assert_eq!(ship(8, "eu").await.unwrap(), "ship:eu:8");
    assert_eq!(stock(9, "us").await.unwrap(), "items:9:us");
    assert_eq!(strict(10, "ap").await.unwrap(), "cast:10:ap");
}
