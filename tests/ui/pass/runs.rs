//! The expanded fn runs: it builds the key from the prefix and the arguments, holds
//! the lock while the body runs and releases it on every way out.

use lock_runtime::{LockClient, LockError, LockOptions, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Rejected,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

struct Req {
    id: u64,
    region: &'static str,
}

#[distributed_lock(prefix = "order", keys = ["req.id", "req.region"], fencing = true, guard = lock)]
async fn create_order(req: Req, reject: bool) -> Result<(String, Option<u64>), AppError> {
    if reject {
        Err(AppError::Rejected)?;
    }
    Ok((lock.key().to_owned(), lock.fencing_token()))
}

#[distributed_lock(client = "client", keys = "id", spin = false)]
async fn fail_fast(client: &LockClient, id: u32) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(guard = lock)]
async fn named_after_the_fn() -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let client = LockClient::memory();
    lock_runtime::set_default_client(client.clone());

    let (key, token) = create_order(
        Req {
            id: 42,
            region: "eu:west",
        },
        false,
    )
    .await
    .unwrap();
    assert_eq!(key, r"order:42:eu\:west");
    assert!(token.is_some());

    let error = create_order(
        Req {
            id: 42,
            region: "eu:west",
        },
        true,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, AppError::Rejected), "{error:?}");
    let free = client.try_acquire(&key, &LockOptions::new()).await.unwrap();
    assert!(free.is_some(), "the lock was released after `?`");
    drop(free);

    let held = client
        .acquire(concat!(module_path!(), "::fail_fast:7"), &LockOptions::new())
        .await
        .unwrap();
    let busy = tokio::spawn({
        let client = client.clone();
        async move { fail_fast(&client, 7).await }
    });
    assert!(matches!(busy.await.unwrap(), Err(LockError::Busy { .. })));
    held.release().await.unwrap();
    fail_fast(&client, 7).await.unwrap();

    assert_eq!(
        named_after_the_fn().await.unwrap(),
        concat!(module_path!(), "::named_after_the_fn")
    );
}
