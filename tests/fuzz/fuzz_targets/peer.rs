//! Fuzz target `peer`: see `src/peer.rs` for what it feeds and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jobcenter_fuzz::peer::run(data));
