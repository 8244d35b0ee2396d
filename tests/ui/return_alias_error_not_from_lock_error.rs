use lock_runtime::distributed_lock;

#[derive(Debug)]
struct AppError;

type Reply<T> = Result<T, AppError>;

#[distributed_lock]
async fn create_order(id: u64) -> Reply<u64> {
    Ok(id)
}

fn main() {}
