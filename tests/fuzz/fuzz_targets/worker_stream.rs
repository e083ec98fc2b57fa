//! Fuzz target `worker_stream`: see `src/worker_stream.rs` for what it feeds and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jobcenter_fuzz::worker_stream::run(data));
