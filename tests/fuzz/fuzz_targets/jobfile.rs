//! Fuzz target `jobfile`: see `src/jobfile.rs` for what it feeds and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jobcenter_fuzz::jobfile::run(data));
