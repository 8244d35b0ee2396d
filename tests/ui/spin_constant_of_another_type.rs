use lock_runtime::{LockError, distributed_lock};

const FAIL_FAST: u8 = 0;

#[distributed_lock(prefix = "checkout", spin = FAIL_FAST)]
async fn checkout(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
