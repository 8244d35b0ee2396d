//! Compile-time behaviour of `#[distributed_lock]`: what it accepts, and the errors
//! it gives for what it does not.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/*.rs");
    cases.pass("ui/pass/*.rs");
}
