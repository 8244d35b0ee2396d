use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(prefix = "account", keys(from, to), multi = "yes")]
async fn transfer(from: u64, to: u64) -> Result<(u64, u64), LockError> {
    Ok((from, to))
}

fn main() {}
