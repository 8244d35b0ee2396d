//! The signature stays as written: generics, bounds, a where clause, lifetimes,
//! `impl Trait` arguments and a borrowed result.

use std::fmt::Display;

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = "id")]
async fn generic<T, I>(id: T, items: I) -> Result<Vec<String>, LockError>
where
    T: Display + Send,
    I: IntoIterator<Item = u32> + Send,
{
    Ok(items
        .into_iter()
        .map(|item| format!("{id}:{item}"))
        .collect())
}

#[distributed_lock(keys = "name")]
async fn borrowed<'a>(name: &'a str, names: &'a [String]) -> Result<Option<&'a String>, LockError> {
    Ok(names.iter().find(|candidate| *candidate == name))
}

#[distributed_lock(keys = ["tenant", "id"])]
async fn impl_args(
    tenant: impl Display + Send,
    id: impl Display + Send + Sync,
) -> Result<(), LockError> {
    let _ = id.to_string();
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(generic(7, vec![1, 2]));
    let names = vec!["a".to_owned()];
    assert_send(borrowed("a", &names));
    assert_send(impl_args("acme", 42));
}
