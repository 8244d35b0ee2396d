use lock_runtime::{LockError, distributed_lock};

const CHECKOUT_TIMEOUT_MS: u32 = 5_000;

#[distributed_lock(prefix = "checkout", timeout_ms = CHECKOUT_TIMEOUT_MS)]
async fn checkout(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
