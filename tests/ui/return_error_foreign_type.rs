//! An error type of another crate cannot have `From<LockError>` (the orphan rule):
//! the error says what to return instead.
use axum::Json;
use axum::http::StatusCode;
use lock_runtime::{LockClient, distributed_lock};

#[distributed_lock(client = "locks", keys(id))]
async fn reserve(locks: &LockClient, id: u64) -> Result<Json<u64>, StatusCode> {
    Ok(Json(id))
}

fn main() {}
