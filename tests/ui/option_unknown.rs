use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(prefix = "order", retry = 3)]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
