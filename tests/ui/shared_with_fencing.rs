use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(prefix = "catalog", keys(id), shared = true, fencing = true)]
async fn read_catalog(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
