//! Above `#[tokio::main]`, the attribute sees the `async fn` and locks around its
//! body, which the runtime then runs.

use lock_runtime::{LockClient, LockError, distributed_lock};

#[distributed_lock(prefix = "nightly", client(LockClient::memory()), guard = lock)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    assert_eq!(lock.key(), "nightly");
    assert!(lock.is_held());
    Ok(())
}
