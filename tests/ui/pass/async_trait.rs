//! Methods under `#[async_trait]`, which expands before the attribute: keys and the
//! client read `self` and pattern parameters as written, and the lock is held.

use async_trait::async_trait;
use lock_runtime::{LockClient, LockError, LockOptions, distributed_lock};

#[async_trait]
trait Orders {
    async fn cancel(&self, id: u64) -> Result<String, LockError>;
    async fn split(&self, pair: (u64, u64)) -> Result<String, LockError>;
    async fn close(self) -> Result<u32, LockError>;
    async fn touch(&mut self) -> Result<(), LockError>;
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

    #[distributed_lock(client = "self.locks", keys(self.shard), spin = false)]
    async fn close(self) -> Result<u32, LockError> {
        Ok(self.shard)
    }

    #[distributed_lock(client = "&self.locks", keys(self.shard))]
    async fn touch(&mut self) -> Result<(), LockError> {
        self.shard += 1;
        Ok(())
    }
}

/// A `?Send` trait, whose futures need not be `Send`, with a locked default method.
#[async_trait(?Send)]
trait Local {
    fn locks(&self) -> &LockClient;

    async fn count(&self, by: u32) -> Result<u32, LockError>;

    #[distributed_lock(client = "self.locks()", keys(by), guard = lock)]
    async fn by_default(&self, by: u32) -> Result<String, LockError> {
        Ok(lock.key().to_owned())
    }
}

#[async_trait(?Send)]
impl Local for Shop {
    fn locks(&self) -> &LockClient {
        &self.locks
    }

    #[distributed_lock(client = "self.locks", keys(by))]
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
    assert_eq!(
        shop.by_default(2).await.unwrap(),
        concat!(module_path!(), "::by_default:2")
    );

    let held = shop
        .locks
        .acquire(concat!(module_path!(), "::close:4"), &LockOptions::new())
        .await
        .unwrap();
    let locks = shop.locks.clone();
    let busy = shop.close().await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    held.release().await.unwrap();
    let shop = Shop { locks, shard: 4 };
    assert_eq!(shop.close().await.unwrap(), 4);
}
