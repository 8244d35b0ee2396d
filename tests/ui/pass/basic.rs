//! The shape from the docs: a key from a parameter's field, an app error type, and a
//! future that can be spawned.

use lock_runtime::{LockError, distributed_lock};

struct CreateOrder {
    user_id: u64,
}

struct Order {
    id: u64,
}

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    OutOfStock,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

fn check_stock(user_id: u64) -> Result<(), AppError> {
    if user_id == 0 {
        Err(AppError::OutOfStock)
    } else {
        Ok(())
    }
}

/// Doc comments and other attributes stay on the fn.
#[distributed_lock(prefix = "order", keys = "req.user_id", spin = true, retries = 20)]
#[must_use = "an order that is not awaited is never created"]
pub async fn create_order(req: CreateOrder) -> Result<Order, AppError> {
    check_stock(req.user_id)?;
    if req.user_id == 7 {
        return Err(AppError::OutOfStock);
    }
    Ok(Order { id: req.user_id })
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(create_order(CreateOrder { user_id: 1 }));
    let _ = |order: Order| order.id;
    let _ = |error: AppError| matches!(error, AppError::Lock(_));
}
