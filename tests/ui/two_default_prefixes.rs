use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys(user))]
#[distributed_lock(keys(tenant))]
async fn twice(user: u64, tenant: u64) -> Result<(), LockError> {
    let _ = (user, tenant);
    Ok(())
}

#[distributed_lock(prefix = "user", keys(user))]
#[distributed_lock(keys(tenant))]
async fn once_by_default(user: u64, tenant: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
