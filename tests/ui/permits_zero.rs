use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(prefix = "export", permits = 0)]
async fn export(batch: u64) -> Result<u64, LockError> {
    Ok(batch)
}

fn main() {}
