//! Names bound by patterns are parameters too, and keys can be any expression that
//! starts from them.

use lock_runtime::{LockError, distributed_lock};

struct Wrapper<T>(T);

struct Req {
    id: u64,
    region: String,
    items: Vec<u32>,
}

struct Point {
    x: i32,
    y: i32,
}

const SHARD: u32 = 3;

#[distributed_lock(keys = ["a", "b"])]
async fn tuple((a, b): (u32, u32)) -> Result<u32, LockError> {
    Ok(a + b)
}

#[distributed_lock(keys = ["inner.id", "inner.region.as_str()"])]
async fn tuple_struct(Wrapper(inner): Wrapper<Req>) -> Result<u64, LockError> {
    Ok(inner.id)
}

#[distributed_lock(keys = ["x", "y"])]
async fn struct_pattern(Point { x, y }: Point, &offset: &i32) -> Result<i32, LockError> {
    Ok(x + y + offset)
}

#[distributed_lock(keys = [
    "req.items.len()",
    "req.items[0] % SHARD",
    "format!(\"{}-{}\", req.region, req.id)",
    "req.items.iter().map(|item| u64::from(*item)).sum::<u64>()",
    "(req.id as u32).max(SHARD)",
])]
async fn expressions(req: &Req) -> Result<u64, LockError> {
    Ok(req.id)
}

#[distributed_lock(keys = "first")]
async fn slice([first, ..]: [u8; 4], mut count: u32) -> Result<u32, LockError> {
    count += u32::from(first);
    Ok(count)
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let req = Req {
        id: 1,
        region: "eu".to_owned(),
        items: vec![1],
    };
    assert_send(expressions(&req));
    assert_send(tuple((1, 2)));
    assert_send(struct_pattern(Point { x: 1, y: 2 }, &3));
    assert_send(slice([1, 2, 3, 4], 0));
    assert_send(tuple_struct(Wrapper(req)));
}
