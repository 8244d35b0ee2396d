//! Methods, each with its `prefix`: `self` in every receiver form, a client read
//! from `self`, written as code or in a string, through a lock guard too, and a
//! guard used in the body.

use std::sync::{Arc, Mutex, RwLock};

use lock_runtime::{LockClient, LockError, distributed_lock};

struct Orders {
    locks: LockClient,
    shard: u32,
}

impl Orders {
    #[distributed_lock(client = "self.locks", prefix = "orders:cancel", keys = ["self.shard", "id"])]
    async fn cancel(&self, id: u64) -> Result<u64, LockError> {
        Ok(id + u64::from(self.shard))
    }

    // The client is cloned and the key built before the body moves `self`.
    #[distributed_lock(client = "self.locks", prefix = "orders:close", keys = "self.shard")]
    async fn close(self) -> Result<Orders, LockError> {
        Ok(self)
    }

    #[distributed_lock(client(&self.locks), prefix = "orders:write", fencing = true, guard = lock)]
    async fn write(&mut self) -> Result<Option<u64>, LockError> {
        self.shard += 1;
        Ok(lock.fencing_token())
    }

    #[distributed_lock(client(self.locks), prefix = "orders:double", keys(id))]
    async fn reaches_self_in_the_body(&self, id: u64) -> Result<u64, LockError> {
        Ok(self.cancel(id).await? * 2)
    }

    #[distributed_lock(client(self.locks), prefix = "orders:shared", keys(self.shard))]
    async fn shared(self: Arc<Self>) -> Result<u32, LockError> {
        Ok(self.shard)
    }

    // No `self`, but `Self` in the signature: an associated fn.
    #[distributed_lock(client(locks), prefix = "orders:open", keys(shard))]
    async fn open(locks: LockClient, shard: u32) -> Result<Self, LockError> {
        Ok(Orders { locks, shard })
    }
}

/// Clients behind locks: the guard lives while the client is cloned, not across the
/// body's awaits.
struct Registry {
    current: Mutex<LockClient>,
    by_region: RwLock<Vec<LockClient>>,
}

impl Registry {
    #[distributed_lock(client(self.current.lock().unwrap()), prefix = "registry:current", keys(id))]
    async fn current(&self, id: u64) -> Result<u64, LockError> {
        tokio::task::yield_now().await;
        Ok(id)
    }

    #[distributed_lock(
        client = "self.by_region.read().unwrap()[region]",
        prefix = "registry:region",
        keys(region)
    )]
    async fn in_region(&self, region: usize) -> Result<usize, LockError> {
        tokio::task::yield_now().await;
        Ok(region)
    }
}

trait Store {
    fn locks(&self) -> &LockClient;

    // The default body of a trait method.
    #[distributed_lock(client(self.locks()), prefix = "store:put", keys(key))]
    async fn put(&self, key: &str) -> Result<(), LockError> {
        let _ = key;
        Ok(())
    }
}

fn assert_send<T: Send>(_: T) {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut orders = Orders::open(LockClient::memory(), 1).await.unwrap();
    assert_send(orders.cancel(1));
    assert_send(orders.reaches_self_in_the_body(1));
    assert_send(orders.write());
    assert_eq!(orders.reaches_self_in_the_body(2).await.unwrap(), 6);
    assert!(orders.write().await.unwrap().is_some());
    let orders = Arc::new(orders.close().await.unwrap());
    assert_eq!(orders.clone().shared().await.unwrap(), 2);
    assert_send(orders.shared());

    let registry = Registry {
        current: Mutex::new(LockClient::memory()),
        by_region: RwLock::new(vec![LockClient::memory(), LockClient::memory()]),
    };
    assert_send(registry.current(1));
    assert_send(registry.in_region(1));
    assert_eq!(registry.current(3).await.unwrap(), 3);
    assert_eq!(registry.in_region(1).await.unwrap(), 1);
}
