use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(watchdog = false, max_hold_ms = 60_000)]
async fn create_order(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
