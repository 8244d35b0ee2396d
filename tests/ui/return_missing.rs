use lock_runtime::distributed_lock;

#[distributed_lock]
async fn fire_and_forget(id: u64) {
    let _ = id;
}

fn main() {}
