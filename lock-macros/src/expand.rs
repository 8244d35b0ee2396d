//! Code generation: the user's fn with its body run under the lock.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{AttrStyle, GenericArgument, Ident, ItemFn, LitStr, PathArguments, ReturnType, Type};

use crate::attr::{OnLost, Options};

pub(crate) fn expand(options: &Options, function: ItemFn) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let (outer_attrs, inner_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Outer));

    let local = |name: &str| Ident::new(name, Span::mixed_site());
    let client = local("__lock_client");
    let key = local("__lock_key");
    let lock_options = local("__lock_options");
    let guard = local("__lock_guard");
    let result = local("__lock_result");
    let fake_return = local("__lock_fake_return");

    let krate = match &options.krate {
        Some(krate) => krate.value.code.to_token_stream(),
        None => quote!(::lock_runtime),
    };
    let private = quote!(#krate::__private);

    // A lock error reaches the caller through `E: From<LockError>`. The code that
    // converts it is located at `E` in the return type, so that a missing impl is
    // reported there, once.
    let value = local("__lock_value");
    let error = local("__lock_error");
    let error_span = Span::mixed_site().located_at(error_type_span(&sig.output));
    let private_at_error = path_at(&private, error_span);
    // Rustc reports an unmet bound of `From::from` at its argument.
    let error_at_type = Ident::new("__lock_error", error_span);
    let or_return = |fallible: TokenStream| {
        quote_spanned! {error_span=>
            match #fallible {
                ::core::result::Result::Ok(#value) => #value,
                ::core::result::Result::Err(#error) => {
                    return ::core::result::Result::Err(::core::convert::From::from(#error_at_type));
                }
            }
        }
    };

    let client_value = match &options.client {
        Some(setting) => {
            let expr = &setting.value.code;
            let given = local("__lock_given_client");
            // Typed as a reference so that `LockClient`, `&LockClient` and what derefs
            // to one all coerce, and anything else is a type error at the literal.
            quote_spanned! {setting.value.lit.span()=>
                {
                    let #given: &#private::LockClient = &(#expr);
                    <#private::LockClient as ::core::clone::Clone>::clone(#given)
                }
            }
        }
        None => or_return(quote!(#private::default_client())),
    };

    // By default the fn's module path and name, so that two fns named alike in two
    // modules never share a lock.
    let prefix = match &options.prefix {
        Some(prefix) => prefix.value.to_token_stream(),
        None => {
            let name = LitStr::new(&sig.ident.unraw().to_string(), sig.ident.span());
            quote!(::core::concat!(::core::module_path!(), "::", #name))
        }
    };
    // The cast, spanned at the key's literal, is the one place a value that is not
    // `Display` is reported.
    let parts = options
        .keys
        .iter()
        .flat_map(|keys| &keys.value)
        .map(|part| {
            let expr = &part.code;
            quote_spanned!(part.lit.span()=> .part(&(#expr) as &dyn ::core::fmt::Display))
        });

    let mut setters = TokenStream::new();
    let millis = |millis: u64| quote!(::core::time::Duration::from_millis(#millis));
    if let Some(spin) = &options.spin {
        let spin = spin.value;
        setters.extend(quote!(.spin(#spin)));
    }
    if let Some(retries) = &options.retries {
        let retries = retries.value;
        setters.extend(quote!(.retries(#retries)));
    }
    if let Some(wait) = &options.wait_ms {
        let wait = millis(wait.value);
        setters.extend(quote!(.retry_wait(#wait)));
    }
    if let Some(timeout) = &options.timeout_ms {
        let timeout = millis(timeout.value);
        setters.extend(quote!(.timeout(#timeout)));
    }
    if let Some(lease) = &options.expire_ms {
        let lease = millis(lease.value);
        setters.extend(quote!(.lease(#lease)));
    }
    if let Some(max_hold) = &options.max_hold_ms {
        let max_hold = millis(max_hold.value);
        setters.extend(quote!(.max_hold(#max_hold)));
    }
    if let Some(watchdog) = &options.watchdog {
        let watchdog = watchdog.value;
        setters.extend(quote!(.watchdog(#watchdog)));
    }
    if let Some(reentrant) = &options.reentrant {
        let reentrant = reentrant.value;
        setters.extend(quote!(.reentrant(#reentrant)));
    }
    if let Some(fencing) = &options.fencing {
        let fencing = fencing.value;
        setters.extend(quote!(.fencing(#fencing)));
    }

    let acquire =
        or_return(quote!(#private::LockClient::acquire(&#client, &#key, &#lock_options).await));
    let on_lost = match options.on_lost.as_ref().map(|on_lost| on_lost.value) {
        None | Some(OnLost::Cancel) => quote!(#private::OnLost::Cancel),
        Some(OnLost::Continue) => quote!(#private::OnLost::Continue),
    };

    // Gives the async block the fn's return type before the body is checked, so that
    // `?` and `return` in the body convert into it (as tracing's `#[instrument]` does).
    // A `let` cannot name an `impl Trait` type, so such a block goes without.
    let typed_return = match &sig.output {
        ReturnType::Type(_, ty) if !mentions_impl(ty) => quote! {
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_unit_value,
                clippy::needless_return
            )]
            if false {
                let #fake_return: #ty = loop {};
                return #fake_return;
            }
        },
        _ => TokenStream::new(),
    };
    let stmts = &block.stmts;
    let body = quote! {
        async move {
            #typed_return
            #(#stmts)*
        }
    };

    // `run` and `hold` require `E: From<LockError>` too.
    let run = match &options.guard {
        None => quote_spanned! {error_span=>
            #private_at_error::run(#guard, #on_lost, #body).await
        },
        Some(user_guard) => {
            let user_guard = &user_guard.value;
            let hold = quote_spanned! {error_span=>
                #private_at_error::hold(&#guard, #on_lost, #body).await
            };
            quote! {
                let #user_guard = &#guard;
                let #result = #hold;
                let _ = #private::LockGuard::release(#guard).await;
                #result
            }
        }
    };

    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            let #client: #private::LockClient = #client_value;
            let #key = #private::LockKey::new(#prefix) #(#parts)*;
            let #lock_options = #private::LockOptions::new() #setters;
            let #guard = #acquire;
            #run
        }
    }
}

/// `E` in `Result<T, E>`, or the whole return type when it does not name `E`.
fn error_type_span(output: &ReturnType) -> Span {
    let ty = match output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => return Span::call_site(),
    };
    if let Type::Path(path) = &**ty
        && let Some(PathArguments::AngleBracketed(args)) =
            path.path.segments.last().map(|last| &last.arguments)
        && let Some(GenericArgument::Type(error)) = args.args.iter().nth(1)
    {
        return error.span();
    }
    ty.span()
}

/// `path`, every token located at `span`.
fn path_at(path: &TokenStream, span: Span) -> TokenStream {
    path.clone()
        .into_iter()
        .map(|mut token| {
            token.set_span(span);
            token
        })
        .collect()
}

fn mentions_impl(ty: &Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == "impl",
            TokenTree::Group(group) => walk(group.stream()),
            _ => false,
        })
    }
    walk(ty.to_token_stream())
}
