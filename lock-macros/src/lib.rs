//! The `#[distributed_lock]` attribute. Use it through `lock-runtime`.

use proc_macro::TokenStream;

/// Runs an async fn while holding a distributed lock (expansion lands with the attribute).
#[proc_macro_attribute]
pub fn distributed_lock(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
