//! Code generation: the user's fn with its body run under the lock.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::{Ident, LitStr};

use crate::attr::{Given, OnLost, Options};
use crate::item::Function;
use crate::span::{ends, respan};
use crate::valid::Returns;

pub(crate) fn expand(options: &Options, function: Function, returns: &Returns) -> TokenStream {
    let local = |name: &str| Ident::new(name, Span::mixed_site());
    let client = local("__lock_client");
    let key = local("__lock_key");
    let lock_options = local("__lock_options");
    let guard = local("__lock_guard");
    let result = local("__lock_result");
    let fake_return = local("__lock_fake_return");
    let value = local("__lock_value");
    let error = local("__lock_error");
    let lock_error_into = local("__lock_error_into");

    let krate = match &options.krate {
        Some(krate) => krate.value.tokens(),
        None => quote!(::lock_runtime),
    };
    let private = quote!(#krate::__private);

    let output_ends = ends(&function.output);
    // Located at the return type, where a build without the `axum` feature reports it.
    let into_response = respan(quote!(#private::axum::into_response), output_ends.0);
    // The one place the return type meets its bound, spanned over the return type so
    // that a type that cannot carry a lock error is reported there, once.
    let conversion = match returns {
        Returns::Carrier(ty) => {
            let (first, last) = ends(ty);
            let open = quote_spanned!(first=> <);
            let rest = respan(
                quote!(as #private::CarriesLockError>::from_lock_error),
                last,
            );
            quote!(#open #ty #rest)
        }
        Returns::IntoResponse => {
            let argument = respan(quote!(::<#private::LockError>), output_ends.1);
            quote!(#into_response #argument)
        }
    };
    let or_return = |fallible: TokenStream| {
        quote! {
            match #fallible {
                ::core::result::Result::Ok(#value) => #value,
                ::core::result::Result::Err(#error) => return #lock_error_into(#error),
            }
        }
    };

    // `#[async_trait]` moved `self` to `__self` before the body.
    let follow_self = |expr: TokenStream| {
        if function.async_trait {
            self_to_async_trait_self(expr)
        } else {
            expr
        }
    };
    let client_value = match &options.client {
        Some(setting) => {
            let code = &setting.value;
            let mut expr = proc_macro2::Group::new(
                proc_macro2::Delimiter::Parenthesis,
                follow_self(code.tokens()),
            );
            expr.set_span(code.last);
            let given = local("__lock_given_client");
            // Typed as a reference so that `LockClient`, `&LockClient` and what derefs
            // to one all coerce, and anything else is a type error at the expression.
            quote_spanned! {code.first=>
                {
                    let #given: &#private::LockClient = &#expr;
                    <#private::LockClient as ::core::clone::Clone>::clone(#given)
                }
            }
        }
        None => or_return(quote!(#private::default_client())),
    };

    // By default the fn's module path and name, so that two fns named alike in two
    // modules never share a lock; the runtime refuses it to a second fn that comes to
    // the same one (see `default_prefix`).
    let prefix = match &options.prefix {
        Some(prefix) => prefix.value.to_token_stream(),
        None => {
            let ident = &function.sig().ident;
            let name = LitStr::new(&ident.unraw().to_string(), ident.span());
            let site = local("__LOCK_SITE");
            or_return(quote! {
                #private::default_prefix(
                    {
                        static #site: #private::Site = #private::Site::new();
                        &#site
                    },
                    ::core::concat!(::core::module_path!(), "::", #name),
                )
            })
        }
    };
    // The cast, spanned over the key, is the one place a value that is not `Display`
    // is reported. It casts a reference to the reference, which is sized, so that a
    // key of an unsized type (`*name` of a `&str`, `name[..3]`) is taken as well.
    let parts = options
        .keys
        .iter()
        .flat_map(|keys| &keys.value)
        .map(|part| {
            let mut expr = proc_macro2::Group::new(
                proc_macro2::Delimiter::Parenthesis,
                follow_self(part.tokens()),
            );
            expr.set_span(part.last);
            let open = quote_spanned!(part.first=> &&);
            let cast = respan(quote!(as &dyn ::core::fmt::Display), part.last);
            quote!(.part(#open #expr #cast))
        });

    let mut setters = TokenStream::new();
    let millis = |millis: &Given<u64>| quote!(::core::time::Duration::from_millis(#millis));
    if let Some(spin) = &options.spin {
        let spin = &spin.value;
        setters.extend(quote!(.spin(#spin)));
    }
    if let Some(retries) = &options.retries {
        let retries = &retries.value;
        setters.extend(quote!(.retries(#retries)));
    }
    if let Some(wait) = &options.wait_ms {
        let wait = millis(&wait.value);
        setters.extend(quote!(.retry_wait(#wait)));
    }
    if let Some(timeout) = &options.timeout_ms {
        let timeout = millis(&timeout.value);
        setters.extend(quote!(.timeout(#timeout)));
    }
    if let Some(lease) = &options.expire_ms {
        let lease = millis(&lease.value);
        setters.extend(quote!(.lease(#lease)));
    }
    if let Some(max_hold) = &options.max_hold_ms {
        let max_hold = millis(&max_hold.value);
        setters.extend(quote!(.max_hold(#max_hold)));
    }
    if let Some(window) = &options.hold_at_least_ms {
        let window = millis(&window.value);
        setters.extend(quote!(.hold_at_least(#window)));
    }
    if let Some(watchdog) = &options.watchdog {
        let watchdog = &watchdog.value;
        setters.extend(quote!(.watchdog(#watchdog)));
    }
    if let Some(reentrant) = &options.reentrant {
        let reentrant = &reentrant.value;
        setters.extend(quote!(.reentrant(#reentrant)));
    }
    if let Some(fencing) = &options.fencing {
        let fencing = &fencing.value;
        setters.extend(quote!(.fencing(#fencing)));
    }
    if let Some(permits) = &options.permits {
        let permits = &permits.value;
        setters.extend(quote!(.permits(#permits)));
    }
    if let Some(shared) = &options.shared {
        let shared = &shared.value;
        setters.extend(quote!(.shared(#shared)));
    }

    let prefix_value = local("__lock_prefix");
    let multi = options.multi.as_ref().is_some_and(|multi| multi.value);
    // With `multi`, each key expression is a lock of its own under the prefix, and
    // all of them are taken together.
    let (key_value, acquire) = if multi {
        let keys = parts.map(|part| quote!(#private::LockKey::new(#prefix_value) #part));
        (
            quote!([#(#keys),*]),
            quote!(#private::LockClient::acquire_all(&#client, #key, &#lock_options).await),
        )
    } else {
        (
            quote!(#private::LockKey::new(#prefix_value) #(#parts)*),
            quote!(#private::LockClient::acquire(&#client, &#key, &#lock_options).await),
        )
    };

    let acquire = or_return(acquire);
    let on_lost = match options.on_lost.as_ref().map(|on_lost| on_lost.value) {
        None | Some(OnLost::Cancel) => quote!(#private::OnLost::Cancel),
        Some(OnLost::Continue) => quote!(#private::OnLost::Continue),
    };

    let stmts = &function.body.stmts;
    let body = match returns {
        // Gives the async block the fn's return type before the body is checked, so
        // that `?` and `return` in the body convert into it (as tracing's
        // `#[instrument]` does).
        Returns::Carrier(ty) => quote! {
            async move {
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
                #(#stmts)*
            }
        },
        Returns::IntoResponse => quote! {
            async move { #into_response(async move { #(#stmts)* }.await) }
        },
    };

    let run = match &options.guard {
        None => quote! {
            #private::run(#guard, #on_lost, #lock_error_into, #body).await
        },
        Some(user_guard) => {
            let user_guard = &user_guard.value;
            quote! {
                let #user_guard = &#guard;
                let #result = #private::hold(&#guard, #on_lost, #lock_error_into, #body).await;
                let _ = #private::LockGuard::release(#guard).await;
                #result
            }
        }
    };

    let locked = quote! {
        let #lock_error_into = #conversion;
        let #client: #private::LockClient = #client_value;
        let #prefix_value: &str = #prefix;
        // The cast that reports a key that is not `Display` (above) is one the
        // compiler would make anyway.
        #[allow(trivial_casts)]
        let #key = #key_value;
        let #lock_options = #private::LockOptions::new() #setters;
        let #guard = #acquire;
        #run
    };
    function.into_item(locked).into_token_stream()
}

/// `self` as `#[async_trait]`'s `__self`, except in paths such as `self::NAME`.
fn self_to_async_trait_self(tokens: TokenStream) -> TokenStream {
    let mut tokens = tokens.into_iter().peekable();
    let mut out = Vec::new();
    while let Some(token) = tokens.next() {
        let token = match token {
            TokenTree::Ident(ident) if ident == "self" => {
                let in_path = matches!(tokens.peek(), Some(TokenTree::Punct(punct)) if punct.as_char() == ':');
                if in_path {
                    TokenTree::Ident(ident)
                } else {
                    TokenTree::Ident(Ident::new("__self", ident.span()))
                }
            }
            TokenTree::Group(group) => {
                let mut inner = proc_macro2::Group::new(
                    group.delimiter(),
                    self_to_async_trait_self(group.stream()),
                );
                inner.set_span(group.span());
                TokenTree::Group(inner)
            }
            other => other,
        };
        out.push(token);
    }
    out.into_iter().collect()
}
