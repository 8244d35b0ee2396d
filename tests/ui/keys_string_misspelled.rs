//! A misspelt field in a key written in a string: the error points at the string,
//! and suggests no code that would replace it.
use lock_runtime::{LockError, distributed_lock};

struct CreateOrder {
    user_id: u64,
}

#[distributed_lock(keys = "req.usr_id")]
async fn create_order(req: CreateOrder) -> Result<u64, LockError> {
    Ok(req.user_id)
}

#[distributed_lock(keys(req.usr_id))]
async fn as_code(req: CreateOrder) -> Result<u64, LockError> {
    Ok(req.user_id)
}

fn main() {}
