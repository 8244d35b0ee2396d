//! The fn under the attribute: an `async fn`, or what `#[async_trait]` makes of one.
//!
//! `#[async_trait]` sits on the impl, so it expands before the attribute on a method
//! and hands it `fn m(..) -> Pin<Box<dyn Future<Output = R> + ..>>` with the body in
//! `Box::pin(async move { <rebinding>; let __ret: R = { <body> }; __ret })`. The
//! rebinding moves `self` to `__self` and each pattern parameter from `__argN` to its
//! pattern; the lock goes around `<body>`, where those names are bound.

use std::mem;

use proc_macro2::TokenStream;
use syn::{
    Block, Expr, FnArg, GenericArgument, Ident, ItemFn, Local, LocalInit, Pat, PathArguments,
    ReturnType, Stmt, Type, TypeParamBound,
};

pub(crate) struct Function {
    /// The fn with its body taken out; see [`Function::into_item`].
    item: ItemFn,
    pub(crate) body: Block,
    pub(crate) async_trait: bool,
    /// The names the parameters bind where the body runs, `self` first for a method.
    pub(crate) params: Vec<Ident>,
    /// What the fn's future yields; `None` for `()`.
    pub(crate) output: Option<Type>,
}

impl Function {
    pub(crate) fn parse(mut item: ItemFn) -> syn::Result<Function> {
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
                params,
                output,
            });
        }
        let output = future_output(&item.sig.output).filter(|ty| !is_unit(ty));
        if let Some((rebinding, body)) = async_trait_body(&mut item.block) {
            let params = parameters(&item.sig.inputs, Some(rebinding));
            let body = mem::replace(body, empty_block());
            return Ok(Function {
                item,
                body,
                async_trait: true,
                params,
                output,
            });
        }
        Err(syn::Error::new_spanned(
            item.sig.fn_token,
            "`#[distributed_lock]` requires an `async fn`",
        ))
    }

    pub(crate) fn sig(&self) -> &syn::Signature {
        &self.item.sig
    }

    /// The fn with `locked` where its body was.
    pub(crate) fn into_item(mut self, locked: TokenStream) -> ItemFn {
        let locked = Block {
            brace_token: self.body.brace_token,
            stmts: vec![Stmt::Expr(Expr::Verbatim(locked), None)],
        };
        if self.async_trait {
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

/// `R` in `Pin<Box<dyn Future<Output = R> + ..>>`.
fn future_output(output: &ReturnType) -> Option<Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let pinned = only_type_argument(ty, "Pin")?;
    let Type::TraitObject(future) = only_type_argument(pinned, "Box")? else {
        return None;
    };
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

/// In `#[async_trait]`'s `{ Box::pin(async move { .. }) }`: the statements that
/// rebind the parameters, and the body, the block the last `let` is set to.
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
    let stmts = &mut future.block.stmts;
    let at = stmts.iter().rposition(|stmt| {
        matches!(stmt, Stmt::Local(Local { init: Some(LocalInit { expr, diverge: None, .. }), .. })
            if matches!(**expr, Expr::Block(_)))
    })?;
    let (rebinding, rest) = stmts.split_at_mut(at);
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
    // `__self` and `__argN` are `#[async_trait]`'s names, not the user's.
    let mut seen = Vec::new();
    names.retain(|name| {
        let fresh = !name.to_string().starts_with("__") && !seen.contains(name);
        seen.push(name.clone());
        fresh
    });
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
