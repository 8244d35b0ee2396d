use lock_runtime::{LockError, distributed_lock};

struct CreateOrder {
    user_id: u64,
}

#[distributed_lock(keys(req.user_id, user.id))]
async fn create_order(req: CreateOrder) -> Result<u64, LockError> {
    Ok(req.user_id)
}

fn main() {}
