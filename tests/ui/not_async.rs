use lock_runtime::{LockError, distributed_lock};

#[distributed_lock]
fn not_async() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
