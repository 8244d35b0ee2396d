use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(expire_ms = 2)]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
