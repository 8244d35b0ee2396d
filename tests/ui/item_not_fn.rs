use lock_runtime::distributed_lock;

#[distributed_lock]
struct Orders;

fn main() {}
