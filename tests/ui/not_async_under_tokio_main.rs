use lock_runtime::{LockError, distributed_lock};

#[tokio::main]
#[distributed_lock(prefix = "nightly")]
async fn main() -> Result<(), LockError> {
    Ok(())
}
