//! The fn under the attribute: an `async fn`, or what `#[async_trait]` makes of one.
//!
//! `#[async_trait]` sits on the impl, so it expands before the attribute on a method
//! and hands it `fn m(..) -> Pin<Box<dyn Future<Output = R> + Send + 'async_trait>>`
//! with the body in
//!
//! ```text
//! Box::pin(async move {
//!     if let Some(__ret) = None::<R> { return __ret; }
//!     <rebinding>
//!     let __ret: R = { <body> };
//!     __ret
//! })
//! ```
//!
//! (for `R = ()`, `<rebinding> let _: () = { <body> };`). The rebinding moves `self`
//! to `__self` and each parameter to its pattern; the lock goes around `<body>`,
//! where those names are bound. `#[tracing::instrument]` above the attribute has
//! already wrapped that block in its span. Only that exact shape is taken: anything
//! else could run part of a body outside the lock, so it is refused.

use std::mem;

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::{
    Block, Expr, FnArg, GenericArgument, Ident, ItemFn, Local, LocalInit, Pat, PathArguments,
    ReturnType, Stmt, Type, TypeParamBound,
};

pub(crate) struct Function {
    /// The fn with its body taken out; see [`Function::into_item`].
    item: ItemFn,
    pub(crate) body: Block,
    pub(crate) async_trait: bool,
    /// A method or an associated fn, as far as the fn itself shows: it takes
    /// `self`, names `Self` in its signature, or is `#[async_trait]`'s.
    pub(crate) in_impl: bool,
    /// The names the parameters bind where the body runs, `self` first for a method.
    pub(crate) params: Vec<Ident>,
    /// What the fn's future yields; `None` for `()`.
    pub(crate) output: Option<Type>,
}

impl Function {
    pub(crate) fn parse(mut item: ItemFn) -> syn::Result<Function> {
        let in_impl = takes_self(&item.sig) || mentions_self_type(&item.sig);
        if item.sig.asyncness.is_some() {
            let body = mem::replace(&mut *item.block, empty_block());
            let output = match &item.sig.output {
                ReturnType::Type(_, ty) if !is_unit(ty) => Some((**ty).clone()),
                _ => None,
            };
            let params = parameters(&item.sig.inputs, None);
            return Ok(Function {
                item,
                body,
                async_trait: false,
                in_impl,
                params,
                output,
            });
        }
        let Some(output) = async_trait_output(&item.sig.output) else {
            let message = match calls_block_on(item.block.to_token_stream()) {
                false => "`#[distributed_lock]` requires an `async fn`",
                true => {
                    "`#[distributed_lock]` requires an `async fn`; this fn's body calls \
                     `block_on`, as `#[tokio::main]` and `#[tokio::test]` write it (an \
                     attribute above `#[distributed_lock]` may have rewritten the fn: put \
                     `#[distributed_lock]` above that attribute)"
                }
            };
            return Err(syn::Error::new_spanned(item.sig.fn_token, message));
        };
        let output = Some(output).filter(|ty| !is_unit(ty));
        let Some((rebinding, body)) = async_trait_body(&mut item.block) else {
            return Err(syn::Error::new_spanned(
                item.sig.fn_token,
                "`#[distributed_lock]` requires an `async fn`; this fn's signature is \
                 `#[async_trait]`'s, but its body is not as `#[async_trait]` writes it (an \
                 attribute above `#[distributed_lock]` may have rewritten it: put \
                 `#[distributed_lock]` above that attribute)",
            ));
        };
        let params = parameters(&item.sig.inputs, Some(rebinding));
        let body = mem::replace(body, empty_block());
        Ok(Function {
            item,
            body,
            async_trait: true,
            in_impl: true,
            params,
            output,
        })
    }

    pub(crate) fn sig(&self) -> &syn::Signature {
        &self.item.sig
    }

    /// The attributes left on the fn: those below `#[distributed_lock]`.
    pub(crate) fn attrs(&self) -> &[syn::Attribute] {
        &self.item.attrs
    }

    /// The fn with `locked` where its body was.
    pub(crate) fn into_item(mut self, locked: TokenStream) -> ItemFn {
        let locked = Block {
            brace_token: self.body.brace_token,
            stmts: vec![Stmt::Expr(Expr::Verbatim(locked), None)],
        };
        if self.async_trait {
            // Found by `parse`, which took the body out and left the shape as it was.
            if let Some((_, body)) = async_trait_body(&mut self.item.block) {
                *body = locked;
            }
        } else {
            *self.item.block = locked;
        }
        self.item
    }
}

fn empty_block() -> Block {
    Block {
        brace_token: Default::default(),
        stmts: Vec::new(),
    }
}

fn is_unit(ty: &Type) -> bool {
    matches!(ty, Type::Tuple(tuple) if tuple.elems.is_empty())
}

fn takes_self(sig: &syn::Signature) -> bool {
    matches!(sig.inputs.first(), Some(FnArg::Receiver(_)))
}

/// `Self` anywhere in the signature: the fn is inside an impl or a trait.
fn mentions_self_type(sig: &syn::Signature) -> bool {
    fn mentions(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == "Self",
            TokenTree::Group(group) => mentions(group.stream()),
            _ => false,
        })
    }
    mentions(sig.to_token_stream())
}

/// `R` in `Pin<Box<dyn Future<Output = R> + .. + 'async_trait>>`: the lifetime is
/// `#[async_trait]`'s mark.
fn async_trait_output(output: &ReturnType) -> Option<Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let pinned = only_type_argument(ty, "Pin")?;
    let Type::TraitObject(future) = only_type_argument(pinned, "Box")? else {
        return None;
    };
    let marked = future.bounds.iter().any(|bound| {
        matches!(bound, TypeParamBound::Lifetime(lifetime) if lifetime.ident == "async_trait")
    });
    if !marked {
        return None;
    }
    future.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let last = bound.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        if last.ident != "Future" {
            return None;
        }
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(assoc.ty.clone()),
            _ => None,
        })
    })
}

/// `T` in `name<T>`, whatever the path before `name`.
fn only_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>()[..] {
        [GenericArgument::Type(ty)] if last.ident == name => Some(ty),
        _ => None,
    }
}

/// In `#[async_trait]`'s `{ Box::pin(async move { .. }) }`, directly or inside
/// `#[tracing::instrument]`'s span: the statements that rebind the parameters, and
/// the block of the body.
fn async_trait_body(block: &mut Block) -> Option<(&[Stmt], &mut Block)> {
    let [Stmt::Expr(Expr::Call(call), None)] = &mut block.stmts[..] else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let names: Vec<String> = func
        .path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    if !names.ends_with(&["Box".to_owned(), "pin".to_owned()]) || call.args.len() != 1 {
        return None;
    }
    let Some(Expr::Async(future)) = call.args.first_mut() else {
        return None;
    };
    // `async move`, not `async`.
    future.capture?;
    if is_async_trait_block(&future.block) {
        return split_async_trait_block(&mut future.block);
    }
    instrumented(&mut future.block)
}

/// `#[tracing::instrument]`'s block for an `#[async_trait]` method: it makes its
/// span, then `let __tracing_instrument_future = <future>;` and awaits that in the
/// span. The future is `#[async_trait]`'s `async move` block, or awaits it inside
/// another one (with `err` or `ret`).
fn instrumented(block: &mut Block) -> Option<(&[Stmt], &mut Block)> {
    let future = block.stmts.iter_mut().find_map(|stmt| match stmt {
        Stmt::Local(Local {
            pat: Pat::Ident(pat),
            init:
                Some(LocalInit {
                    expr,
                    diverge: None,
                    ..
                }),
            ..
        }) if pat.ident == "__tracing_instrument_future" => Some(&mut **expr),
        _ => None,
    })?;
    in_future(future)
}

fn in_future(expr: &mut Expr) -> Option<(&[Stmt], &mut Block)> {
    match expr {
        Expr::Async(future) if future.capture.is_some() => {
            if is_async_trait_block(&future.block) {
                return split_async_trait_block(&mut future.block);
            }
            future.block.stmts.iter_mut().find_map(|stmt| match stmt {
                Stmt::Local(Local {
                    init: Some(LocalInit { expr, .. }),
                    ..
                }) => in_future(expr),
                Stmt::Expr(expr, _) => in_future(expr),
                _ => None,
            })
        }
        Expr::Await(awaited) => in_future(&mut awaited.base),
        Expr::Match(matched) => in_future(&mut matched.expr),
        _ => None,
    }
}

/// Exactly `#[async_trait]`'s statements, none of which runs code but the body's
/// block: for a return type `R`, its `if let Some(__ret) = None::<R> { return
/// __ret; }`, the rebinding, `let __ret: R = <body>;` and `__ret`; for `()`, the
/// rebinding and `let _: () = <body>;`.
fn is_async_trait_block(block: &Block) -> bool {
    match &block.stmts[..] {
        [
            hint,
            rebinding @ ..,
            Stmt::Local(body),
            Stmt::Expr(ret, None),
        ] if is_return_type_hint(hint) && is_ident(ret, "__ret") => {
            rebinding.iter().all(is_rebinding) && is_valued_body(body)
        }
        [rebinding @ .., Stmt::Local(body)] => {
            rebinding.iter().all(is_rebinding) && is_unit_body(body)
        }
        _ => false,
    }
}

fn split_async_trait_block(block: &mut Block) -> Option<(&[Stmt], &mut Block)> {
    let stmts = &mut block.stmts[..];
    let at = stmts
        .iter()
        .rposition(|stmt| matches!(stmt, Stmt::Local(_)))?;
    let (before, rest) = stmts.split_at_mut(at);
    let before: &[Stmt] = before;
    let hinted = before.first().is_some_and(is_return_type_hint);
    let rebinding = &before[usize::from(hinted)..];
    let Stmt::Local(Local {
        init: Some(init), ..
    }) = &mut rest[0]
    else {
        return None;
    };
    let Expr::Block(body) = &mut *init.expr else {
        return None;
    };
    Some((rebinding, &mut body.block))
}

/// `if let ::core::option::Option::Some(__ret) = ::core::option::Option::None::<R> {
/// return __ret; }`
fn is_return_type_hint(stmt: &Stmt) -> bool {
    let Stmt::Expr(Expr::If(hint), None) = stmt else {
        return false;
    };
    let Expr::Let(condition) = &*hint.cond else {
        return false;
    };
    let Pat::TupleStruct(some) = &*condition.pat else {
        return false;
    };
    let binds_ret = matches!(&some.elems.iter().collect::<Vec<_>>()[..],
        [Pat::Ident(ret)] if ret.ident == "__ret" && ret.subpat.is_none());
    let none = matches!(&*condition.expr, Expr::Path(none)
        if none.path.segments.last().is_some_and(|last| last.ident == "None"));
    let returns_ret = matches!(&hint.then_branch.stmts[..],
        [Stmt::Expr(Expr::Return(ret), _)] if ret.expr.as_deref().is_some_and(|ret| is_ident(ret, "__ret")));
    some.path
        .segments
        .last()
        .is_some_and(|last| last.ident == "Some")
        && binds_ret
        && none
        && returns_ret
        && hint.else_branch.is_none()
}

/// `let <pattern> = <name>;` or `let <pattern> = { let __argN = __argN; __argN };`:
/// moves a parameter, and runs nothing.
fn is_rebinding(stmt: &Stmt) -> bool {
    let Stmt::Local(Local {
        init:
            Some(LocalInit {
                expr,
                diverge: None,
                ..
            }),
        ..
    }) = stmt
    else {
        return false;
    };
    match &**expr {
        Expr::Path(_) => is_plain_name(expr),
        Expr::Block(block) if block.label.is_none() => match &block.block.stmts[..] {
            [inner @ .., Stmt::Expr(last, None)] => {
                inner.iter().all(is_rebinding) && is_plain_name(last)
            }
            _ => false,
        },
        _ => false,
    }
}

fn is_plain_name(expr: &Expr) -> bool {
    matches!(expr, Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some())
}

fn is_ident(expr: &Expr, name: &str) -> bool {
    matches!(expr, Expr::Path(path) if path.qself.is_none() && path.path.is_ident(name))
}

/// `let __ret: R = { .. };`
fn is_valued_body(local: &Local) -> bool {
    let Pat::Type(typed) = &local.pat else {
        return false;
    };
    matches!(&*typed.pat, Pat::Ident(ret) if ret.ident == "__ret" && ret.subpat.is_none())
        && is_block_init(local)
}

/// Whether `tokens` name `block_on` anywhere, as a runtime's entry point does.
fn calls_block_on(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "block_on",
        TokenTree::Group(group) => calls_block_on(group.stream()),
        _ => false,
    })
}

/// `let _: () = { .. };`, or `let () = { .. };` as some versions write it.
fn is_unit_body(local: &Local) -> bool {
    let unit_pattern = match &local.pat {
        Pat::Type(typed) => matches!(&*typed.pat, Pat::Wild(_)) && is_unit(&typed.ty),
        Pat::Tuple(tuple) => tuple.elems.is_empty(),
        _ => false,
    };
    unit_pattern && is_block_init(local)
}

fn is_block_init(local: &Local) -> bool {
    matches!(&local.init, Some(LocalInit { expr, diverge: None, .. })
        if matches!(&**expr, Expr::Block(block) if block.label.is_none() && block.attrs.is_empty()))
}

/// The names the parameters bind, with those `#[async_trait]`'s `rebinding` binds
/// (`self` is then `__self`, but a key names it `self`).
fn parameters<'a>(
    inputs: impl IntoIterator<Item = &'a FnArg>,
    rebinding: Option<&[Stmt]>,
) -> Vec<Ident> {
    let mut names = Vec::new();
    for input in inputs {
        match input {
            FnArg::Receiver(receiver) => {
                names.push(Ident::new("self", receiver.self_token.span));
            }
            FnArg::Typed(typed) => bindings(&typed.pat, &mut names),
        }
    }
    let Some(rebinding) = rebinding else {
        return names;
    };
    for stmt in rebinding {
        if let Stmt::Local(local) = stmt {
            bindings(&local.pat, &mut names);
        }
    }
    let mut seen = Vec::new();
    names.retain(|name| {
        let fresh = !is_async_trait_own(name) && !seen.contains(name);
        seen.push(name.clone());
        fresh
    });
    names
}

/// `__self` and `__arg0`, `__arg1`..: `#[async_trait]`'s names, not the user's.
fn is_async_trait_own(name: &Ident) -> bool {
    let name = name.to_string();
    let argument = name.strip_prefix("__arg").is_some_and(|number| {
        !number.is_empty() && number.bytes().all(|digit| digit.is_ascii_digit())
    });
    name == "__self" || argument
}

pub(crate) fn bindings(pat: &Pat, names: &mut Vec<Ident>) {
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
