//! Checks of the options against each other and against the fn.

use syn::punctuated::Punctuated;
use syn::{Expr, GenericArgument, Ident, PathArguments, ReturnType, Token, Type, TypeParamBound};

use crate::attr::{Options, Setting};
use crate::item::Function;

/// How a lock error reaches the caller.
pub(crate) enum Returns {
    /// Through `CarriesLockError`, implemented by the fn's return type: written here
    /// with `_` for each `impl Trait` in it (`Result<_, E>`), which the body fills in.
    Carrier(Box<Type>),
    /// `impl IntoResponse`: the body's value and the lock error both become a
    /// `Response`.
    IntoResponse,
}

/// Every error found, so that one build reports them all.
pub(crate) fn check(options: &Options, function: &Function) -> syn::Result<Returns> {
    let returns = returns(function);
    let mut errors = contradictions(options);
    let params = &function.params;
    if let Some(guard) = &options.guard
        && params.contains(&guard.value)
    {
        errors.push(syn::Error::new_spanned(
            &guard.value,
            format!(
                "`guard = {0}` would shadow the parameter `{0}`; name the guard differently",
                guard.value
            ),
        ));
    }
    for key in options.keys.iter().flat_map(|keys| &keys.value) {
        if let Err(error) = names_parameters(key, params) {
            errors.push(error);
        }
    }
    let mut errors = returns.as_ref().err().cloned().into_iter().chain(errors);
    match errors.next() {
        None => returns,
        Some(mut first) => {
            first.extend(errors);
            Err(first)
        }
    }
}

const EXPECTED: &str = "to report a lock it could not take, `#[distributed_lock]` needs the fn \
    to return `Result<T, E>` with `E: From<LockError>`, or with the `axum` or `actix` feature \
    a response: `Response`, `impl IntoResponse`, `HttpResponse`";

/// A named return type is left to the compiler, which checks it against
/// `CarriesLockError`; an opaque one is recognised here by its syntax.
fn returns(function: &Function) -> syn::Result<Returns> {
    let Some(ty) = &function.output else {
        let sig = function.sig();
        return Err(match &sig.output {
            ReturnType::Type(_, ty) => syn::Error::new_spanned(ty, EXPECTED),
            ReturnType::Default => syn::Error::new_spanned(sig, EXPECTED),
        });
    };
    match ungrouped(ty) {
        Type::ImplTrait(opaque) if opaque.bounds.iter().any(is_into_response) => {
            Ok(Returns::IntoResponse)
        }
        Type::ImplTrait(opaque) => Err(syn::Error::new_spanned(
            opaque,
            "`#[distributed_lock]` cannot return a lock error through an `impl Trait` other \
             than axum's `impl IntoResponse`; name the type, or return `Result<impl Trait, E>` \
             with `E: From<LockError>`",
        )),
        _ => Ok(Returns::Carrier(Box::new(infer_impl_trait(ty)))),
    }
}

fn ungrouped(mut ty: &Type) -> &Type {
    while let Type::Group(group) = ty {
        ty = &group.elem;
    }
    ty
}

fn is_into_response(bound: &TypeParamBound) -> bool {
    matches!(bound, TypeParamBound::Trait(bound)
        if bound.path.segments.last().is_some_and(|last| last.ident == "IntoResponse"))
}

/// `ty` with `_` for each `impl Trait`: a type a `let` can name.
fn infer_impl_trait(ty: &Type) -> Type {
    let mut ty = ty.clone();
    infer_in(&mut ty);
    ty
}

fn infer_in(ty: &mut Type) {
    match ty {
        Type::ImplTrait(opaque) => {
            *ty = Type::Infer(syn::TypeInfer {
                underscore_token: Token![_](opaque.impl_token.span),
            });
        }
        Type::Path(path) => {
            for segment in &mut path.path.segments {
                if let PathArguments::AngleBracketed(args) = &mut segment.arguments {
                    for arg in &mut args.args {
                        if let GenericArgument::Type(ty) = arg {
                            infer_in(ty);
                        }
                    }
                }
            }
        }
        Type::Tuple(tuple) => tuple.elems.iter_mut().for_each(infer_in),
        Type::Array(array) => infer_in(&mut array.elem),
        Type::Slice(slice) => infer_in(&mut slice.elem),
        Type::Reference(reference) => infer_in(&mut reference.elem),
        Type::Paren(paren) => infer_in(&mut paren.elem),
        Type::Group(group) => infer_in(&mut group.elem),
        _ => {}
    }
}

fn contradictions(options: &Options) -> Vec<syn::Error> {
    let mut errors = Vec::new();
    if options.spin.as_ref().is_some_and(|spin| !spin.value) {
        let never_applies = |name: &str| {
            format!(
                "`{name}` never applies with `spin = false`, which fails at once when the \
                 lock is busy; drop `{name}` or let the lock spin"
            )
        };
        let waiting = [
            options
                .retries
                .as_ref()
                .map(|retries| retries.error(never_applies("retries"))),
            options
                .wait_ms
                .as_ref()
                .map(|wait| wait.error(never_applies("wait_ms"))),
            options
                .timeout_ms
                .as_ref()
                .map(|timeout| timeout.error(never_applies("timeout_ms"))),
        ];
        errors.extend(waiting.into_iter().flatten());
    }
    if let Some(max_hold) = &options.max_hold_ms {
        let watchdog = options.watchdog.as_ref().map(|watchdog| watchdog.value);
        if watchdog == Some(false) {
            errors.push(max_hold.error(
                "`max_hold_ms` caps the watchdog, which `watchdog = false` turns off; \
                 drop one of them",
            ));
        } else if watchdog.is_none() && options.expire_ms.is_some() {
            errors.push(max_hold.error(
                "`max_hold_ms` caps the watchdog, which is off with a fixed `expire_ms`; \
                 add `watchdog = true` or drop `max_hold_ms`",
            ));
        }
    }
    if let (Some(window), Some(lease)) = (&options.hold_at_least_ms, &options.expire_ms) {
        let watchdog = options
            .watchdog
            .as_ref()
            .is_some_and(|watchdog| watchdog.value);
        if !watchdog && window.value > lease.value {
            errors.push(window.error(
                "`hold_at_least_ms` is longer than the fixed `expire_ms`, which would free \
                 the lock first; lengthen `expire_ms`, add `watchdog = true`, or shorten the window",
            ));
        }
    }
    errors.extend(family(options));
    errors
}

/// Semaphores, read locks and several keys at once: what each of them cannot be
/// combined with.
fn family(options: &Options) -> Vec<syn::Error> {
    let mut errors = Vec::new();
    let shared = on(&options.shared);
    // `permits = 1` is a plain lock, which does have a shared side.
    let semaphore = options.permits.as_ref().filter(|permits| permits.value > 1);
    if let (Some(permits), Some(shared)) = (semaphore, shared) {
        let permits = permits.value;
        errors.push(shared.error(format!(
            "`shared = true` asks for a read lock, but `permits = {permits}` makes a semaphore, \
             which has no shared side; drop `shared` to let up to {permits} callers hold the \
             lock at once, or drop `permits` for a read lock"
        )));
    }
    if let Some(fencing) = on(&options.fencing) {
        if let Some(permits) = semaphore {
            let permits = permits.value;
            errors.push(fencing.error(format!(
                "`fencing = true` issues increasing tokens, one holder after another, but \
                 `permits = {permits}` lets {permits} callers hold the lock at once; drop \
                 `fencing`, or drop `permits` for a plain lock with fencing tokens"
            )));
        }
        if shared.is_some() {
            errors.push(fencing.error(
                "`fencing = true` issues increasing tokens, one holder after another, but \
                 `shared = true` lets many readers hold the lock at once; drop `fencing`, or \
                 drop `shared` for an exclusive lock with fencing tokens",
            ));
        }
    }
    if let Some(multi) = on(&options.multi)
        && options.keys.is_none()
    {
        errors.push(multi.error(
            "`multi = true` takes one lock per key expression, and there are no `keys`; \
             list them, like `keys(from.id, to.id)`, or drop `multi`",
        ));
    }
    errors
}

/// A `name = true` option as written; `None` when absent or `false`.
fn on(setting: &Option<Setting<bool>>) -> Option<&Setting<bool>> {
    setting.as_ref().filter(|setting| setting.value)
}

/// A key must be built from the parameters: every name it starts a value from must
/// be a parameter or an UPPER_CASE constant, and at least one must be a parameter.
fn names_parameters(key: &Expr, params: &[Ident]) -> syn::Result<()> {
    let listed = if params.is_empty() {
        "the fn has none; drop `keys` to take one lock per prefix".to_owned()
    } else {
        let names: Vec<String> = params.iter().map(|param| format!("`{param}`")).collect();
        format!("the parameters are: {}", names.join(", "))
    };
    let mut roots = Vec::new();
    value_roots(key, &mut roots);
    let stranger = roots
        .iter()
        .find(|root| !params.contains(*root) && !is_constant(root));
    // A key written in a string is spanned at the string.
    if let Some(stranger) = stranger {
        return Err(syn::Error::new(
            stranger.span(),
            format!("`{stranger}` in this key is not a parameter; {listed}"),
        ));
    }
    if !roots.iter().any(|root| params.contains(root)) {
        return Err(syn::Error::new_spanned(
            key,
            format!("this key names no parameter; {listed}"),
        ));
    }
    Ok(())
}

/// Collects the names that values in `expr` start from: `req` in `req.items[i].id()`.
/// Paths to items (`Shard::MAIN`, `hash(..)`'s `hash`) are not values of the fn.
/// Closures, blocks and other forms that bind names of their own are not looked into.
fn value_roots(expr: &Expr, roots: &mut Vec<Ident>) {
    let mut walk = |expr: &Expr| value_roots(expr, roots);
    match expr {
        Expr::Path(path) if path.qself.is_none() => {
            if let Some(ident) = path.path.get_ident() {
                roots.push(ident.clone());
            }
        }
        Expr::Field(field) => walk(&field.base),
        Expr::MethodCall(call) => {
            walk(&call.receiver);
            call.args.iter().for_each(walk);
        }
        Expr::Call(call) => {
            if !matches!(&*call.func, Expr::Path(_)) {
                walk(&call.func);
            }
            call.args.iter().for_each(walk);
        }
        Expr::Index(index) => {
            walk(&index.expr);
            walk(&index.index);
        }
        Expr::Binary(binary) => {
            walk(&binary.left);
            walk(&binary.right);
        }
        Expr::Unary(unary) => walk(&unary.expr),
        Expr::Reference(reference) => walk(&reference.expr),
        Expr::Cast(cast) => walk(&cast.expr),
        Expr::Paren(paren) => walk(&paren.expr),
        Expr::Group(group) => walk(&group.expr),
        Expr::Try(tried) => walk(&tried.expr),
        Expr::Tuple(tuple) => tuple.elems.iter().for_each(walk),
        Expr::Array(array) => array.elems.iter().for_each(walk),
        Expr::Macro(mac) => {
            // `format!("{}-{}", a.id, b.id)` and the like: comma-separated arguments.
            if let Ok(args) = mac
                .mac
                .parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated)
            {
                args.iter().for_each(walk);
            }
        }
        _ => {}
    }
}

fn is_constant(ident: &Ident) -> bool {
    let name = ident.to_string();
    name.chars().any(|c| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}
