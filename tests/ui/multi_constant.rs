use lock_runtime::{LockError, distributed_lock};

const ONE_LOCK_PER_ACCOUNT: bool = true;

#[distributed_lock(prefix = "account", keys(from, to), multi = ONE_LOCK_PER_ACCOUNT)]
async fn transfer(from: u64, to: u64) -> Result<(u64, u64), LockError> {
    Ok((from, to))
}

fn main() {}
