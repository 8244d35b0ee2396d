//! `Result` types under any name, with an error type that a lock error converts
//! into; `?` and `return` in the body convert into it, also when the `Ok` type is an
//! `impl Trait`.

use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(error: std::num::ParseIntError) -> Self {
        AppError::Parse(error)
    }
}

type AppResult<T> = Result<T, AppError>;

type Reply<T> = Result<T, AppError>;

mod errors {
    pub type Result<T, E = super::AppError> = std::result::Result<T, E>;
}

#[distributed_lock(keys = "input")]
async fn alias(input: &str) -> AppResult<u64> {
    if input.is_empty() {
        return Ok(0);
    }
    let parsed: u64 = input.parse()?;
    Ok(parsed)
}

#[distributed_lock]
async fn full_path() -> std::result::Result<(), AppError> {
    lock_runtime::default_client()?;
    Ok(())
}

#[distributed_lock]
async fn module_alias() -> errors::Result<u8> {
    Ok("7".parse()?)
}

#[distributed_lock]
async fn boxed() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let _: u8 = "x".parse()?;
    Ok(())
}

#[distributed_lock]
async fn opaque() -> Result<impl std::fmt::Display, LockError> {
    Ok(5)
}

#[distributed_lock(keys(input))]
async fn opaque_with_question_mark(input: &str) -> Result<impl std::fmt::Display, AppError> {
    if input.is_empty() {
        return Ok(0);
    }
    let parsed: u64 = input.parse()?;
    Ok(parsed)
}

#[distributed_lock]
async fn opaque_alias() -> Reply<impl std::fmt::Debug> {
    Ok("7".parse::<u8>()?)
}

#[distributed_lock]
async fn named_anything() -> Reply<Vec<u8>> {
    Ok(vec!["7".parse()?])
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(alias("1"));
    assert_send(full_path());
    assert_send(module_alias());
    assert_send(boxed());
    assert_send(opaque());
    assert_send(opaque_with_question_mark("1"));
    assert_send(opaque_alias());
    assert_send(named_anything());
    let _ = |error: AppError| matches!(error, AppError::Lock(_) | AppError::Parse(_));
}
