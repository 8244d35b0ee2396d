use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(spin = false, expire_ms = 5_000, hold_at_least_ms = 60_000)]
async fn nightly_report() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
