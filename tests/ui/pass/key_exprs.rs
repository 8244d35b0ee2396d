//! Keys written as code, `keys(req.id, req.region)`, name the same lock as the same
//! keys written in strings; and keys are Rust expressions of any kind over the
//! parameters, of any `Display` type, sized or not, where the names that are not
//! parameters are the compiler's to judge.

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

mod regions {
    pub enum Region {
        Eu,
        Us,
    }
}

use regions::Region::{self, Eu};

struct Db;

impl Db {
    async fn tenant_of(&self, user: u64) -> u64 {
        user / 10
    }
}

impl Req {
    fn shard(&self, region: Region) -> u64 {
        match region {
            Region::Eu => self.id,
            Region::Us => self.id + 1,
        }
    }
}

enum Target {
    Order(u64),
    Account { id: u64 },
    Everything,
}

#[distributed_lock(prefix = "tenant", keys(db.tenant_of(user).await, user), guard = lock)]
async fn awaited(db: &Db, user: u64) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(prefix = "branch", keys(if admin { 0 } else { id }), guard = lock)]
async fn branched(admin: bool, id: u64) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(
    prefix = "target",
    keys(match target {
        Target::Order(order) => *order,
        Target::Account { id } => id + 1_000,
        Target::Everything => 0,
    }),
    guard = lock,
)]
async fn matched(target: &Target) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(prefix = "shard", keys(req.shard(Eu)), guard = lock)]
async fn imported_variant(req: &Req) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(
    prefix = "forms",
    keys(
        (|offset: u64| id + offset)(1),
        { let doubled = id * 2; doubled },
        format!("{id}-{SHARD}"),
        [id; 2].iter().sum::<u64>(),
    ),
    guard = lock,
)]
async fn closures_blocks_and_captures(id: u64) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
}

#[distributed_lock(prefix = "unsized", keys(*name, name[..3]), guard = lock)]
async fn unsized_keys(name: &str) -> Result<String, LockError> {
    Ok(lock.key().to_owned())
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

    assert_eq!(awaited(&Db, 42).await.unwrap(), "tenant:4:42");
    assert_eq!(branched(true, 7).await.unwrap(), "branch:0");
    assert_eq!(branched(false, 7).await.unwrap(), "branch:7");
    assert_eq!(matched(&Target::Order(5)).await.unwrap(), "target:5");
    assert_eq!(matched(&Target::Account { id: 5 }).await.unwrap(), "target:1005");
    assert_eq!(matched(&Target::Everything).await.unwrap(), "target:0");
    assert_eq!(imported_variant(&req).await.unwrap(), "shard:42");
    assert_eq!(req.shard(Region::Us), 43);
    assert_eq!(
        closures_blocks_and_captures(5).await.unwrap(),
        "forms:6:10:5-3:10"
    );
    assert_eq!(
        unsized_keys("london").await.unwrap(),
        "unsized:london:lon"
    );
}
