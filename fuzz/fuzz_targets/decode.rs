//! The decode target: see `checks::decode` (fuzz/checks.rs).

#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::decode(data));
