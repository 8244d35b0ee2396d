//! The `#[distributed_lock]` attribute. Use it through `lock-runtime`, which re-exports
//! it as `lock_runtime::distributed_lock` and holds everything the generated code
//! calls; the attribute's docs list every option.
//!
//! The crate reads as parse (`attr` for the options, `item` for the fn), validate
//! (`valid`), expand (`expand`).

#![warn(missing_docs)]

mod attr;
mod expand;
mod item;
mod manifest;
mod span;
mod valid;

use proc_macro::TokenStream;
use syn::ItemFn;

/// Runs an `async fn` while holding a distributed lock.
///
/// The fn builds its key from the prefix and key expressions, takes the lock through
/// the `LockClient` (waiting as the options say), runs its body while the lock is
/// held and releases the lock on every way out: return, `?`, panic, and the future
/// being dropped.
///
/// When the lock cannot be had, or its lease is lost, the fn returns the lock error in
/// its own return type, which must be able to carry one. The compiler checks that
/// through a trait bound, so aliases under any name work:
///
/// - `Result<T, E>` with `E: From<LockError>` (`Result<T, LockError>`,
///   `type Reply<T> = Result<T, AppError>`, `anyhow::Result<T>`). `T` may be an
///   `impl Trait`; `?` in the body converts into `E` as in any fn.
/// - With lock-runtime's `axum` feature, `axum::response::Response` and
///   `impl IntoResponse` (recognised by its syntax: the body's value and the lock
///   error both go through `into_response()`); with its `actix` feature,
///   `actix_web::HttpResponse`.
///
/// ```
/// use lock_runtime::{LockError, distributed_lock};
///
/// struct CreateOrder { user_id: u64 }
///
/// #[distributed_lock(prefix = "order", keys(req.user_id), retries = 20)]
/// async fn create_order(req: CreateOrder) -> Result<u64, LockError> {
///     Ok(req.user_id) // runs alone among the holders of `order:<user_id>`
/// }
///
/// #[derive(Debug)]
/// struct AppError(LockError);
///
/// impl From<LockError> for AppError {
///     fn from(error: LockError) -> Self { AppError(error) }
/// }
///
/// type Reply<T> = Result<T, AppError>;
///
/// #[distributed_lock(prefix = "order", keys(req.user_id))]
/// async fn describe_order(req: CreateOrder) -> Reply<impl std::fmt::Display> {
///     let locks = lock_runtime::default_client()?; // `?` converts the LockError
///     Ok(format!("order {} on {locks:?}", req.user_id))
/// }
/// ```
///
/// On a method of an `#[async_trait]` impl or trait, which `async_trait` has
/// rewritten by the time the attribute runs, the attribute finds the body in what
/// `async_trait` made and locks around it; keys and `client` still say `self`. It
/// takes `async_trait`'s output only as `async_trait` writes it, and refuses any
/// other fn that returns a future (a boxed one written by hand included): it could
/// not tell which part of such a fn is the body, and would lock less than it seems
/// to. The attribute stacks with `#[tracing::instrument]` (`#[async_trait]` methods
/// included) and `#[axum::debug_handler]` in either order, goes under Actix's
/// route macros (`#[post("/")]`), and above `#[tokio::main]` and `#[tokio::test]`,
/// which make the fn a plain one. Its options may come from `macro_rules!`
/// fragments (`prefix = $prefix`).
///
/// Without a `client` option the fn uses the client given to
/// `lock_runtime::set_default_client` at start-up, and returns
/// `LockError::NoDefaultClient` when there is none.
///
/// # Options
///
/// Each option is given at most once, as `name = value` (`keys` also as `keys(..)`),
/// separated by commas. Times (`*_ms`) are whole milliseconds, at least 1, written
/// without a suffix. A count, a time, or a `true`/`false` option other than `multi`
/// may also be the name of a constant, by a path that ends in a capital
/// (`timeout_ms = PAYMENT_TIMEOUT_MS`, a `u64`; `retries` and `permits` take a `u32`,
/// `spin = FAIL_FAST` a `bool`): the compiler checks its type there, and the runtime
/// checks its value on every call as it checks `LockOptions`: a value the attribute
/// would refuse written out fails with `LockError::InvalidOptions`, except a zero
/// `timeout_ms`, which tries once without waiting. `multi` decides the code written
/// for the fn, so it is written out.
///
/// ## `prefix = "name"` or `prefix = CONSTANT`
///
/// The first part of the key, taken as written: `prefix = "tenant:order"` with a key
/// of `42` names the same lock as `LockKey::new("tenant:order").part(42)` and the
/// plain key `"tenant:order:42"`. A `&str` constant or static, named by a path
/// that ends in a capital (`prefix = ORDER_LOCKS`, `prefix = locks::EXPORTS`),
/// gives its value, so the code that builds or inspects the same keys can name
/// the same constant.
///
/// A free fn defaults to its module path and name (`my_crate::orders::cancel`), so
/// two fns named alike in two modules never share a lock. A method has no default:
/// the attribute sees the fn, not the type it belongs to, and `Orders::cancel` and
/// `Payments::cancel` in one module would share one. So a fn that takes `self`,
/// names `Self` in its signature, or is an `#[async_trait]` method does not compile
/// without `prefix`. An associated fn that does neither looks like a free fn to the
/// attribute; should two such fns come to one default prefix, the second to run in
/// a process fails with `LockError::InvalidOptions` instead of sharing the lock:
/// give each a `prefix`. The default does not depend on the compiler, so every
/// build of the same code names the same lock; it starts with the crate's name,
/// though, so code compiled into two crates, or moved to another module, names
/// another lock: a lock shared across those needs a `prefix`. Two
/// `#[distributed_lock]` on one fn would come to the same default, and do not
/// compile unless one of them has a `prefix`.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(prefix = "nightly-report")]
/// async fn build_report() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `keys(expr, ...)`, `keys = "expr"` or `keys = ["expr", ...]`
///
/// Rust expressions over the fn's parameters, each appended to the key through its
/// `Display`: written as code, `keys(show.id, seat)`, which editors see and rename
/// like any other code, or each in a string. Both forms give the same key. Names
/// bound by patterns count as parameters, and so does `self`. An expression may be
/// of any kind (`db.tenant_of(user).await`, `if admin { 0 } else { id }`, a `match`,
/// a closure called in place, `format!("{region}-{id}")`) and name anything in
/// scope (`req.shard(Region::Eu)`, `SHARDS`); the compiler judges those names. Each
/// must use a parameter: one that uses none, such as `"v2"`, would be the same on
/// every call, and belongs in `prefix`. Without `keys`, the fn takes one lock per
/// prefix.
///
/// The parts form one lock (`book:7:12` for seat 12 of show 7 below). A transfer
/// between two accounts, which must exclude every other transfer touching either,
/// takes a lock per account instead: see `multi`.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// # struct Show { id: u64 }
/// #[distributed_lock(prefix = "book", keys(show.id, seat))]
/// async fn book(show: &Show, seat: u32) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// #[distributed_lock(keys = ["x", "y"])]
/// async fn paint((x, y): (i32, i32)) -> Result<(), LockError> {
///     Ok(())
/// }
/// # let _ = (book, paint);
/// ```
///
/// ## `spin = bool`
///
/// Wait for a busy lock (`true`, the default), or fail at once with `LockError::Busy`
/// (`false`). `spin = false` cannot be combined with `retries`, `wait_ms` or
/// `timeout_ms`.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(spin = false)]
/// async fn refresh_cache() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `retries = n`
///
/// How many times to wait a full pause (`wait_ms`) and try again before giving up
/// with `LockError::Timeout`; waking early to a release and losing the race does not
/// use one up. Defaults to 20, or unbounded when only `timeout_ms` is given.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(retries = 100)]
/// async fn patient() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `wait_ms = n`
///
/// The longest pause between attempts, in milliseconds; a release wakes waiters
/// sooner. Defaults to 50.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(retries = 10, wait_ms = 200)]
/// async fn slow_poll() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `timeout_ms = n`
///
/// An overall deadline for acquiring, in milliseconds. With `retries` too, whichever
/// comes first ends the waiting.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(timeout_ms = 2_000)]
/// async fn bounded() -> Result<(), LockError> {
///     Ok(())
/// }
///
/// const PAYMENT_TIMEOUT_MS: u64 = 5_000;
///
/// #[distributed_lock(prefix = "payment", timeout_ms = PAYMENT_TIMEOUT_MS)]
/// async fn pay() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `expire_ms = n`
///
/// A fixed lease in milliseconds, at least 3: the lock frees itself this long after it
/// was taken, and the watchdog is off unless `watchdog = true`. Without it, the lease
/// is 30 s and the watchdog renews it every 10 s while the body runs.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(expire_ms = 5_000)]
/// async fn short_job() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `watchdog = bool`
///
/// Renew the lease while the body runs. Defaults to `true` without `expire_ms`, and
/// to `false` with it.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(expire_ms = 2_000, watchdog = true)]
/// async fn renewed_every_two_thirds_of_a_second() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `max_hold_ms = n`
///
/// The longest the watchdog keeps renewing, in milliseconds; after that the lease runs
/// out. It needs the watchdog: not with `watchdog = false`, and with `expire_ms` only
/// alongside `watchdog = true`.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(max_hold_ms = 600_000)]
/// async fn at_most_ten_minutes() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `hold_at_least_ms = n`
///
/// Keep the lock until at least `n` milliseconds after it was taken, even when the
/// body ends sooner. With `spin = false`, a job scheduled on several replicas runs
/// once per window: the replicas that come later in the window get
/// `LockError::Busy` and skip it. Without the watchdog the lease is fixed (`expire_ms`,
/// or 30 s with `watchdog = false`), and the window may not be longer than it.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(prefix = "nightly-report", spin = false, hold_at_least_ms = 60_000)]
/// async fn nightly_report() -> Result<(), LockError> {
///     Ok(()) // runs on one replica per minute, however many start it
/// }
/// ```
///
/// ## `reentrant = bool`
///
/// Let a call made inside the body on the same key and client re-enter the lock with
/// no round trip (`true`, the default), or fail with `LockError::Reentered` (`false`).
/// Re-entry is lexical: the body runs inside the hold, and calls it awaits are
/// inside too. Calls it joins take turns; a task it spawns is another owner and
/// waits for the lock (failing with `Timeout` if the body outlasts its budget).
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(reentrant = false)]
/// async fn not_twice() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// ## `fencing = bool`
///
/// Issue a fencing token, strictly increasing per key, with each acquisition. Read it
/// through `guard`. Defaults to `false`. Only for exclusive holds: not with `shared`
/// nor a semaphore (`permits` above 1). With `multi`, the token is the first key's,
/// in the order the keys are taken.
///
/// ## `permits = n`
///
/// A semaphore: up to `n` callers hold the key at once, each with a lease of its
/// own, renewed and lost as a lock's is; the next waits for one of them to let go.
/// `permits = 1` is a plain lock, and `0` does not compile. Every holder of a key
/// must ask for the same number of permits: a caller that asks for another, or
/// takes the key as a lock, gets `LockError::InvalidOptions`. Not with `shared`
/// (a semaphore has no shared side) nor `fencing` (holders at once cannot have one
/// increasing token). Refused on a Redlock client at run time with `InvalidOptions`,
/// since majorities that overlap in no master could grant more permits than there
/// are.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(prefix = "export", permits = 4)]
/// async fn export(batch: u64) -> Result<(), LockError> {
///     Ok(()) // at most four exports run at once, across every process
/// }
/// ```
///
/// ## `shared = bool`
///
/// Take the key as a reader: shared holders hold it together, and an exclusive
/// holder (any fn or acquire on the same key without `shared`) holds it alone. A
/// waiting exclusive holder keeps new readers out, so writers do not starve.
/// Defaults to `false`. Not with `fencing`, nor with a semaphore (`permits` above
/// 1).
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(prefix = "catalog", keys(id), shared = true)]
/// async fn read_catalog(id: u64) -> Result<(), LockError> {
///     Ok(()) // alongside other readers of `catalog:<id>`
/// }
///
/// #[distributed_lock(prefix = "catalog", keys(id))]
/// async fn write_catalog(id: u64) -> Result<(), LockError> {
///     Ok(()) // alone: no reader and no other writer
/// }
/// ```
///
/// ## `multi = bool`
///
/// Make each key expression a lock of its own under the prefix, and take them all
/// before the body runs, or none (through `LockClient::acquire_all`). Without it
/// (the default), the key expressions are the parts of one lock. Every client
/// takes keys in one order, whatever order `keys` lists them in, so two calls
/// that list the same keys in different orders cannot deadlock; a key listed twice
/// is taken once. The other options apply to each key, and the time to wait is
/// shared among them. `multi = true` needs `keys`. Taking several locks while
/// holding one could deadlock, so a `multi` fn called inside a hold of the same
/// client (another annotated fn's body) fails with `LockError::InvalidOptions`.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// # struct Account { id: u64 }
/// #[distributed_lock(prefix = "account", keys(from.id, to.id), multi = true)]
/// async fn transfer(from: &Account, to: &Account, cents: u64) -> Result<(), LockError> {
///     Ok(()) // alone among the transfers that touch either account
/// }
/// # let _ = transfer;
/// ```
///
/// ## `guard = name`
///
/// Binds `name: &LockGuard` in the body: its fencing token, `is_held()`, `lost()`,
/// `extend(..)`. The name must not be a parameter's.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// # struct Store;
/// # impl Store { async fn write(&self, _token: Option<u64>) -> Result<(), LockError> { Ok(()) } }
/// #[distributed_lock(fencing = true, guard = lock)]
/// async fn save(store: &Store) -> Result<(), LockError> {
///     store.write(lock.fencing_token()).await
/// }
/// ```
///
/// ## `client(expr)` or `client = "expr"`
///
/// An expression over the parameters giving the `LockClient` to use (or a reference
/// to one, or anything that derefs to one), instead of the default client: written
/// as code, or in a string. It is cloned before the body runs, so a method may take
/// `self` by value.
///
/// ```
/// # use lock_runtime::{LockClient, LockError, distributed_lock};
/// struct Orders { locks: LockClient }
///
/// impl Orders {
///     #[distributed_lock(client(self.locks), prefix = "orders:cancel", keys(id))]
///     async fn cancel(&self, id: u64) -> Result<(), LockError> {
///         Ok(())
///     }
/// }
/// ```
///
/// ## `on_lost = "cancel"` or `on_lost = "continue"`
///
/// What happens when the lease is lost while the body runs. With `"cancel"` (the
/// default) the body is dropped at its next `.await` and the fn returns
/// `Err(LockError::Lost)`. With `"continue"` the body runs to the end; it can watch
/// the lock through `guard`.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(on_lost = "continue", guard = lock)]
/// async fn best_effort() -> Result<bool, LockError> {
///     Ok(lock.is_held())
/// }
/// ```
///
/// ## `crate = "path"`
///
/// The path to `lock-runtime`, for a crate that renamed the dependency or reaches it
/// through a re-export. Defaults to `::lock_runtime`; when the crate's `Cargo.toml`
/// renames the dependency and this option is missing, the error says what to write.
///
/// ```
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(crate = "::lock_runtime")]
/// async fn through_a_path() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// # Errors at compile time
///
/// Each is reported at the tokens at fault: a fn that is not `async`; a method
/// without `prefix`; a return type that cannot carry a lock error (one error at the
/// return type, saying what would); an unknown, repeated or mistyped option; a key
/// expression that does not parse, uses no parameter, or whose value is not
/// `Display`; a guard named like a parameter; and options that the runtime would
/// refuse on every call (`spin = false` with waiting options, `permits` above 1
/// with `shared` or `fencing`, `shared` with `fencing`, `multi` without `keys`,
/// `max_hold_ms` without the watchdog, `hold_at_least_ms` longer than a fixed
/// lease).
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    distributed_lock_inner(args.into(), item.into())
        .unwrap_or_else(|error| {
            // The fn as written keeps the rest of the crate, and the IDE, type-checking.
            let mut output = error.to_compile_error();
            output.extend(original);
            output
        })
        .into()
}

fn distributed_lock_inner(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let options: attr::Options = syn::parse2(args)?;
    if options.krate.is_none()
        && let Some(name) = manifest::renamed_runtime()
    {
        return Err(syn::Error::new(
            proc_macro2::Span::call_site(),
            format!(
                "`#[distributed_lock]` looks for lock-runtime at `::lock_runtime`, but this \
                 crate's Cargo.toml names it `{name}`; say so with `crate = \"::{name}\"`"
            ),
        ));
    }
    let function: ItemFn = syn::parse2(item).map_err(|error| {
        syn::Error::new(
            error.span(),
            "`#[distributed_lock]` goes on an `async fn` with a body",
        )
    })?;
    let function = item::Function::parse(function)?;
    let returns = valid::check(&options, &function)?;
    Ok(expand::expand(&options, function, &returns))
}
