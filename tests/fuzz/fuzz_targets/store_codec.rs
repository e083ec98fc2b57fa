//! Fuzz target `store_codec`: see `src/store_codec.rs` for what it feeds and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jobcenter_fuzz::store_codec::run(data));
