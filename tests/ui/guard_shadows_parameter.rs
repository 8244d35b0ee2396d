use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = "id", guard = lock)]
async fn create_order((id, lock): (u64, bool)) -> Result<u64, LockError> {
    Ok(if lock { id } else { 0 })
}

fn main() {}
