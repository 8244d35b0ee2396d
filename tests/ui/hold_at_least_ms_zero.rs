use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(spin = false, hold_at_least_ms = 0)]
async fn nightly_report() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
