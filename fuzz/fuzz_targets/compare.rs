//! The compare target: see `checks::compare` (fuzz/checks.rs).

#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::compare(data));
