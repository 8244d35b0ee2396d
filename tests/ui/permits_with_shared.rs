use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(prefix = "report", keys(id), permits = 3, shared = true)]
async fn read_report(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
