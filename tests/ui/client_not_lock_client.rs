use lock_runtime::{LockError, distributed_lock};

struct Orders {
    redis_url: String,
}

impl Orders {
    #[distributed_lock(client = "self.redis_url", prefix = "orders:create")]
    async fn create(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {}
