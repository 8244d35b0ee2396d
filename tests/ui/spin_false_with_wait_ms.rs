use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(wait_ms = 100, spin = false)]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
