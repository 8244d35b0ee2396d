//! The options of `#[distributed_lock(...)]` and their parsing.

use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitInt, LitStr, Path, Token, UnOp, token};

use crate::span::{ends, respan};

mod kw {
    syn::custom_keyword!(prefix);
    syn::custom_keyword!(keys);
    syn::custom_keyword!(spin);
    syn::custom_keyword!(retries);
    syn::custom_keyword!(wait_ms);
    syn::custom_keyword!(timeout_ms);
    syn::custom_keyword!(expire_ms);
    syn::custom_keyword!(max_hold_ms);
    syn::custom_keyword!(hold_at_least_ms);
    syn::custom_keyword!(watchdog);
    syn::custom_keyword!(reentrant);
    syn::custom_keyword!(fencing);
    syn::custom_keyword!(permits);
    syn::custom_keyword!(shared);
    syn::custom_keyword!(multi);
    syn::custom_keyword!(guard);
    syn::custom_keyword!(client);
    syn::custom_keyword!(on_lost);
}

const OPTIONS: &str = "`prefix`, `keys`, `spin`, `retries`, `wait_ms`, `timeout_ms`, \
    `expire_ms`, `max_hold_ms`, `hold_at_least_ms`, `watchdog`, `reentrant`, `fencing`, `permits`, `shared`, \
    `multi`, `guard`, `client`, `on_lost`, `crate`";

/// Redis rejects longer expiry times; the runtime's `MAX_LEASE`.
const MAX_LEASE_MS: u64 = 1 << 52;
/// The drift allowance uses up shorter leases; the runtime's `MIN_LEASE`.
const MIN_LEASE_MS: u64 = 3;

/// The lease without `expire_ms`; the runtime's `WATCHDOG_LEASE`.
pub(crate) const WATCHDOG_LEASE_MS: u64 = 30_000;

/// One option as written: its value, and its `name = value` tokens for errors about
/// the option as a whole.
pub(crate) struct Setting<T> {
    pub(crate) value: T,
    tokens: TokenStream,
}

impl<T> Setting<T> {
    pub(crate) fn error(&self, message: impl Display) -> syn::Error {
        syn::Error::new_spanned(&self.tokens, message)
    }
}

/// Rust code given to an option, written as code or inside a string literal, with
/// where its first and last tokens are: type errors in the code point from one to
/// the other. Parsed from a string, every token is located at the string.
pub(crate) struct Code<T> {
    pub(crate) code: T,
    pub(crate) first: Span,
    pub(crate) last: Span,
    in_string: bool,
}

impl<T: ToTokens> Code<T> {
    fn written(code: T) -> Code<T> {
        let (first, last) = ends(&code);
        Code {
            code,
            first,
            last,
            in_string: false,
        }
    }

    /// The code to expand. Code from a string stays located at the string, but
    /// resolves as the attribute's own tokens do: the compiler then reports its
    /// errors at the string without suggesting code to put in its place, which
    /// would replace the whole string.
    pub(crate) fn tokens(&self) -> TokenStream {
        let tokens = self.code.to_token_stream();
        if self.in_string {
            respan(tokens, self.first.resolved_at(Span::call_site()))
        } else {
            tokens
        }
    }
}

/// An option's value: written out, or named, a constant the fn's code can name too,
/// whose type the compiler checks where the name is.
pub(crate) enum Given<T> {
    Written(T),
    Named(Path),
}

impl<T> Given<T> {
    /// The value, when it is written out: a named one is known only to the compiler.
    pub(crate) fn written(&self) -> Option<&T> {
        match self {
            Given::Written(value) => Some(value),
            Given::Named(_) => None,
        }
    }

    fn try_map<U>(self, check: impl FnOnce(T) -> syn::Result<U>) -> syn::Result<Given<U>> {
        match self {
            Given::Written(value) => check(value).map(Given::Written),
            Given::Named(path) => Ok(Given::Named(path)),
        }
    }
}

impl<T: ToTokens> ToTokens for Given<T> {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        match self {
            Given::Written(value) => value.to_tokens(tokens),
            Given::Named(path) => path.to_tokens(tokens),
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum OnLost {
    Cancel,
    Continue,
}

#[derive(Default)]
pub(crate) struct Options {
    pub(crate) prefix: Option<Setting<Given<LitStr>>>,
    /// Each key expression; parsed from a string, its tokens carry the string's span.
    pub(crate) keys: Option<Setting<Vec<Code<Expr>>>>,
    pub(crate) spin: Option<Setting<Given<bool>>>,
    pub(crate) retries: Option<Setting<Given<u32>>>,
    pub(crate) wait_ms: Option<Setting<Given<u64>>>,
    pub(crate) timeout_ms: Option<Setting<Given<u64>>>,
    pub(crate) expire_ms: Option<Setting<Given<u64>>>,
    pub(crate) max_hold_ms: Option<Setting<Given<u64>>>,
    pub(crate) hold_at_least_ms: Option<Setting<Given<u64>>>,
    pub(crate) watchdog: Option<Setting<Given<bool>>>,
    pub(crate) reentrant: Option<Setting<Given<bool>>>,
    pub(crate) fencing: Option<Setting<Given<bool>>>,
    pub(crate) permits: Option<Setting<Given<u32>>>,
    pub(crate) shared: Option<Setting<Given<bool>>>,
    pub(crate) multi: Option<Setting<bool>>,
    pub(crate) guard: Option<Setting<Ident>>,
    pub(crate) client: Option<Setting<Code<Expr>>>,
    pub(crate) on_lost: Option<Setting<OnLost>>,
    pub(crate) krate: Option<Setting<Code<Path>>>,
}

impl Parse for Options {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut options = Options::default();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::prefix) {
                set::<kw::prefix, _>(input, &mut options.prefix, prefix)?;
            } else if lookahead.peek(kw::keys) && input.peek2(token::Paren) {
                key_exprs(input, &mut options.keys)?;
            } else if lookahead.peek(kw::keys) {
                set::<kw::keys, _>(input, &mut options.keys, keys)?;
            } else if lookahead.peek(kw::spin) {
                set::<kw::spin, _>(input, &mut options.spin, boolean)?;
            } else if lookahead.peek(kw::retries) {
                set::<kw::retries, _>(input, &mut options.retries, retries)?;
            } else if lookahead.peek(kw::wait_ms) {
                set::<kw::wait_ms, _>(input, &mut options.wait_ms, millis)?;
            } else if lookahead.peek(kw::timeout_ms) {
                set::<kw::timeout_ms, _>(input, &mut options.timeout_ms, millis)?;
            } else if lookahead.peek(kw::expire_ms) {
                set::<kw::expire_ms, _>(input, &mut options.expire_ms, expire_millis)?;
            } else if lookahead.peek(kw::max_hold_ms) {
                set::<kw::max_hold_ms, _>(input, &mut options.max_hold_ms, millis)?;
            } else if lookahead.peek(kw::hold_at_least_ms) {
                set::<kw::hold_at_least_ms, _>(input, &mut options.hold_at_least_ms, lease_millis)?;
            } else if lookahead.peek(kw::watchdog) {
                set::<kw::watchdog, _>(input, &mut options.watchdog, boolean)?;
            } else if lookahead.peek(kw::reentrant) {
                set::<kw::reentrant, _>(input, &mut options.reentrant, boolean)?;
            } else if lookahead.peek(kw::fencing) {
                set::<kw::fencing, _>(input, &mut options.fencing, opt_in)?;
            } else if lookahead.peek(kw::permits) {
                set::<kw::permits, _>(input, &mut options.permits, permits)?;
            } else if lookahead.peek(kw::shared) {
                set::<kw::shared, _>(input, &mut options.shared, opt_in)?;
            } else if lookahead.peek(kw::multi) {
                set::<kw::multi, _>(input, &mut options.multi, multi)?;
            } else if lookahead.peek(kw::guard) {
                set::<kw::guard, _>(input, &mut options.guard, guard)?;
            } else if lookahead.peek(kw::client) && input.peek2(token::Paren) {
                client_expr(input, &mut options.client)?;
            } else if lookahead.peek(kw::client) {
                set::<kw::client, _>(input, &mut options.client, client)?;
            } else if lookahead.peek(kw::on_lost) {
                set::<kw::on_lost, _>(input, &mut options.on_lost, on_lost)?;
            } else if lookahead.peek(Token![crate]) {
                set::<Token![crate], _>(input, &mut options.krate, krate)?;
            } else if input.peek(Ident::peek_any) {
                let unknown = input.call(Ident::parse_any)?;
                return Err(syn::Error::new_spanned(
                    &unknown,
                    format!("unknown option `{unknown}`; the options are {OPTIONS}"),
                ));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(options)
    }
}

/// Parses `name = value` into `slot`, refusing a second `name`. `convert` checks the
/// value; it gets the option's name for its messages.
fn set<K, T>(
    input: ParseStream<'_>,
    slot: &mut Option<Setting<T>>,
    convert: fn(&str, &Expr) -> syn::Result<T>,
) -> syn::Result<()>
where
    K: Parse + ToTokens,
{
    let keyword: K = first_keyword(input, slot.is_some())?;
    let name = keyword.to_token_stream().to_string();
    let eq: Token![=] = input.parse()?;
    let expr = ungrouped(input.parse()?);
    let value = convert(&name, &expr)?;
    *slot = Some(Setting {
        value,
        tokens: quote!(#keyword #eq #expr),
    });
    Ok(())
}

/// `expr` without the invisible group around a value that `macro_rules!` passed in
/// (`prefix = $prefix`, with `$prefix:literal` or `$prefix:expr`).
fn ungrouped(expr: Expr) -> Expr {
    match expr {
        Expr::Group(group) => ungrouped(*group.expr),
        expr => expr,
    }
}

/// The option's name, refused when the option was given before.
fn first_keyword<K: Parse + ToTokens>(input: ParseStream<'_>, given: bool) -> syn::Result<K> {
    let keyword: K = input.parse()?;
    if given {
        return Err(syn::Error::new_spanned(
            &keyword,
            format!("duplicate `{}` option", keyword.to_token_stream()),
        ));
    }
    Ok(keyword)
}

/// `keys(req.user_id, from.id)`: the key expressions written as code, which editors
/// complete and rename like any other.
fn key_exprs(
    input: ParseStream<'_>,
    slot: &mut Option<Setting<Vec<Code<Expr>>>>,
) -> syn::Result<()> {
    let keyword: kw::keys = first_keyword(input, slot.is_some())?;
    let content;
    let paren = syn::parenthesized!(content in input);
    let exprs = Punctuated::<Expr, Token![,]>::parse_terminated(&content)?;
    if exprs.is_empty() {
        return Err(syn::Error::new(
            paren.span.join(),
            "`keys()` is empty; list at least one key, or drop `keys` to take one lock per prefix",
        ));
    }
    let mut tokens = keyword.to_token_stream();
    paren.surround(&mut tokens, |tokens| exprs.to_tokens(tokens));
    *slot = Some(Setting {
        value: exprs.into_iter().map(Code::written).collect(),
        tokens,
    });
    Ok(())
}

/// `client(self.locks)`: the client written as code, like `keys(..)`.
fn client_expr(input: ParseStream<'_>, slot: &mut Option<Setting<Code<Expr>>>) -> syn::Result<()> {
    let keyword: kw::client = first_keyword(input, slot.is_some())?;
    let content;
    let paren = syn::parenthesized!(content in input);
    let expr: Expr = content.parse()?;
    if !content.is_empty() {
        return Err(content.error(
            "`client(..)` takes one expression, the `LockClient` to use, like `client(self.locks)`",
        ));
    }
    let mut tokens = keyword.to_token_stream();
    paren.surround(&mut tokens, |tokens| expr.to_tokens(tokens));
    *slot = Some(Setting {
        value: Code::written(expr),
        tokens,
    });
    Ok(())
}

fn string(expr: &Expr, expected: impl FnOnce() -> String) -> syn::Result<LitStr> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit.clone()),
        _ => Err(syn::Error::new_spanned(expr, expected())),
    }
}

/// An integer written out, or the name of a constant of type `ty`.
fn integer(name: &str, expr: &Expr, example: u64, ty: &str) -> syn::Result<Given<LitInt>> {
    if let Some(path) = constant(expr) {
        return Ok(Given::Named(path));
    }
    let expected = format!("`{name}` takes an integer, like `{name} = {example}`");
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) if lit.suffix().is_empty() => Ok(Given::Written(lit.clone())),
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => Err(syn::Error::new_spanned(
            lit,
            format!("{expected}, without the `{}` suffix", lit.suffix()),
        )),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => Err(syn::Error::new_spanned(
            expr,
            format!("`{name}` cannot be negative"),
        )),
        _ => Err(syn::Error::new_spanned(
            expr,
            format!("{expected}, or the name of a `{ty}` constant"),
        )),
    }
}

/// The path in `expr` when it names a constant, by its case: a lowercase name is
/// more likely a value mistyped, a string without its quotes say.
fn constant(expr: &Expr) -> Option<Path> {
    match expr {
        Expr::Path(path)
            if path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| is_item_like(&last.ident)) =>
        {
            Some(path.path.clone())
        }
        _ => None,
    }
}

fn too_large(lit: &LitInt, name: &str, max: impl Display) -> syn::Error {
    syn::Error::new_spanned(
        lit,
        format!("`{name}` is too large; the most it takes is {max}"),
    )
}

/// Parses the string literal in `expr` as Rust code. `noun` names the code in
/// messages: "key `req.` is not an expression".
fn embedded<T>(
    name: &str,
    noun: &str,
    expr: &Expr,
    example: &str,
    what: &str,
    parse: fn(ParseStream<'_>) -> syn::Result<T>,
) -> syn::Result<Code<T>> {
    let lit = string(expr, || {
        format!("`{name}` takes {what} in a string, like `{name} = \"{example}\"`")
    })?;
    // `LitStr::parse_with` locates every parsed token at the literal.
    let code = lit.parse_with(parse).map_err(|error| {
        let source = lit.value();
        let reason = match source.parse::<TokenStream>() {
            Ok(_) => error.to_string(),
            Err(_) => "it does not tokenize; check that its brackets and quotes pair up".to_owned(),
        };
        syn::Error::new(
            lit.span(),
            format!("{noun} `{source}` is not {what}: {reason}"),
        )
    })?;
    Ok(Code {
        code,
        first: lit.span(),
        last: lit.span(),
        in_string: true,
    })
}

fn prefix(name: &str, expr: &Expr) -> syn::Result<Given<LitStr>> {
    if let Some(path) = constant(expr) {
        return Ok(Given::Named(path));
    }
    let lit = string(expr, || {
        format!(
            "`{name}` takes a string, like `{name} = \"order\"`, or the name of a `&str` \
             constant, like `{name} = ORDER_LOCKS`"
        )
    })?;
    if lit.value().is_empty() {
        return Err(syn::Error::new_spanned(
            lit,
            "`prefix` must not be empty; drop it to use the fn's module path and name",
        ));
    }
    Ok(Given::Written(lit))
}

/// `Shard`, `SHARD`, `Eu`: a type, constant or variant, not a value of the fn's.
pub(crate) fn is_item_like(ident: &Ident) -> bool {
    ident
        .unraw()
        .to_string()
        .starts_with(|c: char| c.is_ascii_uppercase())
}

fn keys(name: &str, expr: &Expr) -> syn::Result<Vec<Code<Expr>>> {
    let key = |expr: &Expr| {
        embedded(
            name,
            "key",
            expr,
            "req.user_id",
            "an expression",
            Expr::parse,
        )
    };
    match expr {
        Expr::Array(array) if array.elems.is_empty() => Err(syn::Error::new_spanned(
            array,
            "`keys` is empty; list at least one key, or drop `keys` to take one lock per prefix",
        )),
        Expr::Array(array) => (array.elems.iter())
            .map(|elem| key(&ungrouped(elem.clone())))
            .collect(),
        Expr::Lit(_) => Ok(vec![key(expr)?]),
        _ => Err(syn::Error::new_spanned(
            expr,
            "`keys` takes expressions, like `keys(req.user_id, from.id)`, or the same in \
             strings: `keys = \"req.user_id\"` or `keys = [\"req.user_id\", \"from.id\"]`",
        )),
    }
}

/// A switch that is on unless turned off: its example says `false`.
fn boolean(name: &str, expr: &Expr) -> syn::Result<Given<bool>> {
    switch(name, expr, false)
}

/// A switch that is off unless turned on: its example says `true`.
fn opt_in(name: &str, expr: &Expr) -> syn::Result<Given<bool>> {
    switch(name, expr, true)
}

fn switch(name: &str, expr: &Expr, example: bool) -> syn::Result<Given<bool>> {
    if let Some(path) = constant(expr) {
        return Ok(Given::Named(path));
    }
    written_switch(expr).map(Given::Written).ok_or_else(|| {
        syn::Error::new_spanned(
            expr,
            format!(
                "`{name}` takes `true` or `false`, like `{name} = {example}`, or the name of a \
                 `bool` constant"
            ),
        )
    })
}

/// `multi` decides the code written for the fn, one lock or one per key, so it is
/// written out: a constant has its value only once that code is compiled.
fn multi(name: &str, expr: &Expr) -> syn::Result<bool> {
    match written_switch(expr) {
        Some(value) => Ok(value),
        None if constant(expr).is_some() => Err(syn::Error::new_spanned(
            expr,
            format!(
                "`{name}` takes `true` or `false` written out, like `{name} = true`, not a \
                 constant: it decides whether the fn takes one lock or one lock per key, which \
                 is settled before a constant has its value"
            ),
        )),
        None => Err(syn::Error::new_spanned(
            expr,
            format!("`{name}` takes `true` or `false`, like `{name} = true`"),
        )),
    }
}

fn written_switch(expr: &Expr) -> Option<bool> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(lit),
            ..
        }) => Some(lit.value),
        _ => None,
    }
}

fn retries(name: &str, expr: &Expr) -> syn::Result<Given<u32>> {
    integer(name, expr, 20, "u32")?.try_map(|lit| {
        lit.base10_parse()
            .map_err(|_| too_large(&lit, name, u32::MAX))
    })
}

fn permits(name: &str, expr: &Expr) -> syn::Result<Given<u32>> {
    integer(name, expr, 5, "u32")?.try_map(|lit| match lit.base10_parse() {
        Ok(0) => Err(syn::Error::new_spanned(
            lit,
            format!(
                "`{name}` must be at least 1, the number of callers that may hold the lock at \
                 once; `{name} = 1` is a plain lock"
            ),
        )),
        Ok(permits) => Ok(permits),
        Err(_) => Err(too_large(&lit, name, u32::MAX)),
    })
}

fn millis(name: &str, expr: &Expr) -> syn::Result<Given<u64>> {
    integer(name, expr, 500, "u64")?.try_map(|lit| whole_millis(name, &lit))
}

fn lease_millis(name: &str, expr: &Expr) -> syn::Result<Given<u64>> {
    integer(name, expr, 500, "u64")?.try_map(|lit| lease(name, &lit))
}

fn expire_millis(name: &str, expr: &Expr) -> syn::Result<Given<u64>> {
    integer(name, expr, 30_000, "u64")?.try_map(|lit| match lit.base10_parse::<u64>() {
        Ok(millis) if millis < MIN_LEASE_MS => Err(syn::Error::new_spanned(
            lit,
            format!(
                "`{name}` must be at least {MIN_LEASE_MS} ms: the allowance for clock drift \
                 (1% + 2 ms) uses up a shorter lease, so it could never be held"
            ),
        )),
        _ => lease(name, &lit),
    })
}

fn whole_millis(name: &str, lit: &LitInt) -> syn::Result<u64> {
    match lit.base10_parse() {
        Ok(0) => Err(syn::Error::new_spanned(
            lit,
            format!("`{name}` must be at least 1 ms"),
        )),
        Ok(millis) => Ok(millis),
        Err(_) => Err(too_large(lit, name, u64::MAX)),
    }
}

fn lease(name: &str, lit: &LitInt) -> syn::Result<u64> {
    let millis = whole_millis(name, lit)?;
    if millis > MAX_LEASE_MS {
        return Err(syn::Error::new_spanned(
            lit,
            format!(
                "`{name}` is longer than Redis accepts; use at most {MAX_LEASE_MS}, \
                 or drop it to have the watchdog renew a shorter lease"
            ),
        ));
    }
    Ok(millis)
}

fn guard(name: &str, expr: &Expr) -> syn::Result<Ident> {
    // Parsing as `Ident` also refuses keywords such as `self`.
    syn::parse2(expr.to_token_stream()).map_err(|_| {
        syn::Error::new_spanned(
            expr,
            format!("`{name}` takes an identifier, like `{name} = lock`"),
        )
    })
}

fn client(name: &str, expr: &Expr) -> syn::Result<Code<Expr>> {
    if !matches!(expr, Expr::Lit(_)) {
        return Err(syn::Error::new_spanned(
            expr,
            format!(
                "`{name}` takes an expression, like `{name}(self.locks)`, or the same in a \
                 string: `{name} = \"self.locks\"`"
            ),
        ));
    }
    embedded(
        name,
        "client",
        expr,
        "self.locks",
        "an expression",
        Expr::parse,
    )
}

fn krate(name: &str, expr: &Expr) -> syn::Result<Code<Path>> {
    embedded(
        name,
        "crate",
        expr,
        "::lock_runtime",
        "a path",
        Path::parse_mod_style,
    )
}

fn on_lost(name: &str, expr: &Expr) -> syn::Result<OnLost> {
    let expected = format!("`{name}` takes `\"cancel\"` or `\"continue\"`");
    let lit = string(expr, || format!("{expected}, like `{name} = \"continue\"`"))?;
    match lit.value().as_str() {
        "cancel" => Ok(OnLost::Cancel),
        "continue" => Ok(OnLost::Continue),
        other => Err(syn::Error::new_spanned(
            lit,
            format!("{expected}, not `\"{other}\"`"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_LEASE_MS, MIN_LEASE_MS, WATCHDOG_LEASE_MS};

    #[test]
    fn the_leases_checked_here_are_the_runtime_s() {
        assert_eq!(
            u128::from(WATCHDOG_LEASE_MS),
            lock_runtime::WATCHDOG_LEASE.as_millis()
        );
        assert_eq!(
            u128::from(MAX_LEASE_MS),
            lock_runtime::MAX_LEASE.as_millis()
        );
        assert_eq!(
            u128::from(MIN_LEASE_MS),
            lock_runtime::MIN_LEASE.as_millis()
        );
    }
}
