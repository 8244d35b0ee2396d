//! Keys written as code, `keys(req.id, req.region)`, name the same lock as the same
//! keys written in strings.

use lock_runtime::{LockClient, LockError, LockOptions, distributed_lock};

struct Req {
    id: u64,
    region: &'static str,
}

const SHARD: u32 = 3;

#[distributed_lock(prefix = "order", keys = ["req.id", "req.region"], guard = lock)]
async fn in_strings(req: &Req) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(prefix = "order", keys(req.id, req.region), guard = lock)]
async fn as_code(req: &Req) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(prefix = "order", keys(req.id, req.region,), spin = false)]
async fn fail_fast(req: &Req) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys(
    format!("{}-{}", req.region, req.id),
    req.id % u64::from(SHARD),
    [a, b].len(),
))]
async fn expressions(req: &Req, (a, b): (u8, u8)) -> Result<(), LockError> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let client = LockClient::memory();
    lock_runtime::set_default_client(client.clone());
    let req = Req {
        id: 42,
        region: "eu:west",
    };
    let key = in_strings(&req).await.unwrap();
    assert_eq!(key, r"order:42:eu\:west");
    assert_eq!(as_code(&req).await.unwrap(), key, "both forms name one lock");

    let held = client.acquire(&key, &LockOptions::new()).await.unwrap();
    assert!(matches!(fail_fast(&req).await, Err(LockError::Busy { .. })));
    held.release().await.unwrap();
    fail_fast(&req).await.unwrap();
    expressions(&req, (1, 2)).await.unwrap();
}
