use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(prefix = order, keys(id))]
async fn unquoted(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(prefix = 42, keys(id))]
async fn a_number(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

const NOT_TEXT: u64 = 7;

#[distributed_lock(prefix = NOT_TEXT, keys(id))]
async fn a_constant_not_text(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
