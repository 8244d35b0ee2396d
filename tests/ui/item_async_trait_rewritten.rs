//! `#[async_trait]`'s signature with a body it did not write, as another attribute
//! above `#[distributed_lock]` might leave it, or as written by hand: refused, since
//! part of the body could run outside the lock.
use std::future::Future;
use std::pin::Pin;

use lock_runtime::{LockClient, LockError, distributed_lock};

struct Shop {
    locks: LockClient,
}

impl Shop {
    #[distributed_lock(client = "self.locks", prefix = "shop:count", keys(id))]
    fn count<'life0, 'async_trait>(
        &'life0 self,
        id: u64,
    ) -> Pin<Box<dyn Future<Output = Result<u64, LockError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
    {
        Box::pin(async move {
            let __ret: Result<u64, LockError> = { Ok(id) };
            tokio::task::yield_now().await;
            __ret
        })
    }
}

fn main() {}
