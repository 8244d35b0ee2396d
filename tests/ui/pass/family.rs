//! The lock family: semaphores and read locks (`permits` and `shared`, and the
//! combinations of them that are allowed), and multi-key locks (`multi`).

use lock_runtime::{LockClient, LockError, LockOptions, distributed_lock};

#[distributed_lock(prefix = "export", permits = 2, spin = false)]
async fn export(batch: u64) -> Result<u64, LockError> {
    Ok(batch)
}

// `permits = 1` is a plain lock, so it may be fenced and taken shared.
#[distributed_lock(prefix = "report", permits = 1, fencing = true, guard = lock)]
async fn fenced_plain_lock() -> Result<Option<u64>, LockError> {
    Ok(lock.fencing_token())
}

#[distributed_lock(prefix = "report", permits = 1, shared = true)]
async fn read_as_plain_lock() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(prefix = "catalog", keys(id), shared = true, spin = false)]
async fn read_catalog(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(prefix = "catalog", keys(id), shared = false, fencing = true, spin = false)]
async fn write_catalog(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

struct Account {
    id: u64,
}

#[distributed_lock(prefix = "account", keys(from.id, to.id), multi = true, guard = accounts)]
async fn transfer(from: &Account, to: &Account) -> Result<Vec<String>, LockError> {
    Ok(accounts.keys().into_iter().map(str::to_owned).collect())
}

fn assert_send<T: Send>(_: T) {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let client = LockClient::memory();
    lock_runtime::set_default_client(client.clone());

    let semaphore = LockOptions::new().permits(2);
    let first = client.acquire("export", &semaphore).await.unwrap();
    assert_eq!(export(5).await.unwrap(), 5, "the second permit is free");
    let second = client.acquire("export", &semaphore).await.unwrap();
    assert!(matches!(export(5).await, Err(LockError::Busy { .. })));
    first.release().await.unwrap();
    second.release().await.unwrap();

    assert!(fenced_plain_lock().await.unwrap().is_some());
    read_as_plain_lock().await.unwrap();

    let reader = client
        .acquire("catalog:9", &LockOptions::new().shared(true))
        .await
        .unwrap();
    assert_eq!(read_catalog(9).await.unwrap(), 9, "readers share the key");
    assert!(matches!(write_catalog(9).await, Err(LockError::Busy { .. })));
    reader.release().await.unwrap();
    assert_eq!(write_catalog(9).await.unwrap(), 9);

    let (a, b) = (Account { id: 1 }, Account { id: 2 });
    let keys = transfer(&b, &a).await.unwrap();
    assert_eq!(keys, ["account:1", "account:2"], "one lock per account, in one order");
    let held = client.acquire("account:2", &LockOptions::new()).await.unwrap();
    let busy = transfer(&a, &b);
    let busy = tokio::time::timeout(std::time::Duration::from_secs(5), busy).await;
    assert!(matches!(busy, Ok(Err(LockError::Timeout { .. }))), "{busy:?}");
    held.release().await.unwrap();

    assert_send(export(1));
    assert_send(transfer(&a, &b));
    assert_send(read_catalog(1));
}
