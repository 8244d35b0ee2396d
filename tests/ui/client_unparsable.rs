use lock_runtime::{LockClient, LockError, distributed_lock};

struct Orders {
    locks: LockClient,
}

impl Orders {
    #[distributed_lock(client = "self.locks(", prefix = "orders:create")]
    async fn create(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {}
