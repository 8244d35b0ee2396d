use lock_runtime::distributed_lock;

#[distributed_lock]
async fn describe(id: u64) -> impl std::fmt::Display {
    id
}

fn main() {}
