use async_trait::async_trait;
use lock_runtime::distributed_lock;

#[async_trait]
trait Orders {
    async fn count(&self) -> Option<u64>;
}

struct Shop;

#[async_trait]
impl Orders for Shop {
    #[distributed_lock]
    async fn count(&self) -> Option<u64> {
        Some(1)
    }
}

fn main() {}
