//! `client = expr` without quotes: the error says how to write it.
use lock_runtime::{LockClient, LockError, distributed_lock};

#[distributed_lock(client = locks)]
async fn create(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    let _ = locks;
    Ok(id)
}

fn main() {}
