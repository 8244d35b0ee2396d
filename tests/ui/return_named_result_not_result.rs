//! A type named like a `Result` is not one: the compiler, not the name, decides.
use lock_runtime::distributed_lock;

struct LookupResult {
    found: bool,
}

#[distributed_lock]
async fn lookup(id: u64) -> LookupResult {
    LookupResult { found: id > 0 }
}

fn main() {}
