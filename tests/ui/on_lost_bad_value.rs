use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(on_lost = "abort")]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
