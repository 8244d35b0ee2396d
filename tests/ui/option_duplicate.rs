use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(spin = true, retries = 3, spin = false)]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
