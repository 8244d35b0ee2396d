use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(prefix = "export", permits = 4, fencing = true, guard = lock)]
async fn export(batch: u64) -> Result<Option<u64>, LockError> {
    let _ = batch;
    Ok(lock.fencing_token())
}

fn main() {}
