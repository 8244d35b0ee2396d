//! Checks of the options against each other and against the fn.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::visit::Visit;
use syn::{
    Attribute, Expr, ExprLit, GenericArgument, Ident, Lit, LitStr, Meta, Pat, PathArguments,
    ReturnType, Stmt, Token, Type, TypeParamBound,
};

use crate::attr::{Given, Options, Setting, WATCHDOG_LEASE_MS, is_item_like};
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
    if function.in_impl && options.prefix.is_none() {
        let name = &function.sig().ident;
        errors.push(syn::Error::new_spanned(
            name,
            format!(
                "`#[distributed_lock]` on a method needs `prefix`: the default, \
                 `<module>::{name}`, names no type, so methods `{name}` of two types in this \
                 module would share one lock; name it, like `prefix = \"orders::{name}\"`"
            ),
        ));
    }
    if options.prefix.is_none()
        && let Some(below) = function
            .attrs()
            .iter()
            .find(|attr| takes_the_default_too(attr))
    {
        errors.push(syn::Error::new_spanned(
            below,
            "this `#[distributed_lock]` and the one above it would both take the fn's default \
             prefix, which the runtime gives to one of them only, so every call would fail \
             with `InvalidOptions`: give one of them a `prefix`",
        ));
    }
    for key in options.keys.iter().flat_map(|keys| &keys.value) {
        if let Err(error) = uses_a_parameter(&key.code, params, options, function) {
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

/// Whether `attr` is another `#[distributed_lock]`, one with no `prefix`.
fn takes_the_default_too(attr: &Attribute) -> bool {
    let named =
        (attr.path().segments.last()).is_some_and(|segment| segment.ident == "distributed_lock");
    named
        && match &attr.meta {
            Meta::Path(_) => true,
            Meta::List(list) => {
                (list.parse_args::<Options>()).is_ok_and(|options| options.prefix.is_none())
            }
            Meta::NameValue(_) => false,
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
            // `#[async_trait]` wrote that return type, for a method that returns `()`.
            _ if function.async_trait => syn::Error::new_spanned(&sig.ident, EXPECTED),
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

/// Options that contradict each other as written. A value named by a constant is the
/// runtime's to check, on every call.
fn contradictions(options: &Options) -> Vec<syn::Error> {
    let mut errors = Vec::new();
    if options
        .spin
        .as_ref()
        .is_some_and(|spin| spin.value.written() == Some(&false))
    {
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
        match options.watchdog.as_ref().map(|watchdog| &watchdog.value) {
            Some(Given::Written(false)) => errors.push(max_hold.error(
                "`max_hold_ms` caps the watchdog, which `watchdog = false` turns off; \
                 drop one of them",
            )),
            None if options.expire_ms.is_some() => errors.push(max_hold.error(
                "`max_hold_ms` caps the watchdog, which is off with a fixed `expire_ms`; \
                 add `watchdog = true` or drop `max_hold_ms`",
            )),
            _ => {}
        }
    }
    if let Some(window) = &options.hold_at_least_ms
        && let Some(&window_ms) = window.value.written()
    {
        // As the runtime settles them: without `expire_ms`, a 30 s lease that the
        // watchdog renews unless `watchdog = false`.
        let lease = options.expire_ms.as_ref().map(|lease| &lease.value);
        let lease_ms = match lease {
            Some(lease) => lease.written().copied(),
            None => Some(WATCHDOG_LEASE_MS),
        };
        let watchdog = match &options.watchdog {
            Some(watchdog) => watchdog.value.written().copied(),
            None => Some(lease.is_none()),
        };
        if watchdog == Some(false) && lease_ms.is_some_and(|lease_ms| window_ms > lease_ms) {
            errors.push(window.error(match lease {
                Some(_) => {
                    "`hold_at_least_ms` is longer than the fixed lease of `expire_ms`, which would \
                     free the lock first; lengthen `expire_ms`, add `watchdog = true`, or shorten \
                     the window"
                }
                None => {
                    "`hold_at_least_ms` is longer than the lease, 30 s without `expire_ms`, which \
                     `watchdog = false` leaves unrenewed, so it would free the lock first; set a \
                     longer `expire_ms`, drop `watchdog = false`, or shorten the window"
                }
            }));
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
    let semaphore = options
        .permits
        .as_ref()
        .and_then(|permits| permits.value.written())
        .filter(|&&permits| permits > 1);
    if let (Some(permits), Some(shared)) = (semaphore, shared) {
        errors.push(shared.error(format!(
            "`shared = true` asks for a read lock, but `permits = {permits}` makes a semaphore, \
             which has no shared side; drop `shared` to let up to {permits} callers hold the \
             lock at once, or drop `permits` for a read lock"
        )));
    }
    if let Some(fencing) = on(&options.fencing) {
        if let Some(permits) = semaphore {
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
    if let Some(multi) = options.multi.as_ref().filter(|multi| multi.value)
        && options.keys.is_none()
    {
        errors.push(multi.error(
            "`multi = true` takes one lock per key expression, and there are no `keys`; \
             list them, like `keys(from.id, to.id)`, or drop `multi`",
        ));
    }
    errors
}

/// A `name = true` option as written; `None` when absent, `false`, or named.
fn on(setting: &Option<Setting<Given<bool>>>) -> Option<&Setting<Given<bool>>> {
    setting
        .as_ref()
        .filter(|setting| setting.value.written() == Some(&true))
}

/// A key must use a parameter: one that uses none would be the same on every call.
/// Whether the names it uses exist is the compiler's to judge, where they are.
fn uses_a_parameter(
    key: &Expr,
    params: &[Ident],
    options: &Options,
    function: &Function,
) -> syn::Result<()> {
    let mut names = ValueNames::default();
    names.visit_expr(key);
    if names.found.iter().any(|name| params.contains(name)) {
        return Ok(());
    }
    let listed = if params.is_empty() {
        "the fn has none".to_owned()
    } else {
        let names: Vec<String> = params.iter().map(|param| format!("`{param}`")).collect();
        format!("the parameters are: {}", names.join(", "))
    };
    // A lowercase name is a value of the fn's, most likely one misspelt.
    let stranger = names.found.iter().find(|name| !is_item_like(name));
    if let Some(stranger) = stranger {
        // A key written in a string is spanned at the string.
        return Err(syn::Error::new(
            stranger.span(),
            format!("`{stranger}` in this key is not a parameter; {listed}"),
        ));
    }
    let prefix = match options.prefix.as_ref().map(|prefix| &prefix.value) {
        Some(Given::Written(prefix)) => Some(prefix.value()),
        Some(Given::Named(_)) => None,
        None => Some(function.sig().ident.unraw().to_string()),
    };
    let example = fixed_text(key)
        .zip(prefix)
        .map_or_else(String::new, |(fixed, prefix)| {
            format!(", like `prefix = \"{prefix}:{fixed}\"`")
        });
    Err(syn::Error::new_spanned(
        key,
        format!(
            "this key uses no parameter ({listed}), so it is the same on every call; move it \
             into `prefix`{example}"
        ),
    ))
}

/// The text a key made of one literal stands for in a prefix: `v2` for `"v2"`.
fn fixed_text(key: &Expr) -> Option<String> {
    match key {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit.value()),
        Expr::Lit(ExprLit { lit, .. }) => Some(lit.to_token_stream().to_string()),
        Expr::Group(group) => fixed_text(&group.expr),
        Expr::Paren(paren) => fixed_text(&paren.expr),
        _ => None,
    }
}

/// The names whose values an expression reads: `req` and `user` in
/// `db.tenant_of(&req, user).await`, the names captured by a format string, and
/// those in closures, blocks and match arms, less the names those bind themselves.
/// Paths to items (`Shard::MAIN`, `hash(..)`'s `hash`) are not values.
#[derive(Default)]
struct ValueNames {
    /// The names bound inside the expression where the walk is.
    bound: Vec<Ident>,
    found: Vec<Ident>,
}

impl ValueNames {
    fn value(&mut self, ident: &Ident) {
        if !self.bound.contains(ident) {
            self.found.push(ident.clone());
        }
    }

    fn bind(&mut self, pat: &Pat) {
        crate::item::bindings(pat, &mut self.bound);
    }

    /// Runs `walk` with the names bound until then, and forgets those it binds.
    fn scoped(&mut self, walk: impl FnOnce(&mut Self)) {
        let outer = self.bound.len();
        walk(self);
        self.bound.truncate(outer);
    }

    /// `{name}` and `{name:?}` in a format string.
    fn captured(&mut self, lit: &LitStr) {
        let text = lit.value();
        let mut rest = text.as_str();
        while let Some(open) = rest.find('{') {
            rest = &rest[open + 1..];
            if let Some(escaped) = rest.strip_prefix('{') {
                rest = escaped;
                continue;
            }
            let end = rest.find(['}', ':']).unwrap_or(rest.len());
            if let Ok(ident) = syn::parse_str::<Ident>(rest[..end].trim()) {
                self.value(&Ident::new(&ident.to_string(), lit.span()));
            }
        }
    }
}

impl<'ast> Visit<'ast> for ValueNames {
    fn visit_expr_path(&mut self, path: &'ast syn::ExprPath) {
        if path.qself.is_none()
            && let Some(ident) = path.path.get_ident()
        {
            self.value(ident);
        }
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if !matches!(&*call.func, Expr::Path(_)) {
            self.visit_expr(&call.func);
        }
        call.args.iter().for_each(|arg| self.visit_expr(arg));
    }

    fn visit_expr_closure(&mut self, closure: &'ast syn::ExprClosure) {
        self.scoped(|names| {
            closure.inputs.iter().for_each(|input| names.bind(input));
            names.visit_expr(&closure.body);
        });
    }

    fn visit_block(&mut self, block: &'ast syn::Block) {
        self.scoped(|names| {
            for stmt in &block.stmts {
                match stmt {
                    Stmt::Local(local) => {
                        if let Some(init) = &local.init {
                            names.visit_local_init(init);
                        }
                        names.bind(&local.pat);
                    }
                    Stmt::Item(_) => {}
                    stmt => names.visit_stmt(stmt),
                }
            }
        });
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.scoped(|names| {
            names.bind(&arm.pat);
            if let Some((_, guard)) = &arm.guard {
                names.visit_expr(guard);
            }
            names.visit_expr(&arm.body);
        });
    }

    fn visit_expr_let(&mut self, condition: &'ast syn::ExprLet) {
        // The names stay bound in the branch the condition guards.
        self.visit_expr(&condition.expr);
        self.bind(&condition.pat);
    }

    fn visit_expr_if(&mut self, branch: &'ast syn::ExprIf) {
        self.scoped(|names| {
            names.visit_expr(&branch.cond);
            names.visit_block(&branch.then_branch);
        });
        if let Some((_, otherwise)) = &branch.else_branch {
            self.visit_expr(otherwise);
        }
    }

    fn visit_expr_while(&mut self, looped: &'ast syn::ExprWhile) {
        self.scoped(|names| {
            names.visit_expr(&looped.cond);
            names.visit_block(&looped.body);
        });
    }

    fn visit_expr_for_loop(&mut self, looped: &'ast syn::ExprForLoop) {
        self.visit_expr(&looped.expr);
        self.scoped(|names| {
            names.bind(&looped.pat);
            names.visit_block(&looped.body);
        });
    }

    fn visit_item(&mut self, _: &'ast syn::Item) {}

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // `format!("{}-{id}", a.id, x = b.id)` and the like: arguments, and names
        // captured by the format string.
        match mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
            Ok(args) => {
                for arg in &args {
                    match arg {
                        Expr::Lit(ExprLit {
                            lit: Lit::Str(lit), ..
                        }) => self.captured(lit),
                        Expr::Assign(named) => self.visit_expr(&named.right),
                        arg => self.visit_expr(arg),
                    }
                }
            }
            // Any name it holds may be a value: let the compiler judge.
            Err(_) => idents(mac.tokens.clone(), &mut self.found),
        }
    }
}

fn idents(tokens: proc_macro2::TokenStream, found: &mut Vec<Ident>) {
    for token in tokens {
        match token {
            proc_macro2::TokenTree::Ident(ident) => found.push(ident),
            proc_macro2::TokenTree::Group(group) => idents(group.stream(), found),
            _ => {}
        }
    }
}
