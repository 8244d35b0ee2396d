use lock_runtime::distributed_lock;

#[distributed_lock]
async fn lookup(id: u64) -> Option<u64> {
    Some(id)
}

fn main() {}
