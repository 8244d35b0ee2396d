use lock_runtime::{LockError, distributed_lock};

struct UserId(u64);

struct CreateOrder {
    user_id: UserId,
}

#[distributed_lock(keys(req.user_id))]
async fn create_order(req: CreateOrder) -> Result<u64, LockError> {
    Ok(req.user_id.0)
}

fn main() {}
