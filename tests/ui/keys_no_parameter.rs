use lock_runtime::{LockError, distributed_lock};

struct CreateOrder {
    user_id: u64,
}

struct AppState;

#[distributed_lock(keys = "user.id")]
async fn create_order(req: CreateOrder, state: &AppState) -> Result<u64, LockError> {
    let _ = state;
    Ok(req.user_id)
}

fn main() {}
