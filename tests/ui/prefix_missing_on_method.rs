//! A method takes no default prefix: the module path and its name would be shared
//! with a method named alike on another type in the module.
use async_trait::async_trait;
use lock_runtime::{LockClient, LockError, distributed_lock};

struct Orders {
    locks: LockClient,
}

impl Orders {
    #[distributed_lock(client = "self.locks", keys(id))]
    async fn cancel(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(client = "locks", keys(id))]
    async fn open(locks: LockClient, id: u64) -> Result<Self, LockError> {
        let _ = id;
        Ok(Orders { locks })
    }
}

#[async_trait]
trait Jobs {
    async fn run(locks: &LockClient, id: u64) -> Result<u64, LockError>;
}

#[async_trait]
impl Jobs for Orders {
    #[distributed_lock(client = "locks", keys(id))]
    async fn run(locks: &LockClient, id: u64) -> Result<u64, LockError> {
        let _ = locks;
        Ok(id)
    }
}

fn main() {}
