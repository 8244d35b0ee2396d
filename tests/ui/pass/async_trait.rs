//! Methods under `#[async_trait]`, which expands before the attribute: keys and the
//! client read `self` and pattern parameters as written, the lock is held, and
//! `#[tracing::instrument]` stacks on either side, in impls and default methods.

use async_trait::async_trait;
use lock_runtime::{LockClient, LockError, LockOptions, distributed_lock};

#[async_trait]
trait Orders {
    async fn cancel(&self, id: u64) -> Result<String, LockError>;
    async fn split(&self, pair: (u64, u64)) -> Result<String, LockError>;
    async fn close(self) -> Result<u32, LockError>;
    async fn touch(&mut self) -> Result<(), LockError>;
    async fn traced(&self, id: u64) -> Result<String, LockError>;
    async fn traced_err(&self, id: u64) -> Result<u64, LockError>;
    async fn traced_ret(&self, id: u64) -> Result<u64, LockError>;
    async fn traced_inside(&self, id: u64) -> Result<String, LockError>;
    async fn create(locks: &LockClient, id: u64) -> Result<u64, LockError>;
    async fn for_tenant(&self, __tenant: u64) -> Result<String, LockError>;

    #[tracing::instrument(skip(self))]
    #[distributed_lock(client = "self.locks()", prefix = "orders:default", keys(id), guard = lock)]
    async fn traced_default(&self, id: u64) -> Result<String, LockError> {
        Ok(lock.key().to_owned())
    }

    fn locks(&self) -> &LockClient;
}

struct Shop {
    locks: LockClient,
    shard: u32,
}

#[async_trait]
impl Orders for Shop {
    #[distributed_lock(client = "self.locks", prefix = "order", keys = ["self.shard", "id"], guard = lock)]
    async fn cancel(&self, id: u64) -> Result<String, LockError> {
        Ok(lock.key().to_owned())
    }

    #[distributed_lock(client = "self.locks", prefix = "pair", keys(self.shard, left, right), guard = lock)]
    async fn split(&self, (left, right): (u64, u64)) -> Result<String, LockError> {
        Ok(format!("{} {}", lock.key(), self.shard))
    }

    #[distributed_lock(client = "self.locks", prefix = "close", keys(self.shard), spin = false)]
    async fn close(self) -> Result<u32, LockError> {
        Ok(self.shard)
    }

    #[distributed_lock(client(&self.locks), prefix = "touch", keys(self.shard))]
    async fn touch(&mut self) -> Result<(), LockError> {
        self.shard += 1;
        Ok(())
    }

    #[tracing::instrument(skip(self))]
    #[distributed_lock(client = "self.locks", prefix = "traced", keys(id), guard = lock)]
    async fn traced(&self, id: u64) -> Result<String, LockError> {
        let doubled = { id * 2 };
        tokio::task::yield_now().await;
        Ok(format!("{} {doubled}", lock.key()))
    }

    #[tracing::instrument(skip(self), err)]
    #[distributed_lock(client = "self.locks", prefix = "traced", keys(id))]
    async fn traced_err(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[tracing::instrument(skip(self), ret, err)]
    #[distributed_lock(client = "self.locks", prefix = "traced", keys(id))]
    async fn traced_ret(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(client = "self.locks", prefix = "traced", keys(id), guard = lock)]
    #[tracing::instrument(skip(self))]
    async fn traced_inside(&self, id: u64) -> Result<String, LockError> {
        Ok(lock.key().to_owned())
    }

    #[distributed_lock(client = "locks", prefix = "create", keys(id))]
    async fn create(locks: &LockClient, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    // Named like `#[async_trait]`'s own `__self` and `__arg0`, but the user's.
    #[distributed_lock(client = "self.locks", prefix = "tenant", keys(__tenant), guard = lock)]
    async fn for_tenant(&self, __tenant: u64) -> Result<String, LockError> {
        Ok(lock.key().to_owned())
    }

    fn locks(&self) -> &LockClient {
        &self.locks
    }
}

/// A `?Send` trait, whose futures need not be `Send`, with a locked default method.
#[async_trait(?Send)]
trait Local {
    fn locks(&self) -> &LockClient;

    async fn count(&self, by: u32) -> Result<u32, LockError>;

    #[distributed_lock(client = "self.locks()", prefix = "local", keys(by), guard = lock)]
    async fn by_default(&self, by: u32) -> Result<String, LockError> {
        Ok(lock.key().to_owned())
    }
}

#[async_trait(?Send)]
impl Local for Shop {
    fn locks(&self) -> &LockClient {
        &self.locks
    }

    #[distributed_lock(client = "self.locks", prefix = "count", keys(by))]
    async fn count(&self, by: u32) -> Result<u32, LockError> {
        Ok(self.shard + by)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut shop = Shop {
        locks: LockClient::memory(),
        shard: 3,
    };
    assert_eq!(shop.cancel(7).await.unwrap(), "order:3:7");
    assert_eq!(shop.split((1, 2)).await.unwrap(), "pair:3:1:2 3");
    shop.touch().await.unwrap();
    assert_eq!(shop.count(1).await.unwrap(), 5);
    assert_eq!(shop.by_default(2).await.unwrap(), "local:2");
    assert_eq!(shop.traced(5).await.unwrap(), "traced:5 10");
    assert_eq!(shop.traced_err(6).await.unwrap(), 6);
    assert_eq!(shop.traced_ret(6).await.unwrap(), 6);
    assert_eq!(shop.traced_inside(8).await.unwrap(), "traced:8");
    assert_eq!(shop.traced_default(9).await.unwrap(), "orders:default:9");
    assert_eq!(Shop::create(&shop.locks, 4).await.unwrap(), 4);
    assert_eq!(shop.for_tenant(11).await.unwrap(), "tenant:11");

    let held = shop
        .locks
        .acquire("close:4", &LockOptions::new())
        .await
        .unwrap();
    let locks = shop.locks.clone();
    let busy = shop.close().await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    held.release().await.unwrap();
    let shop = Shop { locks, shard: 4 };
    assert_eq!(shop.close().await.unwrap(), 4);
}
