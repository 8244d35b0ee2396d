//! A prefix named by a `&str` constant, which the code that inspects or builds the
//! same key names too.

use lock_runtime::{LockClient, LockError, LockKey, distributed_lock};

const ORDER_LOCKS: &str = "order";

mod locks {
    pub(crate) static EXPORTS: &str = "export";
}

#[distributed_lock(prefix = ORDER_LOCKS, keys(id), guard = lock)]
async fn cancel(id: u64) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(prefix = locks::EXPORTS, guard = lock)]
async fn export() -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    lock_runtime::set_default_client(LockClient::memory());
    let expected = LockKey::new(ORDER_LOCKS).part(7);
    assert_eq!(cancel(7).await.unwrap(), expected.as_str());
    assert_eq!(export().await.unwrap(), "export");
}
