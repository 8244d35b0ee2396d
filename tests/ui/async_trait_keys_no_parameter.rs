//! Under `#[async_trait]`, the parameters are still the ones written, patterns included.
use async_trait::async_trait;
use lock_runtime::{LockClient, LockError, distributed_lock};

#[async_trait]
trait Orders {
    async fn cancel(&self, pair: (u64, u64)) -> Result<(), LockError>;
}

struct Shop {
    locks: LockClient,
}

#[async_trait]
impl Orders for Shop {
    #[distributed_lock(client = "self.locks", prefix = "cancel", keys(order, user))]
    async fn cancel(&self, (order, _region): (u64, u64)) -> Result<(), LockError> {
        let _ = order;
        Ok(())
    }
}

fn main() {}
