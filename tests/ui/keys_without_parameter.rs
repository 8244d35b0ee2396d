//! A key that uses no parameter would be the same on every call.
use lock_runtime::{LockError, distributed_lock};

const SHARD: u32 = 3;

#[distributed_lock(keys = "\"fixed\"")]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(prefix = "order", keys("v2", id))]
async fn versioned(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(keys(SHARD, u64::MAX))]
async fn constants(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
