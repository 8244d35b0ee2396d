//! Methods: a client read from `self`, `self` taken by value, and a guard used in
//! the body.

use lock_runtime::{LockClient, LockError, distributed_lock};

struct Orders {
    locks: LockClient,
    shard: u32,
}

impl Orders {
    #[distributed_lock(client = "self.locks", keys = ["self.shard", "id"])]
    async fn cancel(&self, id: u64) -> Result<u64, LockError> {
        Ok(id + u64::from(self.shard))
    }

    // The client is cloned and the key built before the body moves `self`.
    #[distributed_lock(client = "self.locks", keys = "self.shard")]
    async fn close(self) -> Result<Orders, LockError> {
        Ok(self)
    }

    #[distributed_lock(client = "&self.locks", fencing = true, guard = lock)]
    async fn write(&mut self) -> Result<Option<u64>, LockError> {
        self.shard += 1;
        Ok(lock.fencing_token())
    }

    #[distributed_lock(client = "self.locks", keys = "id")]
    async fn reaches_self_in_the_body(&self, id: u64) -> Result<u64, LockError> {
        Ok(self.cancel(id).await? * 2)
    }
}

trait Store {
    fn locks(&self) -> &LockClient;

    // The default body of a trait method.
    #[distributed_lock(client = "self.locks()", keys = "key")]
    async fn put(&self, key: &str) -> Result<(), LockError> {
        let _ = key;
        Ok(())
    }
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let mut orders = Orders {
        locks: LockClient::memory(),
        shard: 1,
    };
    assert_send(orders.cancel(1));
    assert_send(orders.reaches_self_in_the_body(1));
    assert_send(orders.write());
    assert_send(orders.close());
}
