//! Checks of the options against each other and against the fn's signature.

use syn::punctuated::Punctuated;
use syn::{Expr, FnArg, Ident, Pat, ReturnType, Signature, Token, Type};

use crate::attr::{Embedded, Options};

/// Every error found, so that one build reports them all.
pub(crate) fn check(options: &Options, sig: &Signature) -> syn::Result<()> {
    let mut errors = Vec::new();
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            "`#[distributed_lock]` requires an `async fn`",
        ));
    }
    if let Err(error) = returns_result(sig) {
        errors.push(error);
    }
    errors.extend(contradictions(options));
    let params = parameters(sig);
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
        if let Err(error) = names_parameters(key, &params) {
            errors.push(error);
        }
    }
    let mut errors = errors.into_iter();
    match errors.next() {
        None => Ok(()),
        Some(mut first) => {
            first.extend(errors);
            Err(first)
        }
    }
}

fn returns_result(sig: &Signature) -> syn::Result<()> {
    const EXPECTED: &str = "`#[distributed_lock]` requires the fn to return `Result<T, E>` \
        with `E: From<LockError>`, to report a lock it could not take";
    let ty = match &sig.output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => return Err(syn::Error::new_spanned(sig, EXPECTED)),
    };
    let mut inner = &**ty;
    while let Type::Group(group) = inner {
        inner = &group.elem;
    }
    match inner {
        // Aliases count by name: `anyhow::Result<T>`, `io::Result<T>`, `AppResult<T>`.
        Type::Path(path)
            if path
                .path
                .segments
                .last()
                .is_some_and(|last| last.ident.to_string().ends_with("Result")) =>
        {
            Ok(())
        }
        _ => Err(syn::Error::new_spanned(ty, EXPECTED)),
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
    errors
}

/// The names the parameters bind, `self` first for a method.
fn parameters(sig: &Signature) -> Vec<Ident> {
    let mut names = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => {
                names.push(Ident::new("self", receiver.self_token.span));
            }
            FnArg::Typed(typed) => bindings(&typed.pat, &mut names),
        }
    }
    names
}

fn bindings(pat: &Pat, names: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(pat) => {
            names.push(pat.ident.clone());
            if let Some((_, sub)) = &pat.subpat {
                bindings(sub, names);
            }
        }
        Pat::Tuple(pat) => pat.elems.iter().for_each(|pat| bindings(pat, names)),
        Pat::TupleStruct(pat) => pat.elems.iter().for_each(|pat| bindings(pat, names)),
        Pat::Struct(pat) => pat
            .fields
            .iter()
            .for_each(|field| bindings(&field.pat, names)),
        Pat::Slice(pat) => pat.elems.iter().for_each(|pat| bindings(pat, names)),
        // Every case of an or-pattern binds the same names.
        Pat::Or(pat) => pat
            .cases
            .iter()
            .take(1)
            .for_each(|pat| bindings(pat, names)),
        Pat::Reference(pat) => bindings(&pat.pat, names),
        Pat::Paren(pat) => bindings(&pat.pat, names),
        Pat::Type(pat) => bindings(&pat.pat, names),
        _ => {}
    }
}

/// A key must be built from the parameters: every name it starts a value from must
/// be a parameter or an UPPER_CASE constant, and at least one must be a parameter.
fn names_parameters(key: &Embedded<Expr>, params: &[Ident]) -> syn::Result<()> {
    let listed = if params.is_empty() {
        "the fn has none; drop `keys` to take one lock per prefix".to_owned()
    } else {
        let names: Vec<String> = params.iter().map(|param| format!("`{param}`")).collect();
        format!("the parameters are: {}", names.join(", "))
    };
    let mut roots = Vec::new();
    value_roots(&key.code, &mut roots);
    let stranger = roots
        .iter()
        .find(|root| !params.contains(*root) && !is_constant(root));
    if let Some(stranger) = stranger {
        return Err(syn::Error::new(
            key.lit.span(),
            format!(
                "key `{}`: `{stranger}` is not a parameter; {listed}",
                key.lit.value()
            ),
        ));
    }
    if !roots.iter().any(|root| params.contains(root)) {
        return Err(syn::Error::new(
            key.lit.span(),
            format!("key `{}` names no parameter; {listed}", key.lit.value()),
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
