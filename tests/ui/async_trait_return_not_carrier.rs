use async_trait::async_trait;
use lock_runtime::distributed_lock;

#[async_trait]
trait Orders {
    async fn count(&self) -> Option<u64>;
    async fn ping(&self);
}

struct Shop;

#[async_trait]
impl Orders for Shop {
    #[distributed_lock(prefix = "count")]
    async fn count(&self) -> Option<u64> {
        Some(1)
    }

    #[distributed_lock(prefix = "ping")]
    async fn ping(&self) {}
}

fn main() {}
