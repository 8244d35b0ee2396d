//! Where generated tokens are located, so that the compiler reports errors at the
//! user's tokens.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::ToTokens;

/// The spans of the first and the last token of `tokens`: an expression whose every
/// token is located in the user's code, from the first to the last, is reported
/// over all of `tokens` (one token located at the attribute would move it there).
pub(crate) fn ends(tokens: &impl ToTokens) -> (Span, Span) {
    let mut tokens = tokens.to_token_stream().into_iter();
    let first = tokens
        .next()
        .map_or_else(Span::call_site, |token| token.span());
    let last = tokens.last().map_or(first, |token| token.span());
    (first, last)
}

/// `tokens`, every one located at `span`.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut group = Group::new(group.delimiter(), respan(group.stream(), span));
                group.set_span(span);
                token = TokenTree::Group(group);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}
