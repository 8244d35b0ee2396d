//! With the watchdog off and no `expire_ms`, the 30 s default is a fixed lease, which
//! a longer window would outlast.
use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(watchdog = false, hold_at_least_ms = 60_000)]
async fn nightly_report() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(watchdog = false, hold_at_least_ms = 30_000)]
async fn within_the_lease() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
