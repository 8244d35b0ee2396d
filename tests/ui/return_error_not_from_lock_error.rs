use lock_runtime::distributed_lock;

#[derive(Debug)]
struct AppError;

#[distributed_lock]
async fn create_order(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
