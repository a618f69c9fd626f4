//! The stats target: see `checks::stats` (fuzz/checks.rs).

#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::stats(data));
